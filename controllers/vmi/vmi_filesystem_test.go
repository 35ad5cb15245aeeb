package vmi

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// TestRenderLauncherPodFilesystems: a claim and a ConfigMap shared as filesystems are mounted where
// the launcher's virtiofsd serves them from, the claim writable, the ConfigMap read-only; the
// compute container, still non-root without capabilities, runs without the runtime's seccomp
// profile, which refuses the user namespace virtiofsd runs in. Without filesystems it keeps it.
func TestRenderLauncherPodFilesystems(t *testing.T) {
	v := baseVMI()
	v.Spec.Volumes = []v1alpha1.Volume{
		{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "shared"}}},
		{Name: "settings", VolumeSource: v1alpha1.VolumeSource{ConfigMap: &v1alpha1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}},
	}
	v.Spec.Domain.Devices.Filesystems = []v1alpha1.Filesystem{
		{Name: "data", Virtiofs: &v1alpha1.FilesystemVirtiofs{}}, {Name: "settings", Virtiofs: &v1alpha1.FilesystemVirtiofs{}},
	}
	claims := Claims{"shared": &corev1.PersistentVolumeClaim{}}
	pod, err := RenderLauncherPod(v, config.Default(), claims)
	if err != nil {
		t.Fatal(err)
	}
	c := pod.Spec.Containers[0]
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.ReadOnly
	}
	for path, ro := range map[string]bool{podlayout.ClaimMount("data"): false, podlayout.ConfigVolumeMount("settings"): true} {
		if got, ok := mounts[path]; !ok || got != ro {
			t.Errorf("mount %s: present %v read-only %v, want present read-only %v (mounts %v)", path, ok, got, ro, mounts)
		}
	}
	if sp := c.SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeUnconfined {
		t.Errorf("seccomp profile %+v, want Unconfined for virtiofsd's user namespace", sp)
	}
	if sc := c.SecurityContext; sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("security context %+v, want non-root, no privilege escalation, all capabilities dropped", sc)
	}

	pod, err = RenderLauncherPod(baseVMI(), config.Default(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if sp := pod.Spec.Containers[0].SecurityContext.SeccompProfile; sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("without filesystems: seccomp profile %+v, want RuntimeDefault", sp)
	}
}
