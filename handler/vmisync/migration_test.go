package vmisync

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// A reconcile may read a copy of the VMI from before its own write of startTimestamp (the cache
// lags behind the agent's status update, or the write was lost to a conflict) while the source
// launcher already migrates. Starting again would open a second tunnel on the socket the source
// QEMU is about to connect to, and remove it when the launcher refuses the second start: the
// migration then failed with "Failed to connect to …/migration-out.sock" (seen under load, with a
// block migration's disk copy making the window seconds long). An abort in that window must
// cancel the running migration, not record one that never started.
func TestSourceMigrationStartsOnce(t *testing.T) {
	migrating := &protocol.Status{Phase: protocol.PhaseRunning, RunState: "running",
		Migration: &protocol.MigrationInfo{Role: protocol.RoleSource, Status: "active"}}
	staleVMI := func() *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{}
		v.UID = "0e5c1f0e-3c52-4c44-9d55-1f0a6d0f3c11"
		v.Status.NodeName = "node-a"
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "m-1",
			SourceNode: "node-a", TargetNode: "node-b", TargetReady: true, TargetNodeAddress: "10.0.0.2:4443"}
		return v
	}
	r := &Reconciler{NodeName: "node-a", Recorder: record.NewFakeRecorder(10),
		launchers: newLaunchers(launcher.ClientOptions{}, logr.Discard())}

	v := staleVMI()
	if err := r.syncSourceMigration(context.Background(), v, migrating); err != nil {
		t.Fatalf("sync: %v", err)
	}
	ms := v.Status.MigrationState
	if ms.Failed || ms.StartTimestamp == nil {
		t.Errorf("a running migration read from a stale VMI: failed %v (%q), startTimestamp %v; want it recorded as started, not started again",
			ms.Failed, ms.FailureReason, ms.StartTimestamp)
	}

	v = staleVMI()
	v.Status.MigrationState.AbortRequested = true
	err := r.syncSourceMigration(context.Background(), v, migrating)
	if ms := v.Status.MigrationState; ms.Failed && strings.Contains(ms.FailureReason, "before it started") {
		t.Errorf("an abort of a running migration read from a stale VMI was recorded as %q; want the migration cancelled", ms.FailureReason)
	}
	if err == nil || !strings.Contains(err.Error(), "cancel") {
		t.Errorf("abort of a running migration: err %v, want the launcher asked to cancel (no launcher here: an error saying so)", err)
	}
}

// A migration whose link broke after its switch to post-copy is paused, not over: the source's
// agent keeps it open (the agents can resume it) and resumes it only once the target listens
// again; only a paused migration whose QEMU ended is failed.
func TestPausedPostCopyIsNotAFailure(t *testing.T) {
	paused := func() *protocol.Status {
		return &protocol.Status{Phase: protocol.PhaseRunning, RunState: "paused",
			Migration: &protocol.MigrationInfo{Role: protocol.RoleSource, Status: "postcopy-paused", PostCopy: true}}
	}
	vmi := func() *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{}
		v.UID = "0e5c1f0e-3c52-4c44-9d55-1f0a6d0f3c12"
		v.Status.NodeName = "node-a"
		v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "m-2", SourceNode: "node-a",
			TargetNode: "node-b", TargetReady: true, TargetNodeAddress: "10.0.0.2:4443", StartTimestamp: ptr.To(metav1.Now())}
		return v
	}
	r := &Reconciler{NodeName: "node-a", Recorder: record.NewFakeRecorder(10),
		launchers: newLaunchers(launcher.ClientOptions{}, logr.Discard())}

	v := vmi()
	if err := r.syncSourceMigration(context.Background(), v, paused()); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if ms := v.Status.MigrationState; ms.Failed || ms.Mode != v1alpha1.MigrationPostCopy {
		t.Errorf("a paused post-copy migration: failed %v (%q), mode %q; want it open, in post-copy", ms.Failed, ms.FailureReason, ms.Mode)
	}

	v = vmi()
	lost := paused()
	lost.Exit = &protocol.Exit{Reason: protocol.ExitCrashed, Detail: "not resumed within 5m0s"}
	if err := r.syncSourceMigration(context.Background(), v, lost); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if ms := v.Status.MigrationState; !ms.Failed {
		t.Error("a paused post-copy migration whose QEMU ended was not failed")
	}
}

