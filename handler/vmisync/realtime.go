package vmisync

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/cpuset"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/cpumanager"
	"github.com/qvirt/qvirt/internal/affinity"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// Event reasons of real-time vCPUs.
const (
	EventRealtimeVCPUs  = "RealtimeVCPUs"
	EventRealtimeFailed = "RealtimeFailed"
)

// rtPriority is a real-time vCPU thread's priority: the lowest, as KubeVirt's.
const rtPriority = 1

// vcpuThreadName is QEMU's name for a vCPU thread (it runs with debug-threads=on).
var vcpuThreadName = regexp.MustCompile(`^CPU (\d+)/(TCG|KVM)$`)

// syncRealtime makes the threads of the instance's real-time vCPUs (domain.cpu.realtime's mask)
// SCHED_FIFO at priority 1, as KubeVirt's virt-handler does: the launcher holds no capability, and
// the node agent has CAP_SYS_NICE. The threads are those named as vCPUs in the QEMU that the
// instance's launcher process (checked to be its pod's) started. A real-time thread starves every
// other on its CPU, so each must run only on CPUs the kubelet's static CPU manager gave the pod's
// compute container for itself (its checkpoint says which), not on a shared pool a hand-set
// cpumanager label would send the pod to. It runs at every sync, so that a new node agent, or the
// target's after a migration, finds the threads as they must be; a failure is an Event and is
// retried.
func (r *Reconciler) syncRealtime(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status) error {
	vcpus, err := v1alpha1.RealtimeVCPUs(v.Spec.Domain.CPU)
	if err != nil || len(vcpus) == 0 || st.Phase != protocol.PhaseRunning {
		return nil
	}
	err = r.makeRealtime(ctx, v, pod, vcpus)
	if err != nil {
		err = fmt.Errorf("spec.domain.cpu.realtime: make the real-time vCPUs' threads SCHED_FIFO: %w", err)
		r.Recorder.Event(v, corev1.EventTypeWarning, EventRealtimeFailed, err.Error())
	}
	return err
}

func (r *Reconciler) makeRealtime(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, vcpus []uint32) error {
	own, err := r.ownCPUs(pod)
	if err != nil {
		return err
	}
	peer, err := r.peer(ctx, v)
	if err != nil {
		return err
	}
	changed, err := makeRealtime(peer, vcpus, own)
	if len(changed) > 0 {
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventRealtimeVCPUs, "vCPUs %v run SCHED_FIFO at priority %d", changed, rtPriority)
	}
	return err
}

// ownCPUs are the CPUs the kubelet's CPU manager gave the pod's compute container for itself.
func (r *Reconciler) ownCPUs(pod *corev1.Pod) (cpuset.CPUSet, error) {
	if r.CPUManagerState == "" {
		return cpuset.CPUSet{}, errors.New("the node agent reads no kubelet CPU manager state (--cpu-manager-state is empty), so it cannot tell which CPUs the pod has for itself")
	}
	st, err := cpumanager.Read(r.CPUManagerState)
	if err != nil {
		return cpuset.CPUSet{}, err
	}
	return st.Exclusive(string(pod.UID), podlayout.ComputeContainer)
}

// makeRealtime makes the threads of vcpus in the launcher's QEMU SCHED_FIFO where they are not,
// each once it runs only on CPUs of own, and returns the vCPUs it changed.
func makeRealtime(peer launcher.Peer, vcpus []uint32, own cpuset.CPUSet) ([]uint32, error) {
	qemu, err := qemuOf(peer.PID)
	if err != nil {
		return nil, err
	}
	threads, err := vcpuThreads(qemu.pid)
	if err != nil {
		return nil, err
	}
	var changed []uint32
	for _, vcpu := range vcpus {
		tid, ok := threads[vcpu]
		if !ok {
			return changed, fmt.Errorf("QEMU (process %d) has no thread for vCPU %d", qemu.pid, vcpu)
		}
		did, err := setFIFO(qemu, tid, own)
		if err != nil {
			return changed, fmt.Errorf("vCPU %d's thread %d: %w", vcpu, tid, err)
		}
		if did {
			changed = append(changed, vcpu)
		}
	}
	return changed, nil
}

// setFIFO makes thread tid of process p SCHED_FIFO at rtPriority unless it is, once it may run on
// no CPU beyond own. Its children and threads start SCHED_OTHER (reset on fork). A thread ID is
// only a number: should p have ended and tid been reused meanwhile, the thread is set back and the
// change refused. It reports whether it changed the thread.
func setFIFO(p process, tid int, own cpuset.CPUSet) (bool, error) {
	cur, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return false, err
	}
	if cur.Policy == unix.SCHED_FIFO && cur.Priority == rtPriority {
		return false, nil
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		return false, fmt.Errorf("read its CPUs: %w", err)
	}
	if runs := cpuset.New(affinity.CPUs(&set)...); !runs.IsSubsetOf(own) {
		return false, fmt.Errorf("it may run on CPUs %s, not only on the container's own %s", runs, own)
	}
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: rtPriority, Flags: unix.SCHED_FLAG_RESET_ON_FORK}
	if err := unix.SchedSetAttr(tid, attr, 0); err != nil {
		return false, fmt.Errorf("%w%s", err, noRTBudget(tid))
	}
	if !p.owns(tid) {
		_ = unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0)
		return false, fmt.Errorf("QEMU (process %d) ended while its thread was changed: set back", p.pid)
	}
	return true, nil
}

