package launcher

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// The handover: how a live migration ends, so that the source gives up its guest only once the
// target runs it, and the guest never runs on both sides.
//
// QEMU's return path (capability return-path on both ends) makes the source's migration complete
// only after the target QEMU has loaded the guest's whole state and acknowledged it over the
// migration connection; a target that fails to load, dies or loses the connection before then
// fails the source's migration, and the source QEMU restarts its vCPUs. That alone leaves two
// gaps: a target QEMU started without -S runs the guest before the source has heard of it (so a
// target that dies in between leaves a guest that ran there and runs again on the source from an
// older state), and a source QEMU that quits at completion cannot take the guest back if the
// target fails afterwards. So at the end neither side runs the guest on its own:
//
//   - The target QEMU runs with -S (argv.go) and late-block-activate: when the incoming migration
//     completes, QEMU leaves the guest paused (or in prelaunch if it never ran) and does not take
//     its disks over yet. The launcher reports Handover holding until RunMigrated.
//   - The source launcher does not quit when its migration completes: the guest stays paused in
//     postmigrate and the launcher reports Handover holding, and GuestPaused, until
//     FinishMigration (quit) or ReclaimMigration (cont: QEMU takes the disks back and restarts
//     the vCPUs). Pause, unpause and cancel are refused meanwhile.
//
// The node agents decide (handler/vmisync/switchover.go): the source's agent records that the
// source holds the guest; the target's agent then runs it on the target or, when the target
// cannot (its QEMU is gone), fails the migration, and only then does the source's agent reclaim
// the guest. The target's launcher records the decision before it runs the guest, so a target
// that dies right after it was told to run is reported as having taken the guest, never as one
// the source may reclaim.
//
// QEMU's pause-before-switchover capability (the pre-switchover state, left with migrate-continue)
// is not used for the handover: it stops the source before the device state is sent, when the
// target cannot run the guest yet. It serves switching block jobs over at that point, which is
// what a block migration uses it for (blockmigration.go): the local disks' mirrors end there.

// targetCapabilities are the migration capabilities of an incoming QEMU: events, the return path
// (the acknowledgement the source waits for) and late block activation (the target opens its
// disks for writing only when it runs the guest, so a source that takes the guest back still
// owns them).
var targetCapabilities = []qmp.MigrationCapabilityStatus{
	{Capability: qmp.CapEvents, State: true},
	{Capability: qmp.CapReturnPath, State: true},
	{Capability: qmp.CapLateBlockActivate, State: true},
}

// holdOutgoing keeps the guest here, paused, once QEMU has sent it and the target acknowledged
// loading it: whether it runs there is the node agents' to say.
func (l *Launcher) holdOutgoing(info *protocol.MigrationInfo, wasRunning bool) {
	held := *info
	held.Handover = protocol.HandoverHolding
	held.GuestPaused = !wasRunning
	l.setMigration(&held)
}

// handingOver reports whether this launcher holds a handed-over guest (either role).
func (l *Launcher) handingOver() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.migration != nil && l.migration.Handover == protocol.HandoverHolding
}

// heldMigration is the migration when this launcher has role in it and its handover is in one of
// states; a conflict naming what the launcher has otherwise. Call with l.mu held.
func (l *Launcher) heldMigration(role protocol.MigrationRole, states ...protocol.Handover) (*protocol.MigrationInfo, error) {
	mig := l.migration
	if mig == nil || mig.Role != role || mig.Handover == "" {
		return nil, &ConflictError{Msg: fmt.Sprintf("no migration has handed a guest over to this launcher as its %s", role)}
	}
	for _, s := range states {
		if mig.Handover == s {
			return mig, nil
		}
	}
	return nil, &ConflictError{Msg: fmt.Sprintf("the migration's handover is %q here", mig.Handover)}
}

