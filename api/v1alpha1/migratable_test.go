package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// A disk whose only copy of written data is a file on the source node (an emptyDisk, the writable
// overlay of a containerDisk or an ephemeral claim) would come back blank or stale on the target:
// until qvirt migrates block devices, such an instance is not live-migratable, and the message
// names the volume so that a user knows which one to change.
func TestLiveMigratableLocalWritableDisks(t *testing.T) {
	emptyDisk := VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("8Mi")}}
	containerDisk := VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "registry.example/disk:v1"}}
	ephemeral := VolumeSource{Ephemeral: &EphemeralVolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}}
	claim := VolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "data"}}
	cloudInit := VolumeSource{CloudInitNoCloud: &CloudInitNoCloudSource{UserData: "#cloud-config"}}
	for _, tc := range []struct {
		name    string
		disk    Disk
		source  VolumeSource
		migrate bool
	}{
		{"emptyDisk", Disk{}, emptyDisk, false},
		{"writable containerDisk", Disk{Disk: &DiskTarget{}}, containerDisk, false},
		{"containerDisk without a disk target", Disk{}, containerDisk, false},
		{"writable ephemeral claim", Disk{}, ephemeral, false},
		{"read-only containerDisk", Disk{Disk: &DiskTarget{ReadOnly: true}}, containerDisk, true},
		{"containerDisk as a cdrom", Disk{CDRom: &CDRomTarget{}}, containerDisk, true},
		{"read-only ephemeral claim", Disk{Disk: &DiskTarget{ReadOnly: true}}, ephemeral, true},
		{"persistent claim", Disk{}, claim, true},
		{"cloud-init", Disk{CDRom: &CDRomTarget{ReadOnly: ptr.To(true)}}, cloudInit, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec VirtualMachineInstanceSpec
			tc.disk.Name = "scratch"
			spec.Domain.Devices.Disks = []Disk{tc.disk}
			spec.Volumes = []Volume{{Name: "scratch", VolumeSource: tc.source}}
			ok, reason, msg := LiveMigratable(&spec)
			if ok != tc.migrate {
				t.Fatalf("migratable=%v (%s: %s), want %v", ok, reason, msg, tc.migrate)
			}
			if !ok && (reason != DisksNotLiveMigratableReason || !strings.Contains(msg, `"scratch"`)) {
				t.Errorf("reason %s, message %q: want %s naming volume \"scratch\"", reason, msg, DisksNotLiveMigratableReason)
			}
		})
	}
}

// An EFI instance is live-migratable, with or without Secure Boot: QEMU carries the variable
// store's content in the migration stream like RAM and the target writes it to its own copy
// (launcher's TestEFIGuest shows the guest's variable on the target). Only variables kept across
// restarts (persistent, refused for now) would need storage both nodes reach.
func TestLiveMigratableEFI(t *testing.T) {
	for _, secureBoot := range []bool{false, true} {
		var spec VirtualMachineInstanceSpec
		spec.Domain.Firmware = &Firmware{Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(secureBoot)}}}
		spec.Domain.Features = &Features{SMM: &FeatureState{}}
		if ok, reason, msg := LiveMigratable(&spec); !ok {
			t.Errorf("secureBoot %v: not migratable (%s: %s)", secureBoot, reason, msg)
		}
	}
}
