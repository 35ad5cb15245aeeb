package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// A disk whose only copy of written data is a file on the source node (an emptyDisk, the writable
// overlay of a containerDisk or an ephemeral claim) is a local disk: the instance stays
// live-migratable, and the migration copies the disk (block migration). Read-only disks, claims
// and cloud-init disks are not copied: the target reaches the same data.
func TestLocalDisksAreMigratable(t *testing.T) {
	emptyDisk := VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("8Mi")}}
	containerDisk := VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "registry.example/disk:v1"}}
	ephemeral := VolumeSource{Ephemeral: &EphemeralVolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}}
	claim := VolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "data"}}
	cloudInit := VolumeSource{CloudInitNoCloud: &CloudInitNoCloudSource{UserData: "#cloud-config"}}
	for _, tc := range []struct {
		name   string
		disk   Disk
		source VolumeSource
		local  bool
	}{
		{"emptyDisk", Disk{}, emptyDisk, true},
		{"writable containerDisk", Disk{Disk: &DiskTarget{}}, containerDisk, true},
		{"containerDisk without a disk target", Disk{}, containerDisk, true},
		{"writable ephemeral claim", Disk{}, ephemeral, true},
		{"read-only emptyDisk", Disk{Disk: &DiskTarget{ReadOnly: true}}, emptyDisk, false},
		{"read-only containerDisk", Disk{Disk: &DiskTarget{ReadOnly: true}}, containerDisk, false},
		{"containerDisk as a cdrom", Disk{CDRom: &CDRomTarget{}}, containerDisk, false},
		{"read-only ephemeral claim", Disk{Disk: &DiskTarget{ReadOnly: true}}, ephemeral, false},
		{"persistent claim", Disk{}, claim, false},
		{"cloud-init", Disk{CDRom: &CDRomTarget{ReadOnly: ptr.To(true)}}, cloudInit, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var spec VirtualMachineInstanceSpec
			tc.disk.Name = "scratch"
			spec.Domain.Devices.Disks = []Disk{tc.disk}
			spec.Volumes = []Volume{{Name: "scratch", VolumeSource: tc.source}}
			if ok, reason, msg := LiveMigratable(&spec); !ok {
				t.Errorf("not migratable (%s: %s)", reason, msg)
			}
			if got := LocalDisks(&spec); (len(got) == 1 && got[0] == "scratch") != tc.local || len(got) > 1 {
				t.Errorf("LocalDisks = %q, want scratch local: %v", got, tc.local)
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

// A bridge-bound interface makes an instance not live-migratable, on the pod network and on a
// multus network alike: the guest has the pod interface's MAC and address, which the target pod's
// interface would not have. Masquerade on the pod network migrates.
func TestLiveMigratableInterfaces(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      Interface
		net     Network
		ok      bool
		message string
	}{
		{"masquerade on the pod network", Interface{Name: "n", Masquerade: &InterfaceMasquerade{}}, Network{Name: "n", Pod: &PodNetwork{}}, true, ""},
		{"bridge on the pod network", Interface{Name: "n", Bridge: &InterfaceBridge{}}, Network{Name: "n", Pod: &PodNetwork{}}, false, "on the pod network"},
		{"bridge on a secondary network", Interface{Name: "n", Bridge: &InterfaceBridge{}}, Network{Name: "n", Multus: &MultusNetwork{NetworkName: "lab"}}, false, "on its multus network"},
		{"passt on the pod network", Interface{Name: "n", Binding: &PluginBinding{Name: PasstBinding}}, Network{Name: "n", Pod: &PodNetwork{}}, false, "passt binding"},
		{"slirp on the pod network", Interface{Name: "n", Binding: &PluginBinding{Name: SlirpBinding}}, Network{Name: "n", Pod: &PodNetwork{}}, false, "slirp binding"},
		{"bridge on a default multus network", Interface{Name: "n", Bridge: &InterfaceBridge{}}, Network{Name: "n", Multus: &MultusNetwork{NetworkName: "lab", Default: true}}, false, "on the pod network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := VirtualMachineInstanceSpec{Networks: []Network{tc.net}}
			spec.Domain.Devices.Interfaces = []Interface{tc.in}
			ok, reason, msg := LiveMigratable(&spec)
			if ok != tc.ok || !ok && (reason != InterfaceNotLiveMigratableReason || !strings.Contains(msg, tc.message)) {
				t.Errorf("LiveMigratable = %v, %s, %q; want %v and a message naming %q", ok, reason, msg, tc.ok, tc.message)
			}
		})
	}
}
