package translate

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

func TestSpecField(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{Devices: v1alpha1.Devices{
		Disks:      []v1alpha1.Disk{{Name: "root"}, {Name: "data"}, {Name: "cidata"}},
		Interfaces: []v1alpha1.Interface{{Name: "default"}},
		Inputs:     []v1alpha1.Input{{Name: "tablet"}},
	}}, Volumes: []v1alpha1.Volume{{Name: "cidata", VolumeSource: v1alpha1.VolumeSource{CloudInitConfigDrive: &v1alpha1.CloudInitConfigDriveSource{
		UserDataSecretRef: &corev1.LocalObjectReference{Name: "ud"}, NetworkData: "version: 2"}}}}}}
	for field, want := range map[string]string{
		"machine.kernel.image.ref":                      "spec.domain.firmware.kernelBoot.container.image",
		"machine.kernel.initrdPath":                     "spec.domain.firmware.kernelBoot.container.initrdPath",
		"machine.kernel":                                "spec.domain.firmware.kernelBoot",
		"machine.disks[1].source.container.path":        "spec.volumes[data]",
		"machine.disks[2].source.cloudInit.userData":    "spec.volumes[cidata].cloudInitConfigDrive.secretRef",
		"machine.disks[2].source.cloudInit.networkData": "spec.volumes[cidata]",
		"machine.disks[0].bus":                          "spec.domain.devices.disks[0]",
		"machine.nics[0].mac":                           "spec.domain.devices.interfaces[0]",
		"machine.disks[7].bus":                          "",
		"machine.cpu.model":                             "spec.domain.cpu",
		"machine.cpu.dedicatedCPUs":                     "spec.domain.cpu.dedicatedCpuPlacement",
		"machine.cpu.realtimeVCPUs[0]":                  "spec.domain.cpu.realtime",
		"machine.cpu.numaPassthrough":                   "spec.domain.cpu.numa.guestMappingPassthrough",
		"machine.hugePageKiB":                           "spec.domain.memory.hugepages.pageSize",
		"machine.kernelish":                             "",
		"name":                                          "",
		"machine.disks[99999999999999999999].name":      "",
		"machine.firmware.efi":                          "spec.domain.firmware.bootloader.efi",
		"machine.firmware.efi.secureBoot":               "spec.domain.firmware.bootloader.efi.secureBoot",
		"machine.firmware.serialBIOS":                   "spec.domain.firmware.bootloader.bios.useSerial",
		"machine.smm":                                   "spec.domain.features.smm",
		"machine.inputs[0].bus":                         "spec.domain.devices.inputs[0]",
		"machine.inputs[1].bus":                         "",
		"machine.watchdog.action":                       "spec.domain.devices.watchdog.i6300esb.action",
		"machine.watchdog.name":                         "spec.domain.devices.watchdog",
		"machine.panic[1]":                              "spec.domain.devices.panicDevices",
		"machine.cpu.hyperV.crash":                      "spec.domain.devices.panicDevices",
		"machine.rng":                                   "spec.domain.devices.rng",
		"machine.cpu.pvEOI":                             "spec.domain.features.apic.endOfInterrupt",
	} {
		if got := SpecField(v, field); got != want {
			t.Errorf("SpecField(%q) = %q, want %q", field, got, want)
		}
	}
}
