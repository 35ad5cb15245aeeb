package translate

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// machineIndexed matches a machine path into the disk, NIC or input lists: machine.disks[2].bus.
var machineIndexed = regexp.MustCompile(`^machine\.(disks|nics|inputs)\[(\d+)\](.*)$`)

// machineFields maps the machine paths that come from one spec field to that field.
var machineFields = []struct{ machine, spec string }{
	{"machine.kernel.image", "spec.domain.firmware.kernelBoot.container.image"},
	{"machine.kernel.kernelPath", "spec.domain.firmware.kernelBoot.container.kernelPath"},
	{"machine.kernel.initrdPath", "spec.domain.firmware.kernelBoot.container.initrdPath"},
	{"machine.kernel.args", "spec.domain.firmware.kernelBoot.kernelArgs"},
	{"machine.kernel", "spec.domain.firmware.kernelBoot"},
	{"machine.cpu.pvEOI", "spec.domain.features.apic.endOfInterrupt"},
	{"machine.cpu.hyperV.spinlocks", "spec.domain.features.hyperv.spinlocks.spinlocks"},
	{"machine.cpu.hyperV.vendorID", "spec.domain.features.hyperv.vendorid.vendorid"},
	{"machine.cpu.hyperV.crash", "spec.domain.devices.panicDevices"},
	{"machine.cpu.hyperV", "spec.domain.features.hyperv"},
	{"machine.cpu.kvmHidden", "spec.domain.features.kvm.hidden"},
	{"machine.cpu.pvUnhalt", "spec.domain.features.pvspinlock"},
	{"machine.cpu.kvmClock", "spec.domain.clock.timer.kvm"},
	{"machine.clock.pitLostTicks", "spec.domain.clock.timer.pit.tickPolicy"},
	{"machine.clock.rtcClock", "spec.domain.clock.timer.rtc.track"},
	{"machine.clock", "spec.domain.clock"},
	{"machine.rtcStart", "spec.domain.clock"},
	{"machine.cpu.dedicatedCPUs", "spec.domain.cpu.dedicatedCpuPlacement"},
	{"machine.cpu.realtimeVCPUs", "spec.domain.cpu.realtime"},
	{"machine.cpu.numaPassthrough", "spec.domain.cpu.numa.guestMappingPassthrough"},
	{"machine.cpu.isolateEmulatorThread", "spec.domain.cpu.isolateEmulatorThread"},
	{"machine.cpu", "spec.domain.cpu"},
	{"machine.memoryMiB", "spec.domain.memory.guest"},
	{"machine.maxMemoryMiB", "spec.domain.memory.maxGuest"},
	{"machine.pluggedMemoryMiB", "spec.domain.memory.guest"},
	{"machine.hugePageKiB", "spec.domain.memory.hugepages.pageSize"},
	{"machine.firmware.efi.secureBoot", "spec.domain.firmware.bootloader.efi.secureBoot"},
	{"machine.firmware.efi", "spec.domain.firmware.bootloader.efi"},
	{"machine.firmware.serialBIOS", "spec.domain.firmware.bootloader.bios.useSerial"},
	{"machine.smm", "spec.domain.features.smm"},
	{"machine.uuid", "spec.domain.firmware.uuid"},
	{"machine.smbiosSerial", "spec.domain.firmware.serial"},
	{"machine.type", "spec.domain.machine.type"},
	{"machine.graphics", "spec.domain.devices.autoattachGraphicsDevice"},
	{"machine.serialConsole", "spec.domain.devices.autoattachSerialConsole"},
	{"machine.rng", "spec.domain.devices.rng"},
	{"machine.watchdog.action", "spec.domain.devices.watchdog.i6300esb.action"},
	{"machine.watchdog", "spec.domain.devices.watchdog"},
	{"machine.panic", "spec.domain.devices.panicDevices"},
}

// SpecField is the field of v's spec that the machine description's field (a launcher's refusal
// names it, e.g. "machine.kernel.image.ref") was translated from, so a condition can name what the
// user wrote; "" when no single spec field is behind it. Machine disks and NICs are the spec's
// disks, interfaces and inputs in order (Machine keeps it): a disk's source is its volume.
func SpecField(v *v1alpha1.VirtualMachineInstance, field string) string {
	if m := machineIndexed.FindStringSubmatch(field); m != nil {
		return indexedField(v, m[1], m[2], m[3])
	}
	for _, f := range machineFields {
		if field == f.machine || strings.HasPrefix(field, f.machine+".") || strings.HasPrefix(field, f.machine+"[") {
			return f.spec
		}
	}
	return ""
}

func indexedField(v *v1alpha1.VirtualMachineInstance, list, index, rest string) string {
	i, err := strconv.Atoi(index)
	if err != nil {
		return ""
	}
	devs := v.Spec.Domain.Devices
	if list == "inputs" {
		if i >= len(devs.Inputs) {
			return ""
		}
		return "spec.domain.devices.inputs[" + index + "]"
	}
	if list == "nics" {
		if i >= len(devs.Interfaces) {
			return ""
		}
		return "spec.domain.devices.interfaces[" + index + "]"
	}
	if i >= len(devs.Disks) {
		return ""
	}
	if strings.HasPrefix(rest, ".source") {
		return volumeField(v, devs.Disks[i].Name, rest)
	}
	return "spec.domain.devices.disks[" + index + "]"
}

// volumeField is the field of volume name that a disk's source field rest came from: a cloud-init
// Secret reference when the launcher could not read its data, else the volume.
func volumeField(v *v1alpha1.VirtualMachineInstance, name, rest string) string {
	vol := "spec.volumes[" + name + "]"
	for i := range v.Spec.Volumes {
		if v.Spec.Volumes[i].Name != name {
			continue
		}
		c, kind, ok := v.Spec.Volumes[i].CloudInit()
		switch {
		case !ok:
		case strings.HasPrefix(rest, ".source.cloudInit.userData") && c.UserDataSecretRef != nil:
			return vol + "." + kind + ".secretRef"
		case strings.HasPrefix(rest, ".source.cloudInit.networkData") && c.NetworkDataSecretRef != nil:
			return vol + "." + kind + ".networkDataSecretRef"
		}
	}
	return vol
}
