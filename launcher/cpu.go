package launcher

import (
	"fmt"
	"strconv"

	"github.com/qvirt/qvirt/machine"
)

// The CPU and memory device kind: the vCPU model, the topology and the guest RAM. All of it is
// fixed when QEMU starts (the launcher hot-plugs neither vCPUs nor memory), so it has only a cold
// form.

// cpuMemory: -cpu, -smp and -m. The model arrives decided (package machine); the host model is
// refused without KVM rather than left for QEMU to reject after it started.
func (b *builder) cpuMemory() {
	m := b.m
	cpu, cp := m.CPU, machinePath.Child("cpu")
	switch {
	case !machine.IsCPUModel(cpu.Model):
		b.fail(machine.Invalid(cp.Child("model"), cpu.Model, "must be a QEMU CPU model name such as host or qemu64"))
	case cpu.Model == "host" && m.Accel != machine.AccelKVM:
		b.fail(machine.Invalid(cp.Child("model"), cpu.Model, "the host CPU model needs KVM"))
	}
	if cpu.Sockets == 0 || cpu.Cores == 0 || cpu.Threads == 0 || uint64(cpu.VCPUs) != uint64(cpu.Sockets)*uint64(cpu.Cores)*uint64(cpu.Threads) {
		b.fail(machine.Invalid(cp.Child("vcpus"), cpu.VCPUs, fmt.Sprintf("must be sockets*cores*threads (%d*%d*%d), each at least 1", cpu.Sockets, cpu.Cores, cpu.Threads)))
	}
	model := cpu.Model
	if cpu.PVEOI {
		// KubeVirt's features.apic.endOfInterrupt, as libvirt's <apic eoi='on'/>. A KVM feature:
		// under TCG QEMU accepts it and it does nothing.
		model += ",kvm-pv-eoi=on"
	}
	b.add("-cpu", model)
	b.add("-smp", fmt.Sprintf("cpus=%d,sockets=%d,cores=%d,threads=%d", cpu.VCPUs, cpu.Sockets, cpu.Cores, cpu.Threads))
	if m.MemoryMiB <= 0 {
		b.fail(machine.Invalid(machinePath.Child("memoryMiB"), m.MemoryMiB, "must be positive"))
	}
	b.add("-m", strconv.FormatInt(m.MemoryMiB, 10))
}
