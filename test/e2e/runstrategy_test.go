package e2e

import (
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// TestStopStartRestart: stop, start and restart through status.stateChangeRequests on a Manual
// VM; each start is a fresh boot, a stop leaves no instance.
func TestStopStartRestart(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "ssr"
	vmi, _ := startDemo(t, ns, name, v1alpha1.RunStrategyManual)
	if vmi == nil {
		return
	}

	request(t, ns, name, stopReq(vmi.UID))
	waitVMI(t, ns, name, 2*time.Minute, "gone after the stop", gone)
	stays(t, ns, name, 3*time.Second, "stopped", gone)

	request(t, ns, name, startReq)
	started := waitVMI(t, ns, name, bootTimeout, "Running after the start", running(vmi.UID))
	console(t, started).Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

	request(t, ns, name, stopReq(started.UID), startReq)
	restarted := waitVMI(t, ns, name, bootTimeout, "Running after the restart", running(started.UID))
	console(t, restarted).Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
}

// TestRunStrategies: Always restarts a guest that powered itself off; Halted keeps the VM off;
// RerunOnFailure restarts after QEMU is killed but not after a guest poweroff.
func TestRunStrategies(t *testing.T) {
	t.Parallel()
	ns := namespace(t)

	t.Run("Always restarts a guest that powered off", func(t *testing.T) {
		const name = "always"
		vmi, con := startDemo(t, ns, name, v1alpha1.RunStrategyAlways)
		con.Send(t, "poweroff -f")
		next := waitVMI(t, ns, name, bootTimeout, "Running again as a new instance", running(vmi.UID))
		console(t, next).Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	})

	t.Run("Halted keeps it off", func(t *testing.T) {
		const name = "halted"
		applyVM(t, demoVM(t, ns, name, v1alpha1.RunStrategyHalted))
		request(t, ns, name, startReq)
		stays(t, ns, name, 10*time.Second, "without an instance", gone)
	})

	t.Run("Manual: a VMI whose QEMU was killed says what ended it", func(t *testing.T) {
		const name = "killed"
		vmi, _ := startDemo(t, ns, name, v1alpha1.RunStrategyManual)
		pid := qemuPID(t, vmi)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 QEMU %d: %v", pid, err)
		}
		ended := waitVMI(t, ns, name, time.Minute, "Failed after kill -9 of QEMU", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v != nil && v.UID == vmi.UID && v.Status.Phase == v1alpha1.Failed
		})
		if ended.Status.Reason != "Killed" {
			t.Errorf("status.reason = %q, want Killed (QEMU ended by a signal)", ended.Status.Reason)
		}
	})

	t.Run("RerunOnFailure restarts after a crash, not after a poweroff", func(t *testing.T) {
		const name = "rerun"
		vmi, _ := startDemo(t, ns, name, v1alpha1.RunStrategyRerunOnFailure)
		pid := qemuPID(t, vmi)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 QEMU %d: %v", pid, err)
		}
		next := waitVMI(t, ns, name, bootTimeout, "Running again after kill -9 of QEMU", running(vmi.UID))
		con := console(t, next)
		con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

		con.Send(t, "poweroff -f")
		ended := waitVMI(t, ns, name, time.Minute, "Succeeded after the guest's poweroff", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v != nil && v.UID == next.UID && v.Status.Phase == v1alpha1.Succeeded
		})
		stays(t, ns, name, 10*time.Second, "ended, not restarted", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v != nil && v.UID == ended.UID && v.Status.Phase == v1alpha1.Succeeded
		})
	})
}
