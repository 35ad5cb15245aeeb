package launcher_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// memoryOnlySpec is the test guest without its emptyDisk: a migration with no local disk to copy.
func memoryOnlySpec(t *testing.T) *protocol.SyncRequest {
	req := guestSpec(t)
	req.Machine.Disks = slices.DeleteFunc(req.Machine.Disks, func(d machine.Disk) bool { return d.Source.Empty != nil })
	return req
}

// postCopyPair boots a memory-only guest with its counter running and a target launcher waiting
// for it, prepared for post-copy, and starts a migration over a link far too slow for pre-copy
// (4 MiB/s) that may switch to post-copy after a second.
func postCopyPair(t *testing.T) (src, dst *vm, srcConsole, dstConsole *console, beforeSwitch int) {
	t.Helper()
	return postCopyPairOver(t, 0, func(uri string) string { return uri })
}

// postCopyPairOver is postCopyPair with each side waiting recovery for a broken link to be
// mended, the source sending to link(the target's URI).
func postCopyPairOver(t *testing.T, recovery time.Duration, link func(uri string) string) (src, dst *vm, srcConsole, dstConsole *console, beforeSwitch int) {
	t.Helper()
	ctx := context.Background()
	src, srcConsole = bootGuest(t, memoryOnlySpec(t))
	srcConsole.Send(t, "tick 100000 &")
	srcConsole.Expect(t, 0, "tick 3", time.Minute)
	st, err := src.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dst = newLauncher(t)
	req := memoryOnlySpec(t)
	req.Machine.UID, req.Machine.UUID, req.Incoming = st.UID, st.UID, true
	if st, err := dst.client.Sync(ctx, req); err != nil || st.Phase != protocol.PhaseIncoming {
		t.Fatalf("sync target: %v (phase %s)", err, st.Phase)
	}
	dstConsole = attach(t, dst.runDir)
	uri, err := dst.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0", PostCopy: true, PostCopyRecovery: recovery})
	if err != nil {
		t.Fatal(err)
	}
	beforeSwitch = srcConsole.LastTick()
	err = src.client.MigrateSource(ctx, protocol.MigrationSource{URI: link(uri), BandwidthBytesPerSecond: 4 << 20, PostCopy: true,
		PostCopyAfter: time.Second, PostCopyRecovery: recovery})
	if err != nil {
		t.Fatal(err)
	}
	return src, dst, srcConsole, dstConsole, beforeSwitch
}

