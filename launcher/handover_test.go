package launcher_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// TestTargetKilledDuringHandoverKeepsTheGuestOnTheSource kills the target QEMU at switch-over: it
// has loaded the guest's whole state, the source's migration has completed, and both hold the
// guest paused, waiting for the node agents' word. Neither side runs the guest meanwhile (its
// counter stops on the source and never starts on the target), and nothing but that word moves it:
// pause, unpause and cancel are refused. Told that the target failed, the source takes the guest
// back: it runs on with its state (the counter goes on, no boot) and the migration is failed
// saying why.
func TestTargetKilledDuringHandoverKeepsTheGuestOnTheSource(t *testing.T) {
	t.Parallel()
	src, srcConsole := boot(t)
	ctx := context.Background()
	dst := countingTarget(t, src, srcConsole)
	dstConsole := attach(t, dst.runDir)
	booted := strings.Count(srcConsole.Text(), "QVIRT-GUEST-READY")
	sendGuest(t, src, dst, srcConsole)
	srcSt, dstSt := waitHolding(t, src, dst)
	if srcSt.RunState != "postmigrate" || dstSt.RunState != "paused" || srcSt.Migration.GuestPaused {
		t.Fatalf("holding the guest: source %s (guestPaused %v), target %s; want postmigrate, running before, and paused",
			srcSt.RunState, srcSt.Migration.GuestPaused, dstSt.RunState)
	}
	last := quietTick(srcConsole)
	time.Sleep(2 * time.Second)
	if now := srcConsole.LastTick(); now != last {
		t.Fatalf("the guest kept counting on the source during the handover: tick %d then %d", last, now)
	}
	if strings.Contains(dstConsole.Text(), "tick") {
		t.Fatalf("the guest ran on the target before it was handed over: %q", dstConsole.Text())
	}
	expectConflict(t, "unpause of the held source", src.client.Resume(ctx), "migration")
	expectConflict(t, "pause of the held source", src.client.Pause(ctx), "migration")
	expectConflict(t, "cancel of a handed-over migration", src.client.CancelMigration(ctx), "too late")
	expectConflict(t, "unpause of the held target", dst.client.Resume(ctx), "migration")
	expectConflict(t, "finish asked of the target", dst.client.FinishMigration(ctx), "source")

	if err := syscall.Kill(dstSt.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the target QEMU to be gone", func() bool {
		dstSt, _ = dst.client.Status(ctx)
		return dstSt.Exit != nil
	})
	if dstSt.Migration == nil || dstSt.Migration.Handover != protocol.HandoverHolding {
		t.Fatalf("the dead target reports %+v; want a guest it held and never ran", dstSt.Migration)
	}
	if _, err := dst.client.RunMigrated(ctx, protocol.MigrationRun{}); err == nil {
		t.Fatal("a dead target accepted to run the guest")
	}
	if st, _ := src.client.Status(ctx); st.Exit != nil || st.RunState != "postmigrate" {
		t.Fatalf("the source did not keep holding the guest on its own: exit %+v, run state %s", st.Exit, st.RunState)
	}

	st, err := src.client.ReclaimMigration(ctx, "its QEMU was killed")
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != protocol.PhaseRunning || st.RunState != "running" || st.Exit != nil || st.Migration == nil ||
		st.Migration.Status != "failed" || st.Migration.Handover != protocol.HandoverReclaimed ||
		!strings.Contains(st.Migration.Error, "its QEMU was killed") {
		t.Fatalf("the source after taking the guest back: phase %s, run state %s, exit %+v, migration %+v", st.Phase, st.RunState, st.Exit, st.Migration)
	}
	waitFor(t, time.Minute, "the counter to go on on the source", func() bool { return srcConsole.LastTick() > last+1 })
	if n := strings.Count(srcConsole.Text(), "QVIRT-GUEST-READY"); n != booted {
		t.Fatalf("the guest booted again on the source:\n%s", srcConsole.Text())
	}
	if _, err := src.client.ReclaimMigration(ctx, "again"); err != nil {
		t.Errorf("a repeated reclaim: %v", err)
	}
	// The migration is over: the guest is the source's like any other.
	if err := src.client.Pause(ctx); err != nil {
		t.Errorf("pause after the failed migration: %v", err)
	}
	if err := src.client.Resume(ctx); err != nil {
		t.Errorf("unpause after the failed migration: %v", err)
	}
	if strings.Contains(dstConsole.Text(), "tick") {
		t.Errorf("the guest ran on the target: %q", dstConsole.Text())
	}
}

