package vmisync

import (
	"strings"
	"testing"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
)

func TestTakeoverStep(t *testing.T) {
	target := func(status string, h protocol.Handover) *protocol.MigrationInfo {
		return &protocol.MigrationInfo{Role: protocol.RoleTarget, Status: status, Handover: h}
	}
	holding := protocol.Status{Phase: protocol.PhaseIncoming, RunState: "paused", Migration: target("completed", protocol.HandoverHolding)}
	killed := holding
	killed.Phase, killed.Exit = protocol.PhaseFailed, &protocol.Exit{Reason: protocol.ExitKilled, Detail: "signal killed"}
	ran := protocol.Status{Phase: protocol.PhaseRunning, RunState: "running", Migration: target("completed", protocol.HandoverDone)}
	ranThenDied := ran
	ranThenDied.Phase, ranThenDied.Exit = protocol.PhaseFailed, &protocol.Exit{Reason: protocol.ExitCrashed}

	cases := []struct {
		name        string
		st          protocol.Status
		podDeleting bool
		want        takeoverAction
		why         string
	}{
		{"holding: run it", holding, false, stepRun, ""},
		{"holding in a pod being deleted: stop it first", holding, true, stepStop, "being deleted"},
		{"killed while holding: the source takes the guest back", killed, false, stepLost, "killed"},
		{"told to run: the target's", ran, false, stepDone, ""},
		{"told to run, then died: still the target's (it may have run)", ranThenDied, false, stepDone, ""},
		{"not yet recorded the completed migration", protocol.Status{Phase: protocol.PhaseIncoming, Migration: target("active", "")}, false, stepWait, ""},
		{"incoming migration failed", protocol.Status{Phase: protocol.PhaseIncoming, Migration: &protocol.MigrationInfo{
			Role: protocol.RoleTarget, Status: "failed", Error: "load of migration failed"}}, false, stepLost, "load of migration failed"},
		{"a launcher that holds nothing", protocol.Status{Phase: protocol.PhaseWaiting}, false, stepLost, "no incoming migration"},
		{"a source's status", protocol.Status{Phase: protocol.PhaseRunning, Migration: &protocol.MigrationInfo{
			Role: protocol.RoleSource, Status: "completed", Handover: protocol.HandoverHolding}}, false, stepLost, "no incoming migration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, why := takeoverStep(&tc.st, tc.podDeleting)
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("takeoverStep = %d %q, want %d saying %q", got, why, tc.want, tc.why)
			}
		})
	}
}

func TestMigratedAwayDuringTheHandover(t *testing.T) {
	held := &protocol.Status{Phase: protocol.PhaseRunning, RunState: "postmigrate",
		Migration: &protocol.MigrationInfo{Role: protocol.RoleSource, Status: "completed", Handover: protocol.HandoverHolding}}
	heldThenKilled := *held
	heldThenKilled.Exit = &protocol.Exit{Reason: protocol.ExitKilled}
	reclaimed := &protocol.Status{Phase: protocol.PhaseRunning, RunState: "running",
		Migration: &protocol.MigrationInfo{Role: protocol.RoleSource, Status: "failed", Handover: protocol.HandoverReclaimed}}
	open := &v1alpha1.VirtualMachineInstance{}
	open.Status.NodeName = "node-a"
	open.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: "node-a", SourceHandedOver: true}
	failed := open.DeepCopy()
	failed.Status.MigrationState.Failed = true

	cases := []struct {
		name string
		v    *v1alpha1.VirtualMachineInstance
		st   *protocol.Status
		want bool
	}{
		{"the source holds the guest: the target's agent reports it", open, held, true},
		{"the source took the guest back: it reports it again", failed, reclaimed, false},
		{"the source lost its copy and the target failed: the source reports the end", failed, &heldThenKilled, false},
		{"the source lost its copy while the target decides", open, &heldThenKilled, true},
	}
	for _, tc := range cases {
		if got := migratedAway(tc.v, tc.st); got != tc.want {
			t.Errorf("%s: migratedAway = %v, want %v", tc.name, got, tc.want)
		}
	}
}
