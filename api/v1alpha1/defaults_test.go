package v1alpha1

import (
	"testing"

	"k8s.io/utils/ptr"
)

func TestSetDefaultsFillsKubeVirtDefaults(t *testing.T) {
	spec := VirtualMachineInstanceSpec{Domain: DomainSpec{Devices: Devices{
		Disks:      []Disk{{Name: "root"}, {Name: "iso", CDRom: &CDRomTarget{}}, {Name: "data", Disk: &DiskTarget{}}},
		Interfaces: []Interface{{Name: "default"}},
	}}}
	SetDefaults(&spec)
	d := spec.Domain
	checks := []struct {
		field, got, want string
	}{
		{"domain.machine.type", d.Machine.Type, "q35"},
		{"disks[root].disk.bus", string(d.Devices.Disks[0].Disk.Bus), "virtio"},
		{"disks[iso].cdrom.bus", string(d.Devices.Disks[1].CDRom.Bus), "sata"},
		{"disks[data].disk.bus", string(d.Devices.Disks[2].Disk.Bus), "virtio"},
		{"interfaces[default].model", d.Devices.Interfaces[0].Model, "virtio"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.field, c.got, c.want)
		}
	}
	if got := *spec.TerminationGracePeriodSeconds; got != 180 {
		t.Errorf("terminationGracePeriodSeconds = %d, want 180", got)
	}
	if ro := d.Devices.Disks[1].CDRom.ReadOnly; ro == nil || !*ro {
		t.Errorf("cdrom readonly = %v, want true", ro)
	}
	if !*d.Devices.AutoattachSerialConsole || !*d.Devices.AutoattachGraphicsDevice {
		t.Error("serial console and graphics are not attached by default")
	}
}

func TestSetDefaultsKeepsWhatIsSet(t *testing.T) {
	spec := VirtualMachineInstanceSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Domain: DomainSpec{
			Machine: &Machine{Type: "pc-q35-8.2"},
			Devices: Devices{
				AutoattachGraphicsDevice: ptr.To(false),
				Disks:                    []Disk{{Name: "iso", CDRom: &CDRomTarget{Bus: DiskBusSCSI}}},
				Interfaces:               []Interface{{Name: "default", Model: "e1000"}},
			},
		},
	}
	SetDefaults(&spec)
	if *spec.TerminationGracePeriodSeconds != 0 || spec.Domain.Machine.Type != "pc-q35-8.2" ||
		*spec.Domain.Devices.AutoattachGraphicsDevice || spec.Domain.Devices.Disks[0].CDRom.Bus != DiskBusSCSI ||
		spec.Domain.Devices.Interfaces[0].Model != "e1000" {
		t.Fatalf("a set field was overwritten: %+v", spec)
	}
}

func TestSetDefaultsSecureBootWithEFI(t *testing.T) {
	spec := VirtualMachineInstanceSpec{Domain: DomainSpec{Firmware: &Firmware{Bootloader: &Bootloader{EFI: &EFI{}}}}}
	SetDefaults(&spec)
	if sb := spec.Domain.Firmware.Bootloader.EFI.SecureBoot; sb == nil || !*sb {
		t.Errorf("efi.secureBoot = %v, want true as in KubeVirt", sb)
	}
	off := VirtualMachineInstanceSpec{Domain: DomainSpec{Firmware: &Firmware{Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(false)}}}}}
	SetDefaults(&off)
	if *off.Domain.Firmware.Bootloader.EFI.SecureBoot {
		t.Error("secureBoot: false was overwritten")
	}
	bios := VirtualMachineInstanceSpec{}
	SetDefaults(&bios)
	if bios.Domain.Firmware != nil {
		t.Errorf("a spec without firmware got one: %+v", bios.Domain.Firmware)
	}
}
