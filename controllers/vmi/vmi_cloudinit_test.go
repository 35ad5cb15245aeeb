package vmi

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// withCloudInit gives v a cloudInitNoCloud cdrom whose user data comes from Secret user and network
// data from Secret network ("" for inline data instead).
func withCloudInit(v *v1alpha1.VirtualMachineInstance, user, network string) {
	src := &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config", NetworkData: "version: 2"}
	if user != "" {
		src.UserData, src.UserDataSecretRef = "", &corev1.LocalObjectReference{Name: user}
	}
	if network != "" {
		src.NetworkData, src.NetworkDataSecretRef = "", &corev1.LocalObjectReference{Name: network}
	}
	v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "cidata", CDRom: &v1alpha1.CDRomTarget{}})
	v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "cidata", VolumeSource: v1alpha1.VolumeSource{CloudInitNoCloud: src}})
}

// cloudInitMounts are the compute container's mounts of Secret volumes: mount path -> "secret
// name, read-only".
func cloudInitMounts(pod *corev1.Pod) map[string]string {
	vols := map[string]*corev1.SecretVolumeSource{}
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			vols[v.Name] = v.Secret
		}
	}
	out := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if s := vols[m.Name]; s != nil {
			out[m.MountPath] = fmt.Sprintf("%s, read-only %v", s.SecretName, m.ReadOnly)
		}
	}
	return out
}

// TestRenderLauncherPodCloudInitSecrets: each Secret a cloud-init volume reads is a read-only
// Secret volume of the launcher pod, where the launcher looks for it; inline data adds none.
func TestRenderLauncherPodCloudInitSecrets(t *testing.T) {
	v := baseVMI()
	withCloudInit(v, "user-secret", "net-secret")
	pod, err := RenderLauncherPod(v, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/var/run/qvirt/cloud-init-secrets/cidata/userdata":    "user-secret, read-only true",
		"/var/run/qvirt/cloud-init-secrets/cidata/networkdata": "net-secret, read-only true",
	}
	if got := cloudInitMounts(pod); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Secret mounts %v, want %v", got, want)
	}
	if podlayout.CloudInitSecretMount("cidata", podlayout.CloudInitUserData) != "/var/run/qvirt/cloud-init-secrets/cidata/userdata" {
		t.Error("the launcher looks elsewhere than the pod mounts")
	}

	inline := baseVMI()
	withCloudInit(inline, "", "")
	pod, err = RenderLauncherPod(inline, config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cloudInitMounts(pod); len(got) != 0 {
		t.Errorf("inline cloud-init data mounts Secrets: %v", got)
	}
}

// TestMissingCloudInitSecret (real API server): the launcher pod gets the Secret volumes; while a
// Secret is missing the instance says which volume field waits for which Secret
// (Synchronized=False, SecretNotFound) and the condition goes once the Secret exists.
func TestMissingCloudInitSecret(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()
	network := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "net", Namespace: ns}, StringData: map[string]string{"networkdata": "version: 2"}}
	if err := cp.Client.Create(ctx, network); err != nil {
		t.Fatal(err)
	}
	v := newVMI(ns, "ci")
	withCloudInit(v, "user", "net")
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}

	pod := waitPod(t, v)
	want := map[string]string{
		podlayout.CloudInitSecretMount("cidata", podlayout.CloudInitUserData):    "user, read-only true",
		podlayout.CloudInitSecretMount("cidata", podlayout.CloudInitNetworkData): "net, read-only true",
	}
	if got := cloudInitMounts(&pod); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("launcher pod Secret mounts %v, want %v", got, want)
	}

	const msg = `spec.volumes[0].cloudInitNoCloud.secretRef: Secret "user" not found`
	eventually(t, "Synchronized=False SecretNotFound naming the volume field and the Secret", func() (bool, string) {
		got := getVMI(t, v)
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		if c == nil {
			return false, fmt.Sprintf("phase %s, no Synchronized condition", got.Status.Phase)
		}
		ok := c.Status == metav1.ConditionFalse && c.Reason == ReasonSecretNotFound && strings.Contains(c.Message, msg) && !strings.Contains(c.Message, `"net"`)
		return ok, fmt.Sprintf("%+v", c)
	})

	user := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "user", Namespace: ns}, StringData: map[string]string{"userdata": "#cloud-config"}}
	if err := cp.Client.Create(ctx, user); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the condition gone once the Secret exists", func() (bool, string) {
		got := getVMI(t, v)
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		return c == nil, fmt.Sprintf("%+v", c)
	})
	runPod(t, &pod, "node-1")
	waitPhase(t, v, v1alpha1.Scheduled)
}