// TestPostCopyMigrationRunsTheGuestOnTheTarget: a migration that cannot converge (the link carries
// 4 MiB/s) switches to post-copy after its second: QEMU reports postcopy-active, the target runs
// the guest at once (its counter goes on from where it was, no boot), the source can neither
// cancel nor take the guest back, and once all pages are over the source quits as migrated.
func TestPostCopyMigrationRunsTheGuestOnTheTarget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, dst, srcConsole, dstConsole, beforeSwitch := postCopyPair(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the source's console: %q\nthe target's console: %q", srcConsole.Text(), dstConsole.Text())
		}
	})
	var dstSt protocol.Status
	waitFor(t, 2*time.Minute, "the target to take the guest over in post-copy", func() bool {
		var err error
		dstSt, err = dst.client.Status(ctx)
		return err == nil && dstSt.Migration != nil && dstSt.Migration.PostCopy
	})
	if dstSt.Migration.Handover != protocol.HandoverDone {
		t.Fatalf("the target in post-copy: migration %+v, want its handover done", dstSt.Migration)
	}
	waitFor(t, time.Minute, "the counter to go on on the target", func() bool { return dstConsole.LastTick() > beforeSwitch+1 })
	if strings.Contains(dstConsole.Text(), "QVIRT-GUEST-READY") {
		t.Fatalf("the guest booted on the target:\n%s", dstConsole.Text())
	}
	var srcSt protocol.Status
	waitFor(t, 4*time.Minute, "the source's migration to complete", func() bool {
		var err error
		srcSt, err = src.client.Status(ctx)
		return err == nil && srcSt.Migration != nil && srcSt.Migration.Status == "completed"
	})
	// The refusals hold from the switch on, before the source records its handover as well.
	if !srcSt.Migration.PostCopy || srcSt.RunState == "running" {
		t.Fatalf("the source after the migration: run state %s, migration %+v; want it stopped, in post-copy", srcSt.RunState, srcSt.Migration)
	}
	if err := src.client.CancelMigration(ctx); err == nil {
		t.Error("the source cancelled a migration past its post-copy switch")
	}
	if _, err := src.client.ReclaimMigration(ctx, "a test"); err == nil || !strings.Contains(err.Error(), "post-copy") {
		t.Errorf("the source took back a guest that ran on the target: %v", err)
	}
	// The node agents' usual end: the target's agent finds the guest taken, the source quits.
	if _, err := dst.client.RunMigrated(ctx, protocol.MigrationRun{}); err != nil {
		t.Fatalf("run the migrated guest (a no-op after post-copy): %v", err)
	}
	waitSourceHolding(t, src, time.Minute)
	if err := src.client.FinishMigration(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the source to exit as migrated", func() bool {
		st, err := src.client.Status(ctx)
		return err == nil && st.Exit != nil && st.Exit.Reason == protocol.ExitMigrated
	})
	last := dstConsole.LastTick()
	waitFor(t, time.Minute, "the counter to go on after the source quit", func() bool { return dstConsole.LastTick() > last+1 })
	t.Logf("tick %d before the switch, %d on the target; downtime %d ms, total %d ms", beforeSwitch, dstConsole.LastTick(),
		srcSt.Migration.DowntimeMs, srcSt.Migration.TotalTimeMs)
}

// TestPostCopyFailureEndsBothSides: in post-copy the source refuses to cancel; then the source
// dies, and the target's guest is missing pages it can never get: the target ends its QEMU,
// saying why, rather than leave a guest that hangs on its next touch of a missing page.
func TestPostCopyFailureEndsBothSides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, dst, _, _, _ := postCopyPair(t)
	waitFor(t, 2*time.Minute, "the target to take the guest over in post-copy", func() bool {
		st, err := dst.client.Status(ctx)
		return err == nil && st.Migration != nil && st.Migration.PostCopy
	})
	// At 4 MiB/s the post-copy takes tens of seconds: it is under way.
	var srcSt protocol.Status
	waitFor(t, 30*time.Second, "the source to report post-copy", func() bool {
		var err error
		srcSt, err = src.client.Status(ctx)
		return err == nil && srcSt.Migration != nil && srcSt.Migration.Status == "postcopy-active"
	})
	if err := src.client.CancelMigration(ctx); err == nil || !strings.Contains(err.Error(), "post-copy") {
		t.Fatalf("the source cancelled a migration in post-copy: %v", err)
	}
	if err := syscall.Kill(srcSt.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var st protocol.Status
	// QEMU's own exit and its MIGRATION event come in either order; both are recorded in turn.
	waitFor(t, time.Minute, "the target's QEMU to end, its migration failed", func() bool {
		var err error
		st, err = dst.client.Status(ctx)
		return err == nil && st.Exit != nil && st.Migration != nil && st.Migration.Status == "failed"
	})
	if !strings.Contains(st.Exit.Detail, "post-copy") || st.Migration == nil || !strings.Contains(st.Migration.Error, "split between") {
		t.Fatalf("the target ended %+v, migration %+v: want both to say the post-copy failed", st.Exit, st.Migration)
	}
}