// A post-copy resume tried less than resumeRetry ago is not sent again, but the instance is looked
// at again then: a resume that failed leaves the same paused status, so no event would bring it
// back before the guest is lost (it used to wait for the launcher's heartbeat, now 5 minutes,
// as long as the recovery window). The phases after the migration's still run.
func TestThrottledPostCopyResumeIsRetried(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.UID = "7c2e9a41-5b3d-4e6f-8a1b-9c0d2e3f4a5b"
	v.Status.NodeName = "node-a"
	v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "m-3", SourceNode: "node-a",
		TargetNode: "node-b", TargetReady: true, TargetRecoveryReady: true, TargetNodeAddress: "10.0.0.2:4443",
		StartTimestamp: ptr.To(metav1.Now())}
	st := &protocol.Status{Phase: protocol.PhaseRunning, RunState: "paused",
		Migration: &protocol.MigrationInfo{Role: protocol.RoleSource, Status: "postcopy-paused", PostCopy: true}}
	r := &Reconciler{NodeName: "node-a", Recorder: record.NewFakeRecorder(10), Migrations: unusedTunnel{},
		launchers: newLaunchers(launcher.ClientOptions{}, logr.Discard())}
	r.launchers.resumeDue(v.UID, resumeRetry) // a resume was just tried
	ran := false
	s := &syncState{v: v, st: st}
	err := runPhases(context.Background(), s, []phase{
		{name: "source migration", run: phaseNamed(t, r, "source migration")},
		{name: "next", run: func(context.Context, *syncState) error { ran = true; return nil }},
	})
	if err != nil || s.requeueAfter != resumeRetry || !ran {
		t.Errorf("a resume not due yet: err %v, requeue after %v, later phases ran %v; want no error, a requeue after %v, and the phases run",
			err, s.requeueAfter, ran, resumeRetry)
	}
}

// unusedTunnel is a MigrationTunnel for a test that must not reach it.
type unusedTunnel struct{ MigrationTunnel }

// The streamed launcher status can lag behind the launcher itself: a reconcile right after the
// agent's own start (its status write done, the stream not yet showing the migration) read a
// stream that showed no migration and started again; the launcher refused ("409: a migration is
// already running") and the migration failed (the real-node test's migrate after an upgrade).
// Before starting, the agent asks the launcher itself.
func TestSourceMigrationAsksTheLauncherBeforeStarting(t *testing.T) {
	dir := launcher.Dir(t.TempDir())
	var sources atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(protocol.Status{Phase: protocol.PhaseRunning, RunState: "running",
			Migration: &protocol.MigrationInfo{Role: protocol.RoleSource, Status: "active"}})
	})
	mux.HandleFunc("POST /v1/migration/source", func(w http.ResponseWriter, _ *http.Request) {
		sources.Add(1)
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(protocol.ErrorResponse{Error: "a migration is already running"})
	})
	ln, err := net.Listen("unix", dir.Command())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	v := &v1alpha1.VirtualMachineInstance{}
	v.UID = "5a1d3b9e-0c1e-4d5e-9f3a-2b7c8d9e0f12"
	v.Status.NodeName = "node-a"
	v.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "m-2",
		SourceNode: "node-a", TargetNode: "node-b", TargetReady: true, TargetNodeAddress: "10.0.0.2:4443"}
	r := &Reconciler{NodeName: "node-a", Recorder: record.NewFakeRecorder(10),
		launchers: newLaunchers(launcher.ClientOptions{}, logr.Discard())}
	r.launchers.place(v.UID, dir)
	streamed := &protocol.Status{Phase: protocol.PhaseRunning, RunState: "running"} // no migration yet
	if err := r.syncSourceMigration(context.Background(), v, streamed); err != nil {
		t.Fatalf("sync: %v", err)
	}
	ms := v.Status.MigrationState
	if ms.Failed || ms.StartTimestamp == nil || sources.Load() != 0 {
		t.Errorf("failed %v (%q), startTimestamp %v, starts sent %d; want the running migration recorded as started and none sent",
			ms.Failed, ms.FailureReason, ms.StartTimestamp, sources.Load())
	}
}

// phaseNamed is r's phase of that name.
func phaseNamed(t *testing.T, r *Reconciler, name string) func(context.Context, *syncState) error {
	t.Helper()
	for _, p := range r.phases() {
		if p.name == name {
			return p.run
		}
	}
	t.Fatalf("no phase %q", name)
	return nil
}
