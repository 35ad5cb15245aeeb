package launcher

import (
	"fmt"

	"github.com/qvirt/qvirt/machine"
)

// Real-time vCPUs (KubeVirt's domain.cpu.realtime): the threads of the vCPUs the machine names
// run SCHED_FIFO at priority 1. The launcher holds no capability and so cannot make them so: the
// node agent does, once QEMU runs, as KubeVirt's virt-handler does (handler/vmisync/realtime.go).
// The launcher turns the guest's PMU off (cpu.go) and checks the list.

// realtime checks the machine's real-time vCPUs: only with dedicated CPUs, each a vCPU of the
// machine, each once.
func (b *builder) realtime(cpu machine.CPU, p machine.Path) {
	if len(cpu.RealtimeVCPUs) == 0 {
		return
	}
	if !cpu.DedicatedCPUs {
		b.fail(machine.Invalid(p, cpu.RealtimeVCPUs, "needs dedicatedCPUs: a real-time vCPU thread on a CPU it shares would starve the other threads there"))
		return
	}
	seen := map[uint32]bool{}
	for i, v := range cpu.RealtimeVCPUs {
		switch {
		case v >= cpu.VCPUs:
			b.fail(machine.Invalid(p.Index(i), v, fmt.Sprintf("must be a vCPU of the machine (0 to %d)", cpu.VCPUs-1)))
		case seen[v]:
			b.fail(machine.Duplicate(p.Index(i), v))
		}
		seen[v] = true
	}
}