// breakPostCopy starts a post-copy migration over a link that it breaks once the target runs the
// guest in post-copy: both sides must then report the migration paused, the guest alive.
func breakPostCopy(t *testing.T, recovery time.Duration) (src, dst *vm, dstConsole *console) {
	t.Helper()
	ctx := context.Background()
	var cut func()
	var beforeSwitch int
	src, dst, _, dstConsole, beforeSwitch = postCopyPairOver(t, recovery, func(uri string) string {
		link := newLink(t, uri, 0)
		cut = link.Cut
		return link.URI
	})
	// Not before the guest runs on the target: until then the target still loads the devices'
	// state, and QEMU cannot pause a migration broken there (it exits).
	waitFor(t, 2*time.Minute, "the counter to go on on the target", func() bool { return dstConsole.LastTick() > beforeSwitch+1 })
	if st, err := src.client.Status(ctx); err != nil || st.Migration == nil || st.Migration.Status != "postcopy-active" {
		t.Fatalf("the source as the guest runs on the target: %+v, %v; want it in post-copy", st.Migration, err)
	}
	cut()
	for name, v := range map[string]*vm{"source": src, "target": dst} {
		waitFor(t, time.Minute, "the "+name+" to pause the migration", func() bool {
			st, err := v.client.Status(ctx)
			return err == nil && st.Exit == nil && st.Migration != nil && st.Migration.Status == "postcopy-paused"
		})
	}
	return src, dst, dstConsole
}

// waitSourceHolding waits, as the source's node agent does before it finishes a migration, until the
// source holds the guest it handed over: QEMU completed and the handover is recorded (a moment
// after QEMU's completion).
func waitSourceHolding(t *testing.T, src *vm, d time.Duration) {
	t.Helper()
	waitFor(t, d, "the source to hold the completed migration", func() bool {
		st, err := src.client.Status(context.Background())
		return err == nil && st.Migration != nil && st.Migration.Status == "completed" && st.Migration.Handover == protocol.HandoverHolding
	})
}

// blockMainLoop has v's QEMU read all of the guest's memory in its main loop (pmemsave, through
// the operator's monitor) and checks it is still at it a second later: on a post-copy target
// whose link broke it waits for the pages the source still holds. The returned channel gets
// pmemsave's result.
func blockMainLoop(t *testing.T, v *vm) <-chan error {
	t.Helper()
	shell := dialWhenListening(t, launcher.Dir(v.runDir).ShellQMP())
	t.Cleanup(func() { _ = shell.Close() })
	file := filepath.Join(t.TempDir(), "memory")
	dumped := make(chan error, 1)
	go func() {
		_, err := shell.Execute(context.Background(), "pmemsave", map[string]any{"val": 0, "size": 64 << 20, "filename": file})
		dumped <- err
	}()
	select {
	case err := <-dumped:
		t.Fatalf("pmemsave on the paused target ended (%v): it had every page, so nothing blocks", err)
	case <-time.After(time.Second):
	}
	return dumped
}

