package translate_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/machine"
)

// TestFilesystems: a filesystem-mode claim and a config volume shared as filesystems become the
// directories the launcher pod mounts them at; a block-mode claim, or a claim outside a launcher
// pod, is refused naming the filesystem.
func TestFilesystems(t *testing.T) {
	vmi := func() *v1alpha1.VirtualMachineInstance {
		v := validVMI()
		v.Spec.Volumes = append(v.Spec.Volumes,
			v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "shared"}}},
			v1alpha1.Volume{Name: "token", VolumeSource: v1alpha1.VolumeSource{ServiceAccount: &v1alpha1.ServiceAccountVolumeSource{ServiceAccountName: "default"}}},
			v1alpha1.Volume{Name: "cm", VolumeSource: v1alpha1.VolumeSource{ConfigMap: &v1alpha1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}})
		v.Spec.Domain.Devices.Filesystems = []v1alpha1.Filesystem{{Name: "data", Virtiofs: &v1alpha1.FilesystemVirtiofs{}}, {Name: "token", Virtiofs: &v1alpha1.FilesystemVirtiofs{}}}
		v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "cm", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
		return v
	}
	pod := func(block bool) *translate.PodVolumes {
		return &translate.PodVolumes{Claims: map[string]translate.Claim{"shared": {CapacityBytes: 1 << 30, Block: block}}}
	}
	m, err := translate.Machine(vmi(), translate.Host{Emulation: true, NICs: hostNICs, Pod: pod(false)})
	if err != nil {
		t.Fatal(err)
	}
	want := []machine.Filesystem{
		{Name: "data", Kind: "persistentVolumeClaim", Dir: "/var/run/qvirt/claims/data"},
		{Name: "token", Kind: "serviceAccount", Dir: "/var/run/qvirt/config-volumes/token"},
	}
	if len(m.Filesystems) != len(want) || m.Filesystems[0] != want[0] || m.Filesystems[1] != want[1] {
		t.Errorf("filesystems %+v, want %+v", m.Filesystems, want)
	}
	for _, d := range m.Disks {
		if d.Name == "data" || d.Name == "token" {
			t.Errorf("a shared volume became disk %+v", d)
		}
	}

	for name, tc := range map[string]struct {
		pod  *translate.PodVolumes
		want string
	}{
		"a block-mode claim": {pod(true), "spec.domain.devices.filesystems[0].name: Invalid value: \"data\": claim shared has volumeMode Block"},
		"no launcher pod":    {nil, "spec.domain.devices.filesystems[0]: Forbidden: a claim is shared only in a launcher pod"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := translate.Machine(vmi(), translate.Host{Emulation: true, NICs: hostNICs, Pod: tc.pod})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
