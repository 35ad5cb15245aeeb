package launcher_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
)

// spec.startStrategy Paused (`qvirtctl start --paused`): QEMU starts and the launcher reports the
// guest paused, but not one byte reaches the serial console until it is resumed; then it boots.
func TestStartPaused(t *testing.T) {
	v := newLauncher(t)
	ctx := context.Background()
	req := guestSpec(t)
	paused := v1alpha1.StartStrategyPaused
	req.Spec.StartStrategy = &paused
	st, err := v.client.Sync(ctx, req)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if st.Phase != launcher.PhaseRunning || !st.Paused || st.RunState != "prelaunch" {
		t.Fatalf("after a paused start: phase %s paused=%v runState=%s, want Running, paused, prelaunch", st.Phase, st.Paused, st.RunState)
	}
	c := attach(t, v.runDir)
	time.Sleep(3 * time.Second)
	if out := c.Text(); out != "" {
		t.Fatalf("a guest started paused wrote to its console: %q", out)
	}
	var apiErr *launcher.APIError
	if err := v.client.SoftReboot(ctx); !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict {
		t.Errorf("soft reboot of a guest started paused: %v, want a 409", err)
	}
	if err := v.client.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if st, _ := v.client.Status(ctx); st.Paused || st.RunState != "running" {
		t.Fatalf("after resume: paused=%v runState=%s, want running", st.Paused, st.RunState)
	}
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
}
