package launcher

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// TestGuestPingOutsideTheGuest: without a connected agent the ping (a guestAgentPing probe) fails
// with ErrAgentNotConnected, except on a migration target waiting for the guest, where it passes so
// that a liveness probe does not have the kubelet kill the target mid-migration.
func TestGuestPingOutsideTheGuest(t *testing.T) {
	for phase, wantErr := range map[protocol.Phase]error{
		protocol.PhaseRunning:  ErrAgentNotConnected,
		protocol.PhaseWaiting:  ErrAgentNotConnected,
		protocol.PhaseIncoming: nil,
	} {
		l := &Launcher{phase: phase}
		if _, err := l.GuestPing(context.Background()); !errors.Is(err, wantErr) || (wantErr == nil) != (err == nil) {
			t.Errorf("phase %s: GuestPing = %v, want %v", phase, err, wantErr)
		}
	}
}

// TestGuestExecProbeOutsideTheGuest: an exec probe without a connected agent fails with
// ErrAgentNotConnected, except on a migration target waiting for the guest, where it passes
// without running anything, as the ping does; a request without a command or timeout is refused
// naming the field.
func TestGuestExecProbeOutsideTheGuest(t *testing.T) {
	req := protocol.GuestExecProbe{Command: []string{"true"}, TimeoutSeconds: 1}
	for phase, wantErr := range map[protocol.Phase]error{
		protocol.PhaseRunning:  ErrAgentNotConnected,
		protocol.PhaseWaiting:  ErrAgentNotConnected,
		protocol.PhaseIncoming: nil,
	} {
		l := &Launcher{phase: phase}
		res, err := l.GuestExecProbe(context.Background(), req)
		if !errors.Is(err, wantErr) || (wantErr == nil) != (err == nil) || (err == nil && res.Skipped == "") {
			t.Errorf("phase %s: GuestExecProbe = %+v, %v, want %v", phase, res, err, wantErr)
		}
	}
	for field, bad := range map[string]protocol.GuestExecProbe{
		"command":        {TimeoutSeconds: 1},
		"timeoutSeconds": {Command: []string{"true"}},
	} {
		l := &Launcher{phase: protocol.PhaseIncoming}
		_, err := l.GuestExecProbe(context.Background(), bad)
		var fe *machine.FieldError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), field) {
			t.Errorf("request %+v: %v, want a field error naming %s", bad, err, field)
		}
	}
}

// TestSIGTERMMarksTerminated: when the launcher's process is told to stop (its context ends, as
// on SIGTERM) while it runs a guest, its status says so before it stops the guest, so that the
// node agent can tell a kubelet's stop (a failed liveness probe) from the guest's own poweroff.
func TestSIGTERMMarksTerminated(t *testing.T) {
	l := &Launcher{phase: protocol.PhaseStarting, changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _ = waitForEnd(ctx, l, make(chan error), nil) // no QEMU here: the shutdown itself fails
	if st, _ := l.Status(context.Background()); !st.Terminated {
		t.Errorf("status after the stop: %+v, want Terminated", st)
	}
	waiting := &Launcher{phase: protocol.PhaseWaiting, changed: make(chan struct{})}
	if exit, err := waitForEnd(ctx, waiting, make(chan error), nil); exit != nil || err != nil {
		t.Errorf("stop before any Sync: %v, %v", exit, err)
	}
	if st, _ := waiting.Status(context.Background()); st.Terminated {
		t.Error("a launcher without a guest marked Terminated")
	}
}
