package launcher

import (
	"context"
	"errors"
	"testing"

	"github.com/qvirt/qvirt/launcher/protocol"
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
