package qmp

import (
	"context"
	"errors"

	gqmp "github.com/digitalocean/go-qemu/qmp"
)

// RunState is QEMU's run state as query-status reports it.
type RunState string

// Run states of QEMU 7.2.
const (
	StateDebug         RunState = "debug"
	StateInMigrate     RunState = "inmigrate"
	StateInternalError RunState = "internal-error"
	StateIOError       RunState = "io-error"
	StatePaused        RunState = "paused"
	StatePostMigrate   RunState = "postmigrate"
	StatePrelaunch     RunState = "prelaunch"
	StateFinishMigrate RunState = "finish-migrate"
	StateRestoreVM     RunState = "restore-vm"
	StateRunning       RunState = "running"
	StateSaveVM        RunState = "save-vm"
	StateShutdown      RunState = "shutdown"
	StateSuspended     RunState = "suspended"
	StateWatchdog      RunState = "watchdog"
	StateGuestPanicked RunState = "guest-panicked"
	StateColo          RunState = "colo"
)

// StatusInfo is query-status's reply. (QEMU 7.2 also sends "singlestep",
// deprecated in 8.1; it is not kept.)
type StatusInfo struct {
	Running bool     `json:"running"`
	Status  RunState `json:"status"`
}

// QueryStatus reports whether the vCPUs run and QEMU's run state.
func (m *Monitor) QueryStatus(ctx context.Context) (StatusInfo, error) {
	var s StatusInfo
	err := m.Call(ctx, "query-status", nil, &s)
	return s, err
}

// QueryVersion asks QEMU for its version; the greeting's copy is Version.
func (m *Monitor) QueryVersion(ctx context.Context) (gqmp.Version, error) {
	var v gqmp.Version
	err := m.Call(ctx, "query-version", nil, &v)
	return v, err
}

// Cont starts or resumes the vCPUs; QEMU emits RESUME.
func (m *Monitor) Cont(ctx context.Context) error {
	return m.Call(ctx, "cont", nil, nil)
}

// Stop pauses the vCPUs; QEMU emits STOP.
func (m *Monitor) Stop(ctx context.Context) error {
	return m.Call(ctx, "stop", nil, nil)
}

// SystemPowerdown presses the ACPI power button. It returns once QEMU
// injected the request (POWERDOWN); the guest may take its time or ignore
// it, and SHUTDOWN follows only if it complies.
func (m *Monitor) SystemPowerdown(ctx context.Context) error {
	return m.Call(ctx, "system_powerdown", nil, nil)
}

// SystemReset resets the machine; QEMU emits RESET.
func (m *Monitor) SystemReset(ctx context.Context) error {
	return m.Call(ctx, "system_reset", nil, nil)
}

// Quit makes QEMU exit at once, without guest shutdown. QEMU 7.2 emits
// SHUTDOWN (reason "host-qmp-quit") before the reply and then closes the
// socket; a connection lost before the reply arrives also counts as
// success, since that is what quit asked for.
func (m *Monitor) Quit(ctx context.Context) error {
	err := m.Call(ctx, "quit", nil, nil)
	if errors.Is(err, ErrDisconnected) {
		return nil
	}
	return err
}

// HumanMonitorCommand runs an HMP command line and returns its output. It
// is for diagnostics: HMP's output is not a stable interface.
func (m *Monitor) HumanMonitorCommand(ctx context.Context, cmdline string) (string, error) {
	args := struct {
		CommandLine string `json:"command-line"`
	}{cmdline}
	var out string
	err := m.Call(ctx, "human-monitor-command", args, &out)
	return out, err
}

// ChardevInfo is one character device in query-chardev's reply.
type ChardevInfo struct {
	Label    string `json:"label"`
	Filename string `json:"filename"`
	// FrontendOpen is whether the device in front of it has it open; for a virtio-serial port's
	// chardev, whether the guest has the port open (VSERPORT_CHANGE reports each change).
	FrontendOpen bool `json:"frontend-open"`
}

// QueryChardevs lists QEMU's character devices.
func (m *Monitor) QueryChardevs(ctx context.Context) ([]ChardevInfo, error) {
	var out []ChardevInfo
	err := m.Call(ctx, "query-chardev", nil, &out)
	return out, err
}
