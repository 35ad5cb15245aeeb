package handler_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/qmp"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestTargetLostAtHandover kills the target QEMU right at switch-over: the source's migration has
// completed (the target acknowledged the guest's whole state) and the source's agent has recorded
// the handover, but the target has not run the guest yet (its launcher is frozen meanwhile, so
// its agent cannot have it run). Until the agents decide, the guest runs on neither side. Once the
// target is gone, its agent fails the migration saying why, and the guest runs on at the source
// with its state: no boot, its counter goes on, the instance stays Running and Ready there. A
// second migration afterwards moves the guest, and QEMU's own events show it never ran on both
// sides: the target resumes it only after the source stopped it, and the source never again.
func TestTargetLostAtHandover(t *testing.T) {
	e := newEnv(t)
	// Slow enough that the target launcher is frozen long before the transfer ends.
	e.setConfig("bandwidthPerMigration", "16Mi")
	nodeB := e.addNode()
	const name = "handover"
	v, _, srcCon := e.startGuest(name)
	srcCon.Expect(t, 0, "tick 2\r\n", bootTimeout)
	booted := strings.Count(srcCon.Text(), "QVIRT-GUEST-READY")
	ctx := context.Background()
	srcEvents := watchQMPEvents(t, e.kubelet.dir(v.UID).ShellQMP())

	vmim, _ := e.startMigration(v, name+"-1", nodeB)
	e.waitVMI(name, time.Minute, "target ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		ms := v.Status.MigrationState
		return ms != nil && ms.TargetReady
	})
	dstEvents := watchQMPEvents(t, nodeB.kubelet.dir(v.UID).ShellQMP())
	dstCon := nodeB.console(v)
	dstSt, err := nodeB.launcherClient(v).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The target QEMU goes on receiving the guest; only its launcher, which would run it, stops.
	launcherPID := parentPID(t, dstSt.PID)
	if err := syscall.Kill(launcherPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(launcherPID, syscall.SIGCONT) })

	held := e.waitVMI(name, 2*time.Minute, "handed over by the source", func(v *v1alpha1.VirtualMachineInstance) bool {
		ms := v.Status.MigrationState
		return ms != nil && (ms.SourceHandedOver || ms.Failed || ms.Completed)
	})
	if ms := held.Status.MigrationState; ms.Failed || ms.Completed || ms.HandedOverPaused {
		t.Fatalf("migration state at the handover: %+v", ms)
	}
	srcSt, err := e.launcherClient(v).Status(ctx)
	if err != nil || srcSt.Migration == nil || srcSt.Migration.Handover != protocol.HandoverHolding || srcSt.RunState != "postmigrate" {
		t.Fatalf("the source at the handover: run state %s, migration %+v, %v; want it holding the guest stopped", srcSt.RunState, srcSt.Migration, err)
	}
	last := quietTick(srcCon)
	time.Sleep(2 * time.Second)
	if now := srcCon.LastTick(); now != last || strings.Contains(dstCon.Text(), "tick") {
		t.Fatalf("the guest ran during the handover: source tick %d then %d, target console %q", last, now, dstCon.Text())
	}

	if err := syscall.Kill(dstSt.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := syscall.Kill(launcherPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	got := e.waitVMI(name, 2*time.Minute, "migration failed", func(v *v1alpha1.VirtualMachineInstance) bool {
		ms := v.Status.MigrationState
		return ms != nil && (ms.Failed || ms.Completed)
	})
	if ms := got.Status.MigrationState; ms.Completed || !strings.Contains(ms.FailureReason, "could not take the guest over") ||
		!strings.Contains(ms.FailureReason, "killed") {
		t.Fatalf("migration state %+v: want failed by the target's loss", ms)
	}
	testutil.Eventually(t, time.Minute, "migration "+vmim.Name+" Failed", func() bool {
		_ = e.c.Get(ctx, client.ObjectKeyFromObject(vmim), vmim)
		return vmim.Status.Phase == v1alpha1.MigrationFailed
	})
	if msg := migrationMessage(vmim); !strings.Contains(msg, "could not take the guest over") {
		t.Errorf("migration %s says %q; want the target's loss", vmim.Name, msg)
	}
	srcCon.Expect(t, 0, fmt.Sprintf("tick %d\r\n", last+2), time.Minute)
	t.Logf("the guest counts on at the source %.2fs after the target's QEMU was killed", time.Since(killed).Seconds())
	if n := strings.Count(srcCon.Text(), "QVIRT-GUEST-READY"); n != booted {
		t.Fatalf("the guest booted again on the source:\n%s", srcCon.Text())
	}
	e.waitVMI(name, 30*time.Second, "Running and Ready on "+e.node, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == e.node && v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady) &&
			condition(v, v1alpha1.VirtualMachineInstancePaused) == nil
	})
	e.waitEvent(name, vmisync.EventMigrationReclaimed, "could not take the guest over", 10*time.Second)
	if r := dstEvents.first(qmp.EventResume); !r.IsZero() {
		t.Errorf("the killed target ran the guest at %s", r.Format(time.RFC3339Nano))
	}
	if r := srcEvents.last(qmp.EventResume); r.Before(killed) {
		t.Errorf("the source resumed the guest at %s, not after the target was killed at %s", r.Format(time.RFC3339Nano), killed.Format(time.RFC3339Nano))
	}

	// A second migration hands the guest over: the target runs it only after the source stopped
	// for good.
	vmim2, _ := e.startMigration(e.get(name), name+"-2", nodeB)
	srcEvents.reset()
	e.waitVMI(name, time.Minute, "target ready again", func(v *v1alpha1.VirtualMachineInstance) bool {
		ms := v.Status.MigrationState
		return ms != nil && ms.MigrationUID == vmim2.UID && ms.TargetReady
	})
	dstEvents = watchQMPEvents(t, nodeB.kubelet.dir(v.UID).ShellQMP())
	dstCon = nodeB.console(v)
	e.waitMigrationSucceeded(vmim2)
	moved := e.waitVMI(name, time.Minute, "Running on "+nodeB.node, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == nodeB.node && v.Status.Phase == v1alpha1.Running
	})
	if ms := moved.Status.MigrationState; !ms.SourceHandedOver || !ms.Completed || ms.Failed {
		t.Errorf("migration state after the second migration: %+v", ms)
	}
	stop, resume := srcEvents.last(qmp.EventStop), dstEvents.first(qmp.EventResume)
	if stop.IsZero() || resume.IsZero() || !resume.After(stop) {
		t.Fatalf("source stopped at %v, target resumed at %v: want the target to run the guest only after the source stopped", stop, resume)
	}
	if r := srcEvents.last(qmp.EventResume); r.After(stop) {
		t.Errorf("the source resumed the guest at %s after handing it over at %s", r.Format(time.RFC3339Nano), stop.Format(time.RFC3339Nano))
	}
	t.Logf("guest pause through the node agents: %.1f ms (QEMU's downtime %d ms)", float64(resume.Sub(stop).Microseconds())/1000, ptrOr(moved.Status.MigrationState.DowntimeMilliseconds))
	last = srcCon.LastTick()
	dstCon.Expect(t, 0, fmt.Sprintf("tick %d\r\n", last+2), 30*time.Second)
	if strings.Contains(dstCon.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
}

