package launcher

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/qvirt/qvirt/machine"
)

// The CPU and memory device kind: the vCPU model, the topology and the guest RAM. vCPUs can be
// hot-plugged, whole sockets at a time, up to MaxSockets (cpu_hotplug.go); RAM beyond the boot RAM
// through a virtio-mem device, up to MaxMemoryMiB (memory_hotplug.go).

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
	if cpu.MaxSockets != 0 && (cpu.MaxSockets < cpu.Sockets || uint64(cpu.MaxSockets)*uint64(cpu.Cores)*uint64(cpu.Threads) > machine.MaxVCPUs) {
		b.fail(machine.Invalid(cp.Child("maxSockets"), cpu.MaxSockets, fmt.Sprintf("must be at least sockets (%d) and give at most %d vCPUs", cpu.Sockets, machine.MaxVCPUs)))
	}
	if cpu.MaxSockets > cpu.Sockets && cpu.DedicatedCPUs {
		b.fail(machine.Invalid(cp.Child("maxSockets"), cpu.MaxSockets, "vCPU hotplug cannot go with dedicatedCPUs: a hot-plugged vCPU would have no CPU of its own"))
	}
	if cpu.IsolateEmulatorThread && !cpu.DedicatedCPUs {
		b.fail(machine.Invalid(cp.Child("isolateEmulatorThread"), true, "needs dedicatedCPUs"))
	}
	b.realtime(cpu, cp.Child("realtimeVCPUs"))
	model := cpu.Model
	if cpu.PVEOI {
		// KubeVirt's features.apic.endOfInterrupt, as libvirt's <apic eoi='on'/>. A KVM feature:
		// under TCG QEMU accepts it and it does nothing.
		model += ",kvm-pv-eoi=on"
	}
	if len(cpu.RealtimeVCPUs) > 0 {
		// As KubeVirt's real-time guests (<pmu state='off'/>): no PMU whose counters the host
		// would multiplex on the vCPUs' CPUs.
		model += ",pmu=off"
	}
	model += b.kvmFlags(cpu) + b.hypervFlags(cpu.HyperV, cp.Child("hyperV")) + b.featureFlags(cpu.Features, cp.Child("features"))
	b.add("-cpu", model)
	smp := fmt.Sprintf("cpus=%d,sockets=%d,cores=%d,threads=%d", cpu.VCPUs, cpu.Sockets, cpu.Cores, cpu.Threads)
	if cpu.MaxSockets > cpu.Sockets {
		// With room for vCPU hotplug, -smp's sockets are the most there can be; cpus are those
		// the guest starts with.
		smp = fmt.Sprintf("cpus=%d,sockets=%d,cores=%d,threads=%d,maxcpus=%d", cpu.VCPUs, cpu.MaxSockets, cpu.Cores, cpu.Threads,
			cpu.MaxSockets*cpu.Cores*cpu.Threads)
	}
	b.add("-smp", smp)
	if m.MemoryMiB <= 0 {
		b.fail(machine.Invalid(machinePath.Child("memoryMiB"), m.MemoryMiB, "must be positive"))
	}
	ramKiB := guestRAMKiB(m)
	mem := strconv.FormatInt(ramKiB, 10) + "K"
	if room := m.MemoryHotplugRoomMiB(); room > 0 {
		// The room above the boot RAM that the virtio-mem device (memory_hotplug.go) sits in.
		mem += ",maxmem=" + strconv.FormatInt(ramKiB+room<<10, 10) + "K"
	}
	b.add("-m", mem)
	if ramBackend(m) {
		b.guestRAMBackend(ramKiB)
	}
	b.guestNUMA()
}

// guestRAMBackend: the guest RAM's backend, GuestRAMID.
func (b *builder) guestRAMBackend(ramKiB int64) {
	m := b.m
	// virtiofsd maps the guest's RAM to serve its requests: the RAM must be shared memory, a
	// memfd QEMU passes to the daemon over the vhost-user socket. Huge pages come from a memfd of
	// the kernel's huge page pool (as libvirt's memfd memory source), which needs no hugetlbfs
	// mount in the pod and is charged to the pod's hugetlb cgroup. firmware's -machine names it.
	backend := fmt.Sprintf("memory-backend-memfd,id=%s,size=%dK,share=on", GuestRAMID, ramKiB)
	if kib := m.HugePageKiB; kib != 0 {
		if (kib != 2048 && kib != 1<<20) || (m.MemoryMiB<<10)%kib != 0 {
			b.fail(machine.Invalid(machinePath.Child("hugePageKiB"), kib, fmt.Sprintf("must be 2048 or 1048576 and divide the guest's %d MiB", m.MemoryMiB)))
		}
		backend += fmt.Sprintf(",hugetlb=on,hugetlbsize=%dK", kib)
	}
	b.add("-object", backend)
}

// ramBackend is whether the guest's RAM needs a memory backend of its own (GuestRAMID) rather than
// QEMU's anonymous memory.
func ramBackend(m *Machine) bool { return len(m.Filesystems) > 0 || m.HugePageKiB != 0 }

