package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/local/supervise"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestComponentRestarts kills qvirt-handler (of every node) and then qvirt-controller with
// SIGKILL while two VMs run: local mode starts them again, no guest restarts (same QEMU, the
// counter goes on), the status stays right, and the restarted controller acts on requests.
func TestComponentRestarts(t *testing.T) {
	ns := namespace(t)
	a, conA := startDemo(t, ns, "keep-a", v1alpha1.RunStrategyManual)
	b, conB := startDemo(t, ns, "keep-b", v1alpha1.RunStrategyManual)
	pidA, pidB := qemuPID(t, a), qemuPID(t, b)

	for i := 1; i <= 2; i++ {
		killComponent(t, "qvirt-handler-"+cluster.NodeName(i))
	}
	for _, g := range []struct {
		vmi *v1alpha1.VirtualMachineInstance
		con *testutil.Console
		pid int
	}{{a, conA, pidA}, {b, conB, pidB}} {
		last := g.con.LastTick()
		g.con.Expect(t, 0, fmt.Sprintf("tick %d\r\n", last+3), 30*time.Second)
		if !alive(g.pid) || qemuPID(t, g.vmi) != g.pid {
			t.Errorf("VMI %s: QEMU %d is gone after the handler restart", g.vmi.Name, g.pid)
		}
		waitVMI(t, ns, g.vmi.Name, 30*time.Second, "Running and Ready, same instance", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v != nil && v.UID == g.vmi.UID && v.Status.Phase == v1alpha1.Running && ready(v)
		})
	}

	killComponent(t, "qvirt-controller")
	request(t, ns, "keep-a", stopReq(a.UID))
	waitVMI(t, ns, "keep-a", 2*time.Minute, "stopped by the restarted controller", gone)
	if v, err := getVMI(t, ns, "keep-b"); err != nil || v.UID != b.UID || v.Status.Phase != v1alpha1.Running || qemuPID(t, v) != pidB {
		t.Errorf("VMI keep-b disturbed by the controller restart: %+v %v", v, err)
	}
	last := conB.LastTick()
	conB.Expect(t, 0, fmt.Sprintf("tick %d\r\n", last+2), 30*time.Second)
}

func ready(v *v1alpha1.VirtualMachineInstance) bool {
	for _, c := range v.Status.Conditions {
		if c.Type == v1alpha1.VirtualMachineInstanceReady {
			return c.Status == "True"
		}
	}
	return false
}

// killComponent sends SIGKILL to a local-mode component, as an operator would (its PID from
// components.json), and waits until the supervisor has it running again.
func killComponent(t *testing.T, name string) {
	t.Helper()
	st := componentState(t, name)
	if st.PID == 0 {
		t.Fatalf("component %s is not running: %+v", name, st)
	}
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %s (%d): %v", name, st.PID, err)
	}
	testutil.Eventually(t, time.Minute, name+" running again", func() bool {
		now := componentState(t, name)
		return now.PID != 0 && now.PID != st.PID && now.Restarts > st.Restarts && now.State == supervise.Running
	})
}

func componentState(t *testing.T, name string) supervise.State {
	t.Helper()
	states, err := supervise.ReadStates(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range states {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no component %s in %s/components.json", name, dir)
	return supervise.State{}
}
