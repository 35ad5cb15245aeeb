package launcher

import "github.com/qvirt/qvirt/machine"

// The panic device kind: QEMU's pvpanic, on the ISA bus (I/O port 0x505, found by the guest
// through ACPI as QEMU0001) or as a PCI device on its own root port, through which the guest
// kernel reports its panic. QEMU then ends (-action panic=shutdown: its default, stated so that
// no other default can pause the guest instead), as libvirt's on_crash destroy does for KubeVirt: the launcher reports the exit as a guest panic, and the instance
// fails. Hyper-V's crash MSRs are a CPU flag (cpu.go). It is fixed when QEMU starts, so it has
// only a cold form.

// PanicDeviceID is the -device id of a panic device: "panic-isa" or "panic-pci".
func PanicDeviceID(kind string) string { return "panic-" + kind }

// panicDevices adds the pvpanic devices and, with any panic device, QEMU's panic action.
func (b *builder) panicDevices() {
	hvCrash := b.m.CPU.HyperV != nil && b.m.CPU.HyperV.Crash
	if len(b.m.Panic) == 0 && !hvCrash {
		return
	}
	seen := map[string]bool{}
	for i, kind := range b.m.Panic {
		p := machinePath.Child("panic").Index(i)
		if seen[kind] {
			b.fail(machine.Duplicate(p, kind))
			continue
		}
		seen[kind] = true
		switch kind {
		case machine.PanicISA:
			b.devs = append(b.devs, "-device", "pvpanic,id="+PanicDeviceID(kind))
		case machine.PanicPCI:
			b.devs = append(b.devs, "-device", "pvpanic-pci,id="+PanicDeviceID(kind)+",bus="+b.rootPort("port-"+PanicDeviceID(kind)))
		default:
			b.fail(machine.NotSupported(p, kind, []string{machine.PanicISA, machine.PanicPCI}))
		}
	}
	b.add("-action", "panic=shutdown")
}
