package vmisync

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
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
// instance's launcher process (checked to be its pod's) started; admission holds real-time to
// dedicated CPUs, so they run on CPUs of the pod's own. It runs at every sync, so that a new node
// agent, or the target's after a migration, finds the threads as they must be; a failure is an
// Event and is retried.
func (r *Reconciler) syncRealtime(ctx context.Context, v *v1alpha1.VirtualMachineInstance, st *protocol.Status) error {
	vcpus, err := v1alpha1.RealtimeVCPUs(v.Spec.Domain.CPU)
	if err != nil || len(vcpus) == 0 || st.Phase != protocol.PhaseRunning {
		return nil
	}
	peer, err := r.peer(ctx, v)
	if err == nil {
		var changed []uint32
		changed, err = makeRealtime(peer, vcpus)
		if len(changed) > 0 {
			r.Recorder.Eventf(v, corev1.EventTypeNormal, EventRealtimeVCPUs, "vCPUs %v run SCHED_FIFO at priority %d", changed, rtPriority)
		}
	}
	if err != nil {
		err = fmt.Errorf("spec.domain.cpu.realtime: make the real-time vCPUs' threads SCHED_FIFO: %w", err)
		r.Recorder.Event(v, corev1.EventTypeWarning, EventRealtimeFailed, err.Error())
	}
	return err
}

// makeRealtime makes the threads of vcpus in the launcher's QEMU SCHED_FIFO where they are not,
// and returns the vCPUs it changed.
func makeRealtime(peer launcher.Peer, vcpus []uint32) ([]uint32, error) {
	qemu, err := qemuOf(peer.PID)
	if err != nil {
		return nil, err
	}
	threads, err := vcpuThreads(qemu)
	if err != nil {
		return nil, err
	}
	var changed []uint32
	for _, vcpu := range vcpus {
		tid, ok := threads[vcpu]
		if !ok {
			return changed, fmt.Errorf("QEMU (process %d) has no thread for vCPU %d", qemu, vcpu)
		}
		cur, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			return changed, fmt.Errorf("read vCPU %d's thread %d: %w", vcpu, tid, err)
		}
		if cur.Policy == unix.SCHED_FIFO && cur.Priority == rtPriority {
			continue
		}
		attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: rtPriority}
		if err := unix.SchedSetAttr(tid, attr, 0); err != nil {
			return changed, fmt.Errorf("vCPU %d's thread %d: %w", vcpu, tid, err)
		}
		changed = append(changed, vcpu)
	}
	return changed, nil
}

// qemuOf is the QEMU process the launcher process pid started (its child running qemu-system-*).
func qemuOf(pid int) (int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return 0, err
	}
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // ended meanwhile
		}
		comm, rest, ok := strings.Cut(string(data), ") ")
		fields := strings.Fields(rest)
		if !ok || len(fields) < 2 || fields[1] != strconv.Itoa(pid) || !strings.Contains(comm, "(qemu-system") {
			continue
		}
		return strconv.Atoi(filepath.Base(filepath.Dir(f)))
	}
	return 0, fmt.Errorf("the launcher (process %d) runs no QEMU", pid)
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