// TestHandoverRefusals: the handover's commands need a launcher that holds a handed-over guest in
// the matching role, and a reclaim says why.
func TestHandoverRefusals(t *testing.T) {
	v := newLauncher(t)
	ctx := context.Background()
	_, err := v.client.ReclaimMigration(ctx, " ")
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || apiErr.Field != "reason" {
		t.Errorf("reclaim without a reason: %v, want a 400 naming reason", err)
	}
	_, err = v.client.RunMigrated(ctx, protocol.MigrationRun{})
	expectConflict(t, "run without a guest", err, "no QEMU")
	expectConflict(t, "finish without a guest", v.client.FinishMigration(ctx), "no QEMU")
	if _, err := v.client.Sync(ctx, guestSpec(t)); err != nil {
		t.Fatal(err)
	}
	_, err = v.client.RunMigrated(ctx, protocol.MigrationRun{})
	expectConflict(t, "run on a launcher that never migrated", err, "no migration has handed a guest over")
	_, err = v.client.ReclaimMigration(ctx, "the target failed")
	expectConflict(t, "reclaim on a launcher that never migrated", err, "no migration has handed a guest over")
	expectConflict(t, "finish on a launcher that never migrated", v.client.FinishMigration(ctx), "no migration has handed a guest over")
}

// waitHolding waits until both sides hold the guest QEMU moved, and returns their statuses.
func waitHolding(t *testing.T, src, dst *vm) (srcSt, dstSt protocol.Status) {
	t.Helper()
	ctx := context.Background()
	holds := func(st protocol.Status, err error) bool {
		return err == nil && st.Migration != nil && st.Migration.Handover == protocol.HandoverHolding
	}
	waitFor(t, 2*time.Minute, "both sides to hold the guest", func() bool {
		var srcErr, dstErr error
		srcSt, srcErr = src.client.Status(ctx)
		dstSt, dstErr = dst.client.Status(ctx)
		if srcErr == nil && srcSt.Migration != nil && srcSt.Migration.Status == "failed" {
			t.Fatalf("the migration failed: %s", srcSt.Migration.Error)
		}
		return holds(srcSt, srcErr) && holds(dstSt, dstErr)
	})
	return srcSt, dstSt
}

// handOver plays the node agents' part once QEMU has moved the guest: both sides hold it and
// neither runs it; the target takes it over (paused if it was paused on the source) while the
// source still holds it, stopped; then the source quits as migrated.
func handOver(t *testing.T, src, dst *vm) {
	t.Helper()
	ctx := context.Background()
	srcSt, dstSt := waitHolding(t, src, dst)
	if srcSt.RunState == "running" || dstSt.RunState == "running" {
		t.Fatalf("the guest runs during the handover: source %s, target %s", srcSt.RunState, dstSt.RunState)
	}
	paused := srcSt.Migration.GuestPaused
	dstSt, err := dst.client.RunMigrated(ctx, protocol.MigrationRun{Paused: paused})
	if err != nil {
		t.Fatalf("run the guest on the target: %v", err)
	}
	if dstSt.Phase != protocol.PhaseRunning || dstSt.Migration.Handover != protocol.HandoverDone || (dstSt.RunState == "running") == paused {
		t.Fatalf("the target after taking the guest over: phase %s, run state %s, migration %+v (guest paused on the source: %v)",
			dstSt.Phase, dstSt.RunState, dstSt.Migration, paused)
	}
	if st, err := src.client.Status(ctx); err != nil || st.Exit != nil || st.RunState != "postmigrate" {
		t.Fatalf("the source while the target takes over: run state %s, exit %+v, %v; want it holding the guest stopped", st.RunState, st.Exit, err)
	}
	if err := src.client.FinishMigration(ctx); err != nil {
		t.Fatalf("finish the source: %v", err)
	}
	waitFor(t, 30*time.Second, "the source to exit as migrated", func() bool {
		st, err := src.client.Status(ctx)
		return err == nil && st.Exit != nil
	})
	if st, _ := src.client.Status(ctx); st.Exit.Reason != protocol.ExitMigrated {
		t.Fatalf("the source ended %+v, want migrated", st.Exit)
	}
}

// quietTick waits until the console has been quiet for a second (a line in flight may still
// arrive after the vCPUs stopped) and returns the last tick.
func quietTick(c *console) int {
	for n, quietSince := len(c.Text()), time.Now(); time.Since(quietSince) < time.Second; time.Sleep(100 * time.Millisecond) {
		if m := len(c.Text()); m != n {
			n, quietSince = m, time.Now()
		}
	}
	return c.LastTick()
}