// RunMigrated takes over the guest a completed incoming migration left paused here: it runs it,
// or with req.Paused leaves it paused, as it was on the source. The handover is recorded as done
// before QEMU is told to run: a target that dies a moment later may have run the guest, so it is
// never reported as one whose source may take the guest back. Only QEMU refusing to run it (the
// vCPUs did not start) returns the handover to holding. A repeated call is a no-op.
func (l *Launcher) RunMigrated(ctx context.Context, req *protocol.MigrationRun) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	held, err := l.heldMigration(protocol.RoleTarget, protocol.HandoverHolding, protocol.HandoverDone)
	if err != nil {
		l.mu.Unlock()
		return err
	}
	before := *held
	var previousTPM string
	if held.Handover == protocol.HandoverHolding {
		// A persistent TPM's state becomes this side's with the decision (tpm.go).
		if previousTPM, err = p.daemons.adoptTPMState(); err != nil {
			l.mu.Unlock()
			return fmt.Errorf("take the TPM's state over: %w", err)
		}
		done := *held
		done.Handover = protocol.HandoverDone
		l.migration = &done
		l.phase = protocol.PhaseRunning
		l.notifyLocked()
	}
	l.mu.Unlock()
	if req.Paused {
		p.daemons.dropOldTPMStates()
		return nil
	}
	// cont on a guest already running (a repeated call) changes nothing.
	err = p.Resume(ctx)
	var refused *qmp.Error
	if errors.As(err, &refused) && before.Handover == protocol.HandoverHolding {
		l.mu.Lock()
		if rerr := p.daemons.restoreTPMState(previousTPM); rerr != nil {
			// The source must not take back a guest whose TPM state is named as this side's.
			l.mu.Unlock()
			return fmt.Errorf("run the migrated guest: %w; give the TPM's state back: %v", err, rerr)
		}
		l.migration = &before
		l.phase = protocol.PhaseIncoming
		l.notifyLocked()
		l.mu.Unlock()
	}
	if err != nil {
		return fmt.Errorf("run the migrated guest: %w", err)
	}
	p.daemons.dropOldTPMStates()
	return nil
}

// FinishMigration ends a source that holds a handed-over guest: the target runs it, so this QEMU
// quits and the launcher ends with ExitMigrated. A repeated call while QEMU quits is a no-op.
func (l *Launcher) FinishMigration(ctx context.Context) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	held, err := l.heldMigration(protocol.RoleSource, protocol.HandoverHolding, protocol.HandoverDone)
	if err == nil && held.Handover == protocol.HandoverHolding {
		done := *held
		done.Handover = protocol.HandoverDone
		l.migration = &done
		l.notifyLocked()
	}
	l.mu.Unlock()
	if err != nil {
		return err
	}
	if err := p.Monitor().Quit(ctx); err != nil {
		return fmt.Errorf("finish the migration: quit QEMU: %w", err)
	}
	return nil
}

// ReclaimMigration takes back a guest this source handed over, after the target failed before it
// ran it: the guest runs here again (or stays paused, as it was) with its state, and the migration
// is reported failed with reason. A repeated call is a no-op.
func (l *Launcher) ReclaimMigration(ctx context.Context, req *protocol.MigrationReclaim) error {
	if strings.TrimSpace(req.Reason) == "" {
		return machine.Required("reason", "why the target failed")
	}
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	// From the switch on, whether QEMU has completed yet or not (the handover is recorded a moment
	// after QEMU's completion), the guest has run on the target.
	if m := l.migration; m != nil && m.Role == protocol.RoleSource && m.PostCopy {
		l.mu.Unlock()
		return &ConflictError{Msg: "the migration switched to post-copy: the guest ran on the target, and cannot run here again"}
	}
	held, err := l.heldMigration(protocol.RoleSource, protocol.HandoverHolding, protocol.HandoverReclaimed)
	l.mu.Unlock()
	if err != nil || held.Handover == protocol.HandoverReclaimed {
		return err
	}
	p.reclaim()
	if !held.GuestPaused {
		// cont after a completed migration takes the disks back (QEMU inactivated them for the
		// target) and restarts the vCPUs.
		if err := p.Resume(ctx); err != nil {
			return fmt.Errorf("reclaim the guest: %w", err)
		}
	}
	failed := *held
	failed.Status = string(qmp.MigrationFailed)
	failed.Handover = protocol.HandoverReclaimed
	failed.Error = "the target did not take the guest over: " + req.Reason
	l.setMigration(&failed)
	return nil
}

// reclaim makes this source QEMU the guest's again: its end is the guest's own, not a migration.
func (p *Process) reclaim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.migrated = false
}
