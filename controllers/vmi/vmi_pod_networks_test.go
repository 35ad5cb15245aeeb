package vmi

import (
	"encoding/json"
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
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
