package vmisync

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// The handover at the end of a live migration (launcher/switchover.go). Once QEMU has moved the
// guest, the source and the target launcher both hold it paused, and the node agents decide,
// through the instance's migrationState, which side runs it:
//
//  1. The source's agent records sourceHandedOver (and handedOverPaused) once its launcher holds
//     the guest; the source QEMU cannot restart it on its own any more.
//  2. The target's agent then runs the guest on the target and records completed; the controller
//     moves the instance there and deletes the source pod. When the target cannot run it (its
//     QEMU is gone, QEMU refuses, its pod is being deleted), the agent makes sure it never will
//     (the target QEMU is killed, or already gone) and records failed.
//  3. The source's agent, seeing completed, has its launcher quit (the source pod's deletion does
//     too); seeing failed, has it take the guest back, which runs on at the source with its state.
//
// Only the target's agent decides while it can; the controller fails a handed-over migration
// only once the target pod has ended or is gone (controllers/migration). So the source resumes the
// guest only when the target does not run it, and never after it ran there: the target launcher
// records that it was told to run before it does.

// Event reasons of the handover.
const (
	EventMigrationHandedOver = "MigrationHandedOver"
	EventMigrationReclaimed  = "MigrationReclaimed"
)

// errHandoverPending asks for another look shortly: the target launcher has not recorded yet that
// it holds the guest, or it was just told to stop its QEMU.
var errHandoverPending = &waitError{"the handover is under way", launcherStartPoll}

// syncSourceHandover drives a source launcher that holds a handed-over guest, and reports whether
// it holds one (the rest of the source's migration sync then has nothing to do).
func (r *Reconciler) syncSourceHandover(ctx context.Context, v *v1alpha1.VirtualMachineInstance, st *protocol.Status) (bool, error) {
	info := st.Migration
	if info == nil || info.Role != protocol.RoleSource || info.Handover != protocol.HandoverHolding || st.Exit != nil {
		return false, nil
	}
	ms := v.Status.MigrationState
	if ms == nil || ms.SourceNode != r.NodeName || ms.StartTimestamp == nil {
		return true, nil // not a migration this agent started: hold
	}
	c := r.launchers.client(v.UID)
	defer c.Close()
	switch {
	case ms.Completed:
		if err := c.FinishMigration(ctx); err != nil {
			return true, fmt.Errorf("finish the source after the target took the guest over: %w", err)
		}
	case ms.Failed && info.PostCopy:
		// Nothing to take back: the guest ran on the target from the switch to post-copy.
		if err := c.Kill(ctx); err != nil {
			return true, fmt.Errorf("stop the source of a failed post-copy migration: %w", err)
		}
		r.Recorder.Eventf(v, corev1.EventTypeWarning, EventMigrationFailed,
			"The migration failed after its switch to post-copy (%s): the guest ran on node %s and cannot run here again; its QEMU here was stopped", ms.FailureReason, ms.TargetNode)
	case ms.Failed:
		reason := ms.FailureReason
		if reason == "" {
			reason = "the migration failed"
		}
		if _, err := c.ReclaimMigration(ctx, reason); err != nil {
			return true, fmt.Errorf("take the guest back from a failed handover: %w", err)
		}
		r.Recorder.Eventf(v, corev1.EventTypeWarning, EventMigrationReclaimed, "The target did not take the guest over (%s); it runs on here", reason)
	case !ms.SourceHandedOver && info.PostCopy:
		ms.SourceHandedOver, ms.HandedOverPaused = true, info.GuestPaused
		setProgress(ms, info)
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventMigrationHandedOver,
			"The target on node %s has the guest's whole memory; it has run the guest there since the switch to post-copy (downtime %d ms)", ms.TargetNode, info.DowntimeMs)
	case !ms.SourceHandedOver:
		ms.SourceHandedOver, ms.HandedOverPaused = true, info.GuestPaused
		setProgress(ms, info)
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventMigrationHandedOver,
			"The target on node %s has the guest's whole state; the guest waits here, stopped, until it runs there (downtime so far %d ms)", ms.TargetNode, info.DowntimeMs)
	}
	return true, nil
}