// tcgRAMPadKiB is what the guest's RAM grows by under TCG. QEMU before 9.0 loses guest writes
// during a live migration under TCG (fixed by QEMU commit 03bfc2188f, "physmem: Fix migration
// dirty bitmap coherency with TCG memory access"; Debian 12's QEMU 7.2 does not have it): when
// a RAM block's length is a multiple of 64 pages (256 KiB), each sync of the migration's dirty
// bitmap clears the bits a word at a time without making the vCPUs' TLBs catch writes again, so
// a page written after a sync is not sent again and the target runs the guest with stale pages
// (seen here as guest kernels oopsing in list_add right after the switch, about one migration
// in fifty). Any other length makes QEMU sync page by page, which does reset the TLBs. 8 KiB is
// the least QEMU keeps as it is (it rounds x86 RAM to 8 KiB); KVM tracks dirty pages in the
// kernel and needs none of this.
const tcgRAMPadKiB = 8

// guestRAMKiB is the size of the guest's RAM as QEMU is given it.
func guestRAMKiB(m *Machine) int64 {
	kib := m.MemoryMiB * 1024
	// Huge pages cannot be padded: their memfd is a whole number of pages, and a migration under
	// TCG is refused instead (migrationUnderTCGRefused).
	if m.Accel == machine.AccelTCG && m.HugePageKiB == 0 {
		kib += tcgRAMPadKiB
	}
	return kib
}

// featureFlags turn the CPU features on (force, require, optional) or off (disable, forbid);
// checkCPUFeatures holds require and forbid to their word once QEMU has made the vCPUs.
func (b *builder) featureFlags(features []machine.CPUFeature, p machine.Path) string {
	var s string
	seen := map[string]bool{}
	for i, f := range features {
		fp := p.Index(i)
		if !machine.IsCPUFeature(f.Name) {
			b.fail(machine.Invalid(fp.Child("name"), f.Name, "must be a QEMU CPU feature name: lower-case letters, digits, '-', '_' or '.'"))
			continue
		}
		if seen[f.Name] {
			b.fail(machine.Duplicate(fp.Child("name"), f.Name))
			continue
		}
		seen[f.Name] = true
		switch f.Policy {
		case machine.CPUFeatureForce, machine.CPUFeatureRequire, machine.CPUFeatureOptional:
			s += "," + f.Name + "=on"
		case machine.CPUFeatureDisable, machine.CPUFeatureForbid:
			s += "," + f.Name + "=off"
		default:
			b.fail(machine.NotSupported(fp.Child("policy"), f.Policy, []string{machine.CPUFeatureForce, machine.CPUFeatureRequire,
				machine.CPUFeatureOptional, machine.CPUFeatureDisable, machine.CPUFeatureForbid}))
		}
	}
	return s
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
	flag(hv.Crash, "crash")
	if hv.EVMCS {
		// KubeVirt requires the vmx CPU feature with evmcs (its webhook adds it); qvirt's API has
		// no CPU feature list, so the flag comes with it.
		s.WriteString(",vmx=on,hv-evmcs=on")
	}
	flag(hv.Time, "time")
	return s.String()
}

// checkCPUFeatures holds the require and forbid policies to their word before the guest runs: a
// required feature the vCPUs do not have (QEMU drops what the accelerator cannot give, with only
// a warning) or a forbidden one the host has fails the start, naming the feature.
func (p *Process) checkCPUFeatures(ctx context.Context) error {
	var require, forbid []int
	for i, f := range p.machine.CPU.Features {
		switch f.Policy {
		case machine.CPUFeatureRequire:
			require = append(require, i)
		case machine.CPUFeatureForbid:
			forbid = append(forbid, i)
		}
	}
	if len(require)+len(forbid) == 0 {
		return nil
	}
	fp := machinePath.Child("cpu", "features")
	if len(require) > 0 {
		cpus, err := p.mon.QueryCPUsFast(ctx)
		if err != nil || len(cpus) == 0 {
			return fmt.Errorf("list the vCPUs: %v", err)
		}
		for _, i := range require {
			name := p.machine.CPU.Features[i].Name
			on, err := p.mon.CPUFeatureOn(ctx, cpus[0].QOMPath, name)
			if err != nil {
				return machine.Invalid(fp.Index(i).Child("name"), name, fmt.Sprintf("QEMU knows no such CPU feature: %v", err))
			}
			if !on {
				return machine.Invalid(fp.Index(i).Child("policy"), machine.CPUFeatureRequire,
					fmt.Sprintf("the host cannot give the guest CPU feature %s (%s): use policy optional to start without it", name, p.machine.Accel))
			}
		}
	}
	if len(forbid) > 0 {
		host, err := p.mon.ModelFeatures(ctx, "max")
		if err != nil {
			return fmt.Errorf("read the host's CPU features: %w", err)
		}
		for _, i := range forbid {
			name := p.machine.CPU.Features[i].Name
			if on, _ := host[name].(bool); on {
				return machine.Invalid(fp.Index(i).Child("policy"), machine.CPUFeatureForbid,
					fmt.Sprintf("the host has CPU feature %s (%s), which the VM forbids", name, p.machine.Accel))
			}
		}
	}
	return nil
}