// process is a process as /proc showed it: its ID, parent and start time (which tells it from a
// later process given the same ID).
type process struct {
	pid, ppid int
	start     uint64
}

// owns says whether thread tid is still p's, and p the process it was.
func (p process) owns(tid int) bool {
	now, ok := runningQEMU(p.pid, p.ppid)
	if !ok || now.start != p.start {
		return false
	}
	_, err := os.Stat(filepath.Join("/proc", strconv.Itoa(p.pid), "task", strconv.Itoa(tid)))
	return err == nil
}

// qemuOf is the QEMU process the launcher process pid started: its child running qemu-system-*
// that has not ended. The children come from the kernel's list of each of the launcher's threads
// (/proc/<pid>/task/<tid>/children), read on the node: a handful of small files, not a walk of
// /proc at every sync. Nothing the launcher reports is used: the QEMU PID in its status is in the
// pod's own PID namespace.
func qemuOf(pid int) (process, error) {
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	if err != nil || len(tasks) == 0 {
		return process{}, fmt.Errorf("the launcher (process %d) has ended, or the kernel lists no children (%v)", pid, err)
	}
	for _, t := range tasks {
		list, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended meanwhile
		}
		for _, f := range strings.Fields(string(list)) {
			child, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			if p, ok := runningQEMU(child, pid); ok {
				return p, nil
			}
		}
	}
	return process{}, fmt.Errorf("the launcher (process %d) runs no QEMU", pid)
}

// runningQEMU is process pid when it is a child of parent running qemu-system-* that has not ended.
func runningQEMU(pid, parent int) (process, bool) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return process{}, false
	}
	st, err := p.Stat()
	if err != nil || st.PPID != parent || st.State == "Z" || !strings.HasPrefix(st.Comm, "qemu-system") {
		return process{}, false
	}
	return process{pid: pid, ppid: parent, start: st.Starttime}, true
}

// vcpuThreads maps each vCPU of QEMU process pid to its thread, by the threads' names.
func vcpuThreads(pid int) (map[uint32]int, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list QEMU's threads: %w", err)
	}
	threads := map[uint32]int{}
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join(dir, e.Name(), "comm"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		m := vcpuThreadName.FindStringSubmatch(strings.TrimSpace(string(comm)))
		if m == nil {
			continue
		}
		vcpu, err1 := strconv.ParseUint(m[1], 10, 32)
		tid, err2 := strconv.Atoi(e.Name())
		if err1 == nil && err2 == nil {
			threads[uint32(vcpu)] = tid
		}
	}
	return threads, nil
}

// cgroupCPURoot is where cgroup v1's cpu controller is mounted.
var cgroupCPURoot = "/sys/fs/cgroup/cpu"

// noRTBudget explains a refused SCHED_FIFO when the kernel schedules real-time threads by cgroup
// (CONFIG_RT_GROUP_SCHED, cgroup v1's cpu.rt_runtime_us): a cgroup has no real-time budget unless
// given some, and the kubelet gives pods none. The thread's own cgroup is read where it can be (a
// node agent in a container sees only its own cgroup's subtree). "" on other kernels, or when the
// thread's cgroup has a budget.
func noRTBudget(tid int) string {
	if _, err := os.Stat(filepath.Join(cgroupCPURoot, "cpu.rt_runtime_us")); err != nil {
		return ""
	}
	path := cpuCgroupOf(tid)
	budget, err := os.ReadFile(filepath.Join(cgroupCPURoot, filepath.Clean("/"+path), "cpu.rt_runtime_us"))
	switch {
	case err != nil:
		return fmt.Sprintf(" (this node's kernel schedules real-time threads by cgroup (CONFIG_RT_GROUP_SCHED), and the thread's cpu cgroup %s "+
			"has no real-time budget unless given one: the kubelet leaves every pod's cpu.rt_runtime_us at 0; run real-time guests on nodes whose kernel does not)", path)
	case strings.TrimSpace(string(budget)) == "0":
		return fmt.Sprintf(" (this node's kernel schedules real-time threads by cgroup (CONFIG_RT_GROUP_SCHED), and the thread's cpu cgroup %s "+
			"has no real-time budget: its cpu.rt_runtime_us is 0, as the kubelet leaves every pod's; run real-time guests on nodes whose kernel does not)", path)
	}
	return ""
}

// cpuCgroupOf is thread tid's cgroup in cgroup v1's cpu hierarchy ("" when unknown).
func cpuCgroupOf(tid int) string {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(tid), "cgroup"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "cpu") {
			return parts[2]
		}
	}
	return ""
}
