package translate

import (
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

func TestSpecField(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{Devices: v1alpha1.Devices{
		Disks:      []v1alpha1.Disk{{Name: "root"}, {Name: "data"}},
		Interfaces: []v1alpha1.Interface{{Name: "default"}},
	}}}}
	for field, want := range map[string]string{
		"machine.kernel.image.ref":                 "spec.domain.firmware.kernelBoot.container.image",
		"machine.kernel.initrdPath":                "spec.domain.firmware.kernelBoot.container.initrdPath",
		"machine.kernel":                           "spec.domain.firmware.kernelBoot",
		"machine.disks[1].source.container.path":   "spec.volumes[data]",
		"machine.disks[0].bus":                     "spec.domain.devices.disks[0]",
		"machine.nics[0].mac":                      "spec.domain.devices.interfaces[0]",
		"machine.disks[7].bus":                     "",
		"machine.cpu.model":                        "spec.domain.cpu",
		"machine.firmware.efi":                     "spec.domain.firmware.bootloader.efi",
		"machine.firmware.efi.secureBoot":          "spec.domain.firmware.bootloader.efi.secureBoot",
		"machine.firmware.serialBIOS":              "spec.domain.firmware.bootloader.bios.useSerial",
		"machine.smm":                              "spec.domain.features.smm",
		"machine.kernelish":                        "",
		"name":                                     "",
		"machine.disks[99999999999999999999].name": "",
	} {
		if got := SpecField(v, field); got != want {
			t.Errorf("SpecField(%q) = %q, want %q", field, got, want)
		}
	}
}