// TestPostCopyRecoversFromABrokenLink: the link breaks in post-copy (as when a node agent restarts
// and its tunnel goes); both sides wait, the target listens again, the source resumes there, and
// the migration completes with the guest running on on the target, never booted again.
func TestPostCopyRecoversFromABrokenLink(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, dst, dstConsole := breakPostCopy(t, 2*time.Minute)
	if err := src.client.ResumeMigration(ctx, protocol.MigrationResume{URI: "tcp:127.0.0.1:0"}); err == nil || !strings.Contains(err.Error(), "uri") {
		t.Errorf("resume to port 0: %v, want an error naming uri", err)
	}
	if _, err := src.client.RecoverMigration(ctx, protocol.MigrationRecover{Listen: "127.0.0.1:0"}); err == nil {
		t.Error("the source listened to recover a migration: only the target may")
	}
	// The target's main loop waits for a page the broken link did not bring, as it does when a
	// device's emulation touches one (seen in CI: the recovery then got no answer): pmemsave reads
	// the guest's memory there. The recovery must not queue behind it.
	dumped := blockMainLoop(t, dst)
	uri, err := dst.client.RecoverMigration(ctx, protocol.MigrationRecover{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	if err := src.client.ResumeMigration(ctx, protocol.MigrationResume{URI: uri}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	waitSourceHolding(t, src, 4*time.Minute)
	waitFor(t, time.Minute, "the target's migration to complete", func() bool {
		st, err := dst.client.Status(ctx)
		return err == nil && st.Migration != nil && st.Migration.Status == "completed"
	})
	if err := src.client.FinishMigration(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-dumped:
		if err != nil {
			t.Errorf("the target's main loop, once its pages came: %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("the target's main loop still waits for its pages after the migration completed")
	}
	last := dstConsole.LastTick()
	waitFor(t, time.Minute, "the counter to go on on the target", func() bool { return dstConsole.LastTick() > last+1 })
	if strings.Contains(dstConsole.Text(), "QVIRT-GUEST-READY") {
		t.Fatalf("the guest booted on the target:\n%s", dstConsole.Text())
	}
	if st, err := dst.client.Status(ctx); err != nil || st.Exit != nil {
		t.Fatalf("the target after the recovered migration: %+v, %v", st.Exit, err)
	}
}

// TestPostCopyUnrecoveredEndsBothSides: a link that breaks in post-copy and is not mended within
// the window ends both QEMUs, each saying why: the guest's memory is split between them.
func TestPostCopyUnrecoveredEndsBothSides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, dst, _ := breakPostCopy(t, 3*time.Second)
	for name, v := range map[string]*vm{"source": src, "target": dst} {
		var st protocol.Status
		waitFor(t, time.Minute, "the "+name+"'s QEMU to end", func() bool {
			var err error
			st, err = v.client.Status(ctx)
			return err == nil && st.Exit != nil
		})
		if st.Migration == nil || !strings.Contains(st.Migration.Error, "within 3s") || !strings.Contains(st.Migration.Error, "split between") {
			t.Errorf("the %s ended %+v, migration %+v: want it to say the link was not mended in time", name, st.Exit, st.Migration)
		}
	}
}

// Bad requests name the field: post-copy cannot go with parallel streams or local disks, and
// postCopyAfter needs postCopy.
func TestPostCopyRequestsAreChecked(t *testing.T) {
	t.Parallel()
	src, _ := boot(t) // with its emptyDisk
	ctx := context.Background()
	for _, c := range []struct {
		req  protocol.MigrationSource
		want string
	}{
		{protocol.MigrationSource{URI: "tcp:127.0.0.1:1", PostCopyAfter: time.Second}, "postCopyAfter"},
		{protocol.MigrationSource{URI: "tcp:127.0.0.1:1", PostCopy: true, PostCopyAfter: -time.Second}, "postCopyAfter"},
		{protocol.MigrationSource{URI: "tcp:127.0.0.1:1", PostCopy: true, Parallel: &protocol.ParallelStreams{Channels: 2}}, "parallel streams"},
		{protocol.MigrationSource{URI: "tcp:127.0.0.1:1", PostCopy: true, BlockMigration: &protocol.BlockMigration{URI: "unix:/x"}}, "block migration"},
		{protocol.MigrationSource{URI: "tcp:127.0.0.1:1", PostCopyRecovery: time.Minute}, "postCopyRecovery"},
		{protocol.MigrationSource{URI: "tcp:127.0.0.1:1", PostCopy: true, PostCopyRecovery: -time.Minute}, "postCopyRecovery"},
	} {
		err := src.client.MigrateSource(ctx, c.req)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("MigrateSource(%+v): %v, want an error naming %q", c.req, err, c.want)
		}
	}
	if err := src.client.ResumeMigration(ctx, protocol.MigrationResume{URI: "tcp:127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "no post-copy migration") {
		t.Errorf("resume with no paused migration: %v, want a refusal saying so", err)
	}
}
