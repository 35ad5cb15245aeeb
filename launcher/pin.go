package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/qvirt/qvirt/internal/affinity"
	"github.com/qvirt/qvirt/machine"
)

// pinCPUs gives each vCPU a host CPU of its own when the machine asks for dedicated CPUs
// (KubeVirt's dedicatedCpuPlacement, which libvirt does with <vcpupin> and <emulatorpin>). The CPUs
// are those the launcher may run on: in a Guaranteed pod with whole CPUs, the kubelet's static CPU
// manager gives the container exactly that many, exclusively. vCPU i goes to the i-th of them in
// ascending order; QEMU's other threads (its main loop, I/O threads, RCU and workers) go to the
// CPU after the vCPUs' when the emulator thread is isolated, else share the vCPUs' CPUs. It runs
// before the guest does, so no vCPU has run anywhere else; threads QEMU starts later take the
// affinity of the thread that starts them, which is pinned by then.
func (p *Process) pinCPUs(ctx context.Context) error {
	c := p.machine.CPU
	if !c.DedicatedCPUs {
		return nil
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return fmt.Errorf("read the CPUs the launcher may run on: %w", err)
	}
	cpus := affinity.CPUs(&set)
	need := int(c.VCPUs)
	if c.IsolateEmulatorThread {
		need++
	}
	if len(cpus) < need {
		return machine.Invalid(machinePath.Child("cpu", "dedicatedCPUs"), true, fmt.Sprintf(
			"needs %d host CPUs of its own (%s) but the launcher may run on %d (%s): the kubelet's static CPU manager gives them to a Guaranteed pod with whole CPUs",
			need, pinNeeds(c), len(cpus), formatCPUs(cpus)))
	}
	if len(cpus) > need {
		// In a pod the static CPU manager gives exactly the CPUs asked for; more means these are
		// the node's shared pool (a cpumanager label set by hand on a node without the static
		// policy), where other pods run too.
		p.log.Info("more CPUs than the pinning needs: they may not be this pod's own", "cpus", formatCPUs(cpus), "needed", need)
	}
	if c.NUMAPassthrough {
		if err := checkOneHostNode(cpus[:need]); err != nil {
			return err
		}
	}
	vcpus, err := vcpuList(ctx, p)
	if err != nil {
		return err
	}
	vcpuCPU := map[int]int{} // thread → host CPU
	for _, v := range vcpus {
		if v.CPUIndex < 0 || v.CPUIndex >= int(c.VCPUs) {
			return fmt.Errorf("QEMU reports vCPU %d of %d", v.CPUIndex, c.VCPUs)
		}
		if _, shared := vcpuCPU[v.ThreadID]; shared {
			return fmt.Errorf("vCPUs share host thread %d (single-threaded TCG): they cannot be pinned one by one", v.ThreadID)
		}
		vcpuCPU[v.ThreadID] = cpus[v.CPUIndex]
	}
	emulator := cpus[:c.VCPUs]
	if c.IsolateEmulatorThread {
		emulator = cpus[c.VCPUs:need]
	}
	if err := p.pinOtherThreads(vcpuCPU, emulator); err != nil {
		return err
	}
	for tid, cpu := range vcpuCPU {
		if err := setAffinity(tid, cpu); err != nil {
			return fmt.Errorf("pin vCPU thread %d to CPU %d: %w", tid, cpu, err)
		}
	}
	p.log.Info("vCPUs pinned", "cpus", formatCPUs(cpus[:c.VCPUs]), "emulator", formatCPUs(emulator))
	return nil
}

// pinOtherThreads pins every QEMU thread that is no vCPU to the emulator's CPUs, listing QEMU's
// threads again until a pass finds none it had not pinned: a thread started during a pass may
// have inherited an affinity from before it.
func (p *Process) pinOtherThreads(vcpuThreads map[int]int, emulator []int) error {
	done := map[int]bool{}
	for pass := 0; pass < 10; pass++ {
		tids, err := threadsOf(p.Pid())
		if err != nil {
			return err
		}
		fresh := false
		for _, tid := range tids {
			if _, vcpu := vcpuThreads[tid]; vcpu || done[tid] {
				continue
			}
			fresh = true
			// A thread that ended meanwhile (ESRCH) needs no pinning.
			if err := setAffinity(tid, emulator...); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("pin QEMU thread %d to CPUs %s: %w", tid, formatCPUs(emulator), err)
			}
			done[tid] = true
		}
		if !fresh {
			return nil
		}
	}
	return fmt.Errorf("QEMU keeps starting threads: cannot pin them to CPUs %s", formatCPUs(emulator))
}

func threadsOf(pid int) ([]int, error) {
	entries, err := os.ReadDir(procPath(pid, "task"))
	if err != nil {
		return nil, fmt.Errorf("list QEMU's threads: %w", err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

func setAffinity(tid int, cpus ...int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(tid, &set)
}

// pinNeeds says what the pinning needs CPUs for, for an error that there are too few.
func pinNeeds(c machine.CPU) string {
	if c.IsolateEmulatorThread {
		return fmt.Sprintf("%d vCPUs and the emulator thread", c.VCPUs)
	}
	return fmt.Sprintf("%d vCPUs", c.VCPUs)
}

// formatCPUs writes CPUs as the kernel's lists do (0-3,6).
func formatCPUs(cpus []int) string {
	var parts []string
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(cpus[i]))
		} else {
			parts = append(parts, strconv.Itoa(cpus[i])+"-"+strconv.Itoa(cpus[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
