package launcher

import (
	"context"
	"fmt"
	"os"

	"github.com/qvirt/qvirt/machine"

	"github.com/qvirt/qvirt/qmp"
)

// graphicsPath is the machine field that decides whether the VM has a display.
const graphicsPath = machinePath + ".graphics"

// pausedRefusal is the refusal of a soft reboot while the vCPUs are stopped: the keys would wait in
// the keyboard controller and reboot the guest at some later unpause, which nobody expects.
const pausedRefusal = "VMI is paused; unpause it first"

// SoftReboot asks the guest to reboot itself by pressing Ctrl+Alt+Del on its keyboard; there is no
// guest agent. Linux hands the keys to init (busybox and systemd reboot cleanly), so the guest
// syncs and restarts its own way; it returns once the keys are sent, not when the guest is back.
// Until the guest's init has claimed the keys (busybox init and systemd do so at start), the
// Linux kernel's default is an immediate restart, without a clean shutdown.
// QEMU runs without -no-reboot, so the guest's reset is a RESET event and QEMU, the launcher's
// phase and the run state stay as they are.
func (l *Launcher) SoftReboot(ctx context.Context) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	// Ask QEMU rather than the event-tracked state: a pause from the operator QMP shell may not
	// have been seen yet.
	st, err := p.Monitor().QueryStatus(ctx)
	if err != nil {
		return fmt.Errorf("soft reboot: %w", err)
	}
	switch st.Status {
	case qmp.StateRunning:
	case qmp.StatePaused, qmp.StatePrelaunch:
		return &ConflictError{Msg: pausedRefusal}
	default:
		return &ConflictError{Msg: fmt.Sprintf("the guest is not running (QEMU run state %q): nothing to reboot", st.Status)}
	}
	if err := p.Monitor().SendKey(ctx, "ctrl", "alt", "delete"); err != nil {
		return fmt.Errorf("soft reboot: send Ctrl+Alt+Del: %w", err)
	}
	l.opts.Log.Info("soft reboot: Ctrl+Alt+Del sent to the guest")
	return nil
}

// Screenshot captures the guest's display as a PNG. QEMU writes it (screendump, format png) to a
// new file in the VMI's run directory, which only QEMU's and the launcher's user can reach; the
// file is already unlinked when it is returned, so the caller only reads and closes it. A VM
// without a graphics device is refused with a *field.Error naming
// machine.graphics. A paused guest's last picture is still there.
func (l *Launcher) Screenshot(ctx context.Context) (*os.File, error) {
	p, err := l.process()
	if err != nil {
		return nil, err
	}
	m := p.Machine()
	if !m.Graphics {
		return nil, machine.Invalid(graphicsPath, false, "the VMI has no graphics device, so there is no screen to capture")
	}
	tmp, err := os.CreateTemp(m.RunDir, "screenshot-*.png")
	if err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	name := tmp.Name()
	_ = tmp.Close()
	defer os.Remove(name)
	if err := p.Monitor().Screendump(ctx, name, qmp.ScreendumpPNG); err != nil {
		return nil, fmt.Errorf("screenshot: %w", err)
	}
	// Open before the deferred remove: the open file outlives its name.
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("screenshot: read QEMU's %s: %w", name, err)
	}
	return f, nil
}
