package vmi

import (
	"encoding/json"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// TestRenderLauncherPodMultusNetworks: an instance's secondary multus networks are asked of Multus
// in the pod's networks annotation (the instance's namespace when the network names none), each
// as the pod interface the node agent's bridge binding looks for; a default multus network is
// the default-network annotation, its name as written; an instance without multus networks gets
// neither.
func TestRenderLauncherPodMultusNetworks(t *testing.T) {
	v := baseVMI()
	s := &v.Spec
	s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces,
		v1alpha1.Interface{Name: "lab", Bridge: &v1alpha1.InterfaceBridge{}, MacAddress: "02:00:00:00:00:0a"}, v1alpha1.Interface{Name: "storage", Bridge: &v1alpha1.InterfaceBridge{}})
	s.Networks = append(s.Networks, v1alpha1.Network{Name: "lab", Multus: &v1alpha1.MultusNetwork{NetworkName: "lab-net"}},
		v1alpha1.Network{Name: "storage", Multus: &v1alpha1.MultusNetwork{NetworkName: "infra/storage"}})
	pod, err := RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []multusSelection
	if err := json.Unmarshal([]byte(pod.Annotations[MultusNetworksAnnotation]), &got); err != nil {
		t.Fatalf("annotation %s = %q: %v", MultusNetworksAnnotation, pod.Annotations[MultusNetworksAnnotation], err)
	}
	want := []multusSelection{{Name: "lab-net", Namespace: v.Namespace, Interface: v1alpha1.MultusInterfaceName("lab"), MAC: "02:00:00:00:00:0a"},
		{Name: "storage", Namespace: "infra", Interface: v1alpha1.MultusInterfaceName("storage")}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("networks %+v, want %+v", got, want)
	}
	if _, ok := pod.Annotations[MultusDefaultNetworkAnnotation]; ok {
		t.Errorf("default-network annotation on a pod that keeps the pod network: %v", pod.Annotations)
	}

	v = baseVMI()
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}
	v.Spec.Networks = []v1alpha1.Network{{Name: "default", Multus: &v1alpha1.MultusNetwork{NetworkName: "flat", Default: true}}}
	if pod, err = RenderLauncherPod(v, config.Default(), nil); err != nil {
		t.Fatal(err)
	}
	if got := pod.Annotations[MultusDefaultNetworkAnnotation]; got != "flat" || pod.Annotations[MultusNetworksAnnotation] != "" {
		t.Errorf("annotations %v, want only %s=flat, as written (Multus resolves it in its own namespace, as under KubeVirt)", pod.Annotations, MultusDefaultNetworkAnnotation)
	}
	if pod, err = RenderLauncherPod(baseVMI(), config.Default(), nil); err != nil {
		t.Fatal(err)
	}
	if len(pod.Annotations) != 0 {
		t.Errorf("an instance on the pod network alone: annotations %v", pod.Annotations)
	}
}

// A passt interface: the launcher's container runs without the default seccomp filter (passt
// sandboxes itself in a user namespace) and the pod sets the sysctls KubeVirt's passt binding sets,
// beside the fsGroup its claims need; an instance without passt keeps the runtime's filter and sets
// no sysctl.
func TestRenderLauncherPodPasst(t *testing.T) {
	v := withVolumes(baseVMI(), claimVolume("data", "data-claim"))
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Binding: &v1alpha1.PluginBinding{Name: v1alpha1.PasstBinding}}}
	claims := Claims{"data-claim": &corev1.PersistentVolumeClaim{}}
	pod, err := RenderLauncherPod(v, config.Default(), claims)
	if err != nil {
		t.Fatal(err)
	}
	if sp := pod.Spec.Containers[0].SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeUnconfined {
		t.Errorf("seccomp %+v, want Unconfined", sp)
	}
	sc := pod.Spec.SecurityContext
	want := []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}, {Name: "net.ipv4.ping_group_range", Value: "107 107"}}
	if sc == nil || !slices.Equal(sc.Sysctls, want) || sc.FSGroup == nil || *sc.FSGroup != podlayout.LauncherUID {
		t.Errorf("pod securityContext %+v, want sysctls %v and the launcher's fsGroup", sc, want)
	}

	if pod, err = RenderLauncherPod(baseVMI(), config.Default(), nil); err != nil {
		t.Fatal(err)
	}
	if sp := pod.Spec.Containers[0].SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("without passt: seccomp %+v, want RuntimeDefault", sp)
	}
	if sc := pod.Spec.SecurityContext; sc != nil && len(sc.Sysctls) > 0 {
		t.Errorf("without passt: sysctls %v", sc.Sysctls)
	}

	// slirp: QEMU binds the ports and opens the ping sockets, so the same sysctls; QEMU needs no
	// user namespace, so the seccomp filter stays.
	v = baseVMI()
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Binding: &v1alpha1.PluginBinding{Name: v1alpha1.SlirpBinding}}}
	if pod, err = RenderLauncherPod(v, config.Default(), nil); err != nil {
		t.Fatal(err)
	}
	if sp := pod.Spec.Containers[0].SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("slirp: seccomp %+v, want RuntimeDefault", sp)
	}
	if sc := pod.Spec.SecurityContext; sc == nil || !slices.Equal(sc.Sysctls, want) {
		t.Errorf("slirp: pod securityContext %+v, want sysctls %v", sc, want)
	}
}
