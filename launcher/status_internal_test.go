package launcher

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/qmp"
)

// Status is read right after Shutdown or Wait returns, before the goroutine that follows QEMU has
// recorded the exit: the phase must already agree with the exit it reports (CI saw "phase after
// shutdown Running, want Succeeded").
func TestStatusPhaseAgreesWithTheExit(t *testing.T) {
	self, err := os.FindProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		exit protocol.Exit
		want protocol.Phase
	}{
		{protocol.Exit{Reason: protocol.ExitGuestShutdown}, protocol.PhaseSucceeded},
		{protocol.Exit{Reason: protocol.ExitCrashed}, protocol.PhaseFailed},
	} {
		p := &Process{machine: &Machine{}, cmd: &exec.Cmd{Process: self}, state: qmp.StateShutdown,
			done: make(chan struct{}), exited: make(chan struct{}), changed: make(chan struct{})}
		exit := tc.exit
		p.exit = &exit
		close(p.exited)
		close(p.done)
		for _, recorded := range []protocol.Phase{protocol.PhaseRunning, protocol.PhaseIncoming} {
			l := New(t.TempDir(), nil, Options{})
			l.proc, l.phase = p, recorded // follow has not run yet
			st, _ := l.Status(context.Background())
			if st.Phase != tc.want {
				t.Errorf("exit %q of a guest %s: phase %s, want %s", tc.exit.Reason, recorded, st.Phase, tc.want)
			}
			// A migration target passes its probes while it waits for the guest; one whose QEMU
			// has exited waits for nothing.
			if _, err := l.GuestPing(context.Background()); err == nil {
				t.Errorf("exit %q of a guest %s: the guest-agent ping passes", tc.exit.Reason, recorded)
			}
		}
	}
}