// takeOver (target node) runs a handed-over guest on this node's target launcher and records the
// migration completed, or, when the target cannot run it, makes sure it never will and records the
// migration failed, so the source takes the guest back. A target launcher that cannot be reached
// is retried: it may hold the guest yet, and only it knows whether it was told to run it.
func (r *Reconciler) takeOver(ctx context.Context, v *v1alpha1.VirtualMachineInstance) error {
	ms := v.Status.MigrationState
	pod, err := r.targetPod(ctx, v, ms)
	if err != nil || pod == nil {
		return err // the controller fails a migration whose target pod is gone
	}
	r.launchers.place(v.UID, podsockets.Dir(r.PodsDir, pod.UID, v.UID))
	c := r.launchers.client(v.UID)
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return fmt.Errorf("the target launcher in pod %s: %w", pod.Name, err)
	}
	step, why := takeoverStep(&st, !pod.DeletionTimestamp.IsZero())
	switch step {
	case stepWait:
		return errHandoverPending
	case stepStop:
		if err := c.Kill(ctx); err != nil {
			return fmt.Errorf("stop the target QEMU (%s): %w", why, err)
		}
		return errHandoverPending // failed once its exit is reported
	case stepRun:
		if _, err := c.RunMigrated(ctx, protocol.MigrationRun{Paused: ms.HandedOverPaused}); err != nil {
			var apiErr *launcher.APIError
			if errors.As(err, &apiErr) {
				// It answered: its status says whether it took the guest (done) or not (QEMU
				// refused to run it, or is gone); look again.
				return r.refusedRun(ctx, c, pod, err)
			}
			return fmt.Errorf("run the guest in the target pod %s: %w", pod.Name, err)
		}
	}
	before := v.DeepCopy()
	ms = v.Status.MigrationState
	if ms.EndTimestamp == nil {
		ms.EndTimestamp = ptr.To(metav1.NewTime(r.now().Time))
	}
	if step == stepLost {
		ms.Failed = true
		ms.FailureReason = fmt.Sprintf("the target on node %s could not take the guest over: %s", r.NodeName, why)
		r.Recorder.Eventf(v, corev1.EventTypeWarning, EventMigrationFailed, "%s; the guest runs on at the source", ms.FailureReason)
		return r.patchStatus(ctx, before, v)
	}
	ms.Completed = true
	var downtime int64
	if ms.DowntimeMilliseconds != nil {
		downtime = *ms.DowntimeMilliseconds
	}
	r.Recorder.Eventf(v, corev1.EventTypeNormal, EventMigrationCompleted, "The guest runs on node %s in pod %s (QEMU's downtime %d ms)", r.NodeName, pod.Name, downtime)
	return r.patchStatus(ctx, before, v)
}

// refusedRun handles a run the target launcher answered with an error: a target that still holds
// the guest with its QEMU alive refused to run it (QEMU said no) and is stopped, so that it never
// runs it; anything else is decided on the next look.
func (r *Reconciler) refusedRun(ctx context.Context, c *launcher.Client, pod *corev1.Pod, runErr error) error {
	st, err := c.Status(ctx)
	if err != nil {
		return fmt.Errorf("run the guest in the target pod %s: %w", pod.Name, runErr)
	}
	if st.Exit == nil && st.Migration != nil && st.Migration.Handover == protocol.HandoverHolding {
		if err := c.Kill(ctx); err != nil {
			return fmt.Errorf("stop the target QEMU that refused to run the guest (%v): %w", runErr, err)
		}
	}
	return errHandoverPending
}

// takeover steps of the target's agent.
type takeoverAction int

const (
	// stepWait: the target launcher has not recorded yet that it holds the guest.
	stepWait takeoverAction = iota
	// stepRun: it holds the guest: run it there.
	stepRun
	// stepDone: it was told to run the guest already: the guest is the target's.
	stepDone
	// stepStop: it holds the guest but must not run it: stop its QEMU first.
	stepStop
	// stepLost: its QEMU cannot run the guest (gone, or its migration failed).
	stepLost
)

// takeoverStep decides what the target's agent does with a handed-over guest from the target
// launcher's status, and why for stepStop and stepLost. A target once told to run the guest keeps
// it, even if its QEMU died since: it may have run the guest, which must not run again from the
// source's older state.
func takeoverStep(st *protocol.Status, podDeleting bool) (takeoverAction, string) {
	mig := st.Migration
	switch {
	case mig != nil && mig.Role == protocol.RoleTarget && mig.Handover == protocol.HandoverDone:
		return stepDone, ""
	case st.Exit != nil:
		return stepLost, "its QEMU ended (" + st.Exit.String() + ")"
	case st.Phase == protocol.PhaseFailed:
		return stepLost, "its QEMU did not start: " + st.StartError
	case mig == nil || mig.Role != protocol.RoleTarget:
		return stepLost, "its launcher holds no incoming migration"
	case mig.Handover == protocol.HandoverHolding && podDeleting:
		return stepStop, "its pod is being deleted"
	case mig.Handover == protocol.HandoverHolding:
		return stepRun, ""
	case migrationEnded(mig.Status):
		why := "its incoming migration " + mig.Status
		if mig.Error != "" {
			why += ": " + mig.Error
		}
		return stepLost, why
	}
	return stepWait, ""
}
