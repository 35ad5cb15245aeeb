package launcher_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// spec.startStrategy Paused (`qvirtctl start --paused`): QEMU starts and the launcher reports the
// guest paused, but not one byte reaches the serial console until it is resumed. A live migration
// keeps it that way (the target does not start it); resumed on the target, it boots.
func TestStartPaused(t *testing.T) {
	t.Parallel()
	src := newLauncher(t)
	ctx := context.Background()
	req := guestSpec(t)
	req.Machine.StartPaused = true
	st, err := src.client.Sync(ctx, req)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if st.Phase != protocol.PhaseRunning || !st.Paused || st.RunState != "prelaunch" {
		t.Fatalf("after a paused start: phase %s paused=%v runState=%s, want Running, paused, prelaunch", st.Phase, st.Paused, st.RunState)
	}
	srcConsole := attach(t, src.runDir)
	expectConflict(t, "soft reboot of a guest started paused", src.client.SoftReboot(ctx), "unpause it first")
	expectConflict(t, "pause of a guest started paused", src.client.Pause(ctx), "nothing to pause")

	dst := newLauncher(t)
	target := *req
	target.Incoming = true
	if st, err := dst.client.Sync(ctx, &target); err != nil || st.Phase != protocol.PhaseIncoming {
		t.Fatalf("sync target: %v (phase %s)", err, st.Phase)
	}
	dstConsole := attach(t, dst.runDir)
	migrate(t, src, dst, srcConsole)
	waitFor(t, 2*time.Minute, "the source to exit as migrated", func() bool {
		st, err := src.client.Status(ctx)
		return err == nil && st.Exit != nil
	})
	if st, _ := src.client.Status(ctx); st.Exit.Reason != protocol.ExitMigrated {
		t.Fatalf("source ended %+v, want migrated", st.Exit)
	}
	waitFor(t, 30*time.Second, "the target to report the migrated guest", func() bool {
		st, err := dst.client.Status(ctx)
		return err == nil && st.Phase == protocol.PhaseRunning
	})
	if st, _ := dst.client.Status(ctx); !st.Paused || st.RunState != "prelaunch" {
		t.Fatalf("the target after the migration: paused=%v runState=%s, want still paused in prelaunch", st.Paused, st.RunState)
	}
	time.Sleep(2 * time.Second)
	if out := srcConsole.Text() + dstConsole.Text(); out != "" {
		t.Fatalf("a guest started paused wrote to its console before it was resumed: %q", out)
	}

	if err := dst.client.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if st, _ := dst.client.Status(ctx); st.Paused || st.RunState != "running" {
		t.Fatalf("after resume: paused=%v runState=%s, want running", st.Paused, st.RunState)
	}
	expectConflict(t, "a second resume", dst.client.Resume(ctx), "not paused")
	dstConsole.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
}

// expectConflict checks that err is the launcher's 409 and says want.
func expectConflict(t *testing.T, what string, err error, want string) {
	t.Helper()
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusConflict || !strings.Contains(apiErr.Msg, want) {
		t.Errorf("%s: %v, want a 409 saying %q", what, err, want)
	}
}
