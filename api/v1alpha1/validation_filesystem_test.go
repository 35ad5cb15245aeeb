package v1alpha1

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// withFilesystems shares a claim (volumes[2]) and a ConfigMap (volumes[3]) with the guest, with no
// disk, as KubeVirt's manifests write them.
func withFilesystems(s *VirtualMachineInstanceSpec) {
	s.Volumes = append(s.Volumes,
		Volume{Name: "data", VolumeSource: VolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "shared"}}},
		Volume{Name: "settings", VolumeSource: VolumeSource{ConfigMap: &ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}})
	s.Domain.Devices.Filesystems = []Filesystem{{Name: "data", Virtiofs: &FilesystemVirtiofs{}}, {Name: "settings", Virtiofs: &FilesystemVirtiofs{}}}
}

// TestValidateFilesystems: filesystems sharing a claim and a ConfigMap are valid, realised, get no
// disk from the defaults and make the instance not live-migratable with KubeVirt's reason; each
// misuse is refused at its field.
func TestValidateFilesystems(t *testing.T) {
	check := func(vm *VirtualMachine) field.ErrorList {
		return append(ValidateVirtualMachine(vm), NotRealised(&vm.Spec.Template.Spec, field.NewPath("spec", "template", "spec"))...)
	}
	vm := validVM()
	withFilesystems(&vm.Spec.Template.Spec)
	if errs := check(vm); len(errs) != 0 {
		t.Fatalf("filesystems must be valid, got %v", errs)
	}
	s := &vm.Spec.Template.Spec
	SetDefaults(s)
	for _, d := range s.Domain.Devices.Disks {
		if d.Name == "data" || d.Name == "settings" {
			t.Errorf("defaulting gave shared volume %q a disk", d.Name)
		}
	}
	if ok, reason, msg := LiveMigratable(s); ok || reason != VirtIOFSReason || !strings.Contains(msg, `"data"`) {
		t.Errorf("LiveMigratable = %v %q %q, want false %q naming the filesystem", ok, reason, msg, VirtIOFSReason)
	}

	fp := "spec.template.spec.domain.devices.filesystems"
	cases := []struct {
		name   string
		mutate func(s *VirtualMachineInstanceSpec)
		path   string
		detail string
	}{
		{"no volume of that name", func(s *VirtualMachineInstanceSpec) { s.Domain.Devices.Filesystems[0].Name = "missing" }, fp + "[0].name", "Not found"},
		{"a containerDisk volume", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks = s.Domain.Devices.Disks[1:]
			s.Domain.Devices.Filesystems[0].Name = "root"
		}, fp + "[0].name", "persistentVolumeClaim"},
		{"a volume that is a disk too", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: "data"})
		}, fp + "[0].name", "either a disk or a filesystem"},
		{"without virtiofs", func(s *VirtualMachineInstanceSpec) { s.Domain.Devices.Filesystems[1].Virtiofs = nil }, fp + "[1].virtiofs", "virtiofs"},
		{"twice", func(s *VirtualMachineInstanceSpec) { s.Domain.Devices.Filesystems[1].Name = "data" }, fp + "[1].name", "Duplicate"},
		{"a tag longer than virtio-fs's", func(s *VirtualMachineInstanceSpec) {
			long := strings.Repeat("d", 37)
			s.Volumes[2].Name, s.Domain.Devices.Filesystems[0].Name = long, long
		}, fp + "[0].name", "36"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vm := validVM()
			withFilesystems(&vm.Spec.Template.Spec)
			tc.mutate(&vm.Spec.Template.Spec)
			// Renaming a filesystem leaves its volume unattached too, which is refused as well.
			errs := check(vm)
			found := false
			for _, e := range errs {
				found = found || e.Field == tc.path && strings.Contains(e.Error(), tc.detail)
			}
			if !found {
				t.Fatalf("want an error at %s saying %q, got %v", tc.path, tc.detail, errs)
			}
		})
	}
}