// qmpEvents records the host times of a QEMU's STOP and RESUME events (QMP timestamps), read on
// its operator monitor.
type qmpEvents struct {
	mu  sync.Mutex
	log []qmpEvent
}

type qmpEvent struct {
	name string
	at   time.Time
}

func watchQMPEvents(t *testing.T, socket string) *qmpEvents {
	t.Helper()
	var mon *qmp.Monitor
	testutil.Eventually(t, 10*time.Second, "QMP at "+socket, func() bool {
		var err error
		mon, err = qmp.Dial(context.Background(), socket)
		return err == nil
	})
	t.Cleanup(func() { _ = mon.Close() })
	r := &qmpEvents{}
	sub := mon.Subscribe(64)
	go func() {
		for ev := range sub.Events() {
			if ev.Event != qmp.EventStop && ev.Event != qmp.EventResume {
				continue
			}
			r.mu.Lock()
			r.log = append(r.log, qmpEvent{ev.Event, time.Unix(ev.Timestamp.Seconds, ev.Timestamp.Microseconds*1000)})
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *qmpEvents) first(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.log {
		if e.name == name {
			return e.at
		}
	}
	return time.Time{}
}

func (r *qmpEvents) last(name string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.log) - 1; i >= 0; i-- {
		if r.log[i].name == name {
			return r.log[i].at
		}
	}
	return time.Time{}
}

func (r *qmpEvents) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = nil
}

// parentPID is the parent of process pid (a QEMU's launcher).
func parentPID(t *testing.T, pid int) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			ppid, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return ppid
		}
	}
	t.Fatalf("no PPid in /proc/%d/status", pid)
	return 0
}

// quietTick waits until the console has been quiet for a second (a line in flight may still
// arrive after the vCPUs stopped) and returns the last tick.
func quietTick(c *testutil.Console) int {
	for n, quietSince := len(c.Text()), time.Now(); time.Since(quietSince) < time.Second; time.Sleep(100 * time.Millisecond) {
		if m := len(c.Text()); m != n {
			n, quietSince = m, time.Now()
		}
	}
	return c.LastTick()
}

func ptrOr(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}
