package launcher

import (
	"fmt"
	"strconv"
	"strings"

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
	model += b.kvmFlags(cpu) + b.hypervFlags(cpu.HyperV, cp.Child("hyperV"))
	b.add("-cpu", model)
	b.add("-smp", fmt.Sprintf("cpus=%d,sockets=%d,cores=%d,threads=%d", cpu.VCPUs, cpu.Sockets, cpu.Cores, cpu.Threads))
	if m.MemoryMiB <= 0 {
		b.fail(machine.Invalid(machinePath.Child("memoryMiB"), m.MemoryMiB, "must be positive"))
	}
	b.add("-m", strconv.FormatInt(m.MemoryMiB, 10))
	if len(m.Filesystems) > 0 {
		// virtiofsd maps the guest's RAM to serve its requests: the RAM must be shared memory,
		// a memfd QEMU passes to the daemon over the vhost-user socket (machineType names it).
		b.add("-object", fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,share=on", GuestRAMID, m.MemoryMiB))
	}
}

// kvmFlags are KVM's paravirtual features, as libvirt writes them: <kvm><hidden state='on'/> is
// kvm=off, <pvspinlock> kvm-pv-unhalt, the kvmclock timer kvmclock. Under TCG QEMU accepts them
// and they do nothing (TCG shows the guest no KVM signature).
func (b *builder) kvmFlags(cpu machine.CPU) string {
	var s string
	if cpu.KVMHidden {
		s += ",kvm=off"
	}
	if cpu.PVUnhalt != nil {
		s += ",kvm-pv-unhalt=" + onOff(*cpu.PVUnhalt)
	}
	if cpu.KVMClock != nil {
		s += ",kvmclock=" + onOff(*cpu.KVMClock)
	}
	return s
}

// hypervFlags are the Hyper-V enlightenments, in libvirt's order, as its <hyperv> features map
// to QEMU 7.2's flags. They need KVM: under TCG QEMU shows the guest none of them, and
// hv-vpindex makes it refuse to start, so the node agent leaves them out there.
func (b *builder) hypervFlags(hv *machine.HyperV, p machine.Path) string {
	if hv == nil {
		return ""
	}
	if b.m.Accel != machine.AccelKVM {
		b.fail(machine.Forbidden(p, "Hyper-V enlightenments need KVM"))
		return ""
	}
	if hv.Passthrough {
		if *hv != (machine.HyperV{Passthrough: true}) {
			b.fail(machine.Forbidden(p, "hv-passthrough excludes the other Hyper-V flags"))
		}
		return ",hv-passthrough=on"
	}
	var s strings.Builder
	flag := func(on bool, name string) {
		if on {
			s.WriteString(",hv-" + name + "=on")
		}
	}
	flag(hv.Relaxed, "relaxed")
	flag(hv.VAPIC, "vapic")
	if hv.Spinlocks != 0 {
		if hv.Spinlocks < 0xfff {
			b.fail(machine.Invalid(p.Child("spinlocks"), hv.Spinlocks, "must be 4095 or more"))
		}
		fmt.Fprintf(&s, ",hv-spinlocks=0x%x", hv.Spinlocks)
	}
	flag(hv.VPIndex, "vpindex")
	flag(hv.Runtime, "runtime")
	flag(hv.SyNIC, "synic")
	flag(hv.STimer, "stimer")
	flag(hv.STimerDirect, "stimer-direct")
	flag(hv.Reset, "reset")
	if hv.VendorID != "" {
		// -cpu's feature list is split at every comma, with no escape.
		if len(hv.VendorID) > 12 || strings.ContainsFunc(hv.VendorID, func(r rune) bool { return r < 0x20 || r > 0x7e || r == ',' }) {
			b.fail(machine.Invalid(p.Child("vendorID"), hv.VendorID, "must be at most 12 printable ASCII characters other than ','"))
		}
		s.WriteString(",hv-vendor-id=" + hv.VendorID)
	}
	flag(hv.Frequencies, "frequencies")
	flag(hv.Reenlightenment, "reenlightenment")
	flag(hv.TLBFlush, "tlbflush")
	flag(hv.TLBFlushDirect, "tlbflush-direct")
	flag(hv.TLBFlushExt, "tlbflush-ext")
	flag(hv.IPI, "ipi")
	if hv.EVMCS {
		// KubeVirt requires the vmx CPU feature with evmcs (its webhook adds it); qvirt's API has
		// no CPU feature list, so the flag comes with it.
		s.WriteString(",vmx=on,hv-evmcs=on")
	}
	flag(hv.Time, "time")
	return s.String()
}
