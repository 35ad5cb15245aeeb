package migration

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// Condition types of a migration.
const (
	// ConditionAdmitted is False while the parallel-migration limits hold a Pending migration back
	// and True once it was let through.
	ConditionAdmitted = "Admitted"
	// ConditionFailed is True once the migration failed or was refused; its reason says why.
	ConditionFailed = v1alpha1.MigrationConditionFailed
	// ConditionAbortRequested is True once qvirt asked the node agent to cancel the migration
	// (deletion or completion timeout); its LastTransitionTime starts the abort grace period.
	ConditionAbortRequested = "AbortRequested"
)

// Reasons of conditions and Events. Refusals of non-migratable instances use the reasons of
// v1alpha1.LiveMigratable (InterfaceNotLiveMigratable, HostDiskNotLiveMigratable, ...).
const (
	ReasonAdmitted              = "Admitted"
	ReasonClusterLimitReached   = "ParallelMigrationsPerClusterReached"
	ReasonNodeLimitReached      = "ParallelOutboundMigrationsPerNodeReached"
	ReasonVMINotFound           = "VMINotFound"
	ReasonVMINotRunning         = "VMINotRunning"
	ReasonMigrationInProgress   = "MigrationInProgress"
	ReasonSourcePodNotFound     = "SourcePodNotFound"
	ReasonTargetPodFailed       = "TargetPodFailed"
	ReasonTargetPodDeleted      = "TargetPodDeleted"
	ReasonMigrationFailed       = "MigrationFailed"
	ReasonCompletionTimeout     = "CompletionTimeoutExceeded"
	ReasonAborted               = "Aborted"
	ReasonTargetPodCreated      = "TargetPodCreated"
	ReasonMigrationSucceeded    = "MigrationSucceeded"
	ReasonFailedCreateTargetPod = "FailedCreateTargetPod"
	ReasonMigrationStateLost    = "MigrationStateLost"
	// ReasonImagesNotPinned: the target pod pulls an image by the spec's tag, for want of a digest
	// in the instance's status (an instance from before digests were recorded).
	ReasonImagesNotPinned = "ImagesNotPinned"
	// ReasonTargetImageMismatch: the target's node pulled other bytes for an image's tag than the
	// source runs (the tag moved, and the image could not be pinned to a digest).
	ReasonTargetImageMismatch = "TargetImageMismatch"
	// ReasonPolicyTie: more than one MigrationPolicy matches the instance best; the first by name
	// applies.
	ReasonPolicyTie = "MigrationPolicyTie"
)

// action is what the reconciler must do for a decision before the decided phase holds.
type action int

const (
	actNone action = iota
	// actCreateTargetPod creates the target launcher pod; the migration then enters Scheduling.
	actCreateTargetPod
	// actStartMigration writes vmi.status.migrationState (the target pod runs on a node); the
	// migration then enters PreparingTarget.
	actStartMigration
	// actAbort sets migrationState.abortRequested; the migration stays where it is until the node
	// agent reports the failure or the abort grace period ends.
	actAbort
	// actSucceed moves the instance to the target node and deletes the source pod.
	actSucceed
	// actFail marks the instance's migration state failed (when it still is ours and open) and
	// deletes the target pod; the instance keeps running on the source.
	actFail
)

// phaseInput is everything the phase of a migration depends on.
type phaseInput struct {
	// Phase is the migration's current phase ("" is Pending).
	Phase v1alpha1.VirtualMachineInstanceMigrationPhase
	// UID is the migration's UID.
	UID types.UID
	// VMI is the instance to migrate; nil when it does not exist.
	VMI *v1alpha1.VirtualMachineInstance
	// TargetPod is the migration's target launcher pod; nil when there is none.
	TargetPod *corev1.Pod
	// InProgress names another migration of the same instance that goes first; Pending only.
	InProgress string
	// Limit says why the parallel limits hold the migration back; nil when they let it through.
	// Pending only.
	Limit *limitHold
	// Now is the current time.
	Now time.Time
	// CompletionTimeout is how long the migration may run once started; 0 for no limit.
	CompletionTimeout time.Duration
	// AbortRequestedAt is when qvirt asked for an abort; nil when it did not.
	AbortRequestedAt *time.Time
	// AbortGrace is how long to wait for the node agent to confirm an abort, and for an instance
	// status that lags behind this migration to catch up.
	AbortGrace time.Duration
	// PhaseSince is when the migration entered its current phase.
	PhaseSince time.Time
	// ImageMismatches names the target pod's images whose bytes differ from the source's
	// (vmi.ImageMismatches).
	ImageMismatches []string
}

// decision is the phase a migration is in (or enters once Action succeeds), and why.
type decision struct {
	Phase   v1alpha1.VirtualMachineInstanceMigrationPhase
	Reason  string
	Message string
	Action  action
	// RequeueAfter asks to look again after this long, when no watch event is expected.
	RequeueAfter time.Duration
}

var phaseOrder = map[v1alpha1.VirtualMachineInstanceMigrationPhase]int{
	"":                                0,
	v1alpha1.MigrationPending:         0,
	v1alpha1.MigrationScheduling:      1,
	v1alpha1.MigrationScheduled:       2,
	v1alpha1.MigrationPreparingTarget: 3,
	v1alpha1.MigrationTargetReady:     4,
	v1alpha1.MigrationRunning:         5,
	v1alpha1.MigrationSucceeded:       6,
	v1alpha1.MigrationFailed:          6,
}

// isTerminal reports whether a migration is over.
func isTerminal(p v1alpha1.VirtualMachineInstanceMigrationPhase) bool {
	return p == v1alpha1.MigrationSucceeded || p == v1alpha1.MigrationFailed
}

// isInFlight reports whether a migration holds a parallel-migration slot: from the target pod's
// creation until it succeeds or fails.
func isInFlight(p v1alpha1.VirtualMachineInstanceMigrationPhase) bool {
	return phaseOrder[p] >= phaseOrder[v1alpha1.MigrationScheduling] && !isTerminal(p)
}

// ownState returns the instance's migration state when it belongs to migration uid.
func ownState(vmi *v1alpha1.VirtualMachineInstance, uid types.UID) *v1alpha1.VirtualMachineInstanceMigrationState {
	if vmi == nil || vmi.Status.MigrationState == nil || vmi.Status.MigrationState.MigrationUID != uid {
		return nil
	}
	return vmi.Status.MigrationState
}

// openState reports whether a migration state still describes a migration under way.
func openState(ms *v1alpha1.VirtualMachineInstanceMigrationState) bool {
	return ms != nil && ms.MigrationUID != "" && !ms.Completed && !ms.Failed
}

// podEnded reports whether all of a pod's containers have ended.
func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}

// podRunningOnNode reports whether a pod was bound and runs.
func podRunningOnNode(p *corev1.Pod) bool {
	return p != nil && p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning
}

// decidePhase computes a migration's phase from what the cluster shows. It never moves a migration
// backwards: a cache that lags behind what the reconciler wrote keeps the current phase.
func decidePhase(in phaseInput) decision {
	if isTerminal(in.Phase) {
		return decision{Phase: in.Phase}
	}
	fail := func(reason, format string, args ...any) decision {
		return decision{Phase: v1alpha1.MigrationFailed, Reason: reason, Message: fmt.Sprintf(format, args...), Action: actFail}
	}
	if in.VMI == nil {
		return fail(ReasonVMINotFound, "the instance to migrate does not exist")
	}
	ms := ownState(in.VMI, in.UID)
	if ms != nil && ms.Completed && !ms.Failed {
		return decision{Phase: v1alpha1.MigrationSucceeded, Reason: ReasonMigrationSucceeded,
			Message: fmt.Sprintf("the instance runs on node %s", ms.TargetNode), Action: actSucceed}
	}
	if ms != nil && ms.Failed {
		reason := ReasonMigrationFailed
		if in.AbortRequestedAt != nil && ms.AbortRequested {
			reason = ReasonCompletionTimeout
		}
		msg := ms.FailureReason
		if msg == "" {
			msg = "the node agent reported the migration failed"
		}
		return fail(reason, "%s", msg)
	}
	if in.VMI.Status.Phase != v1alpha1.Running {
		return fail(ReasonVMINotRunning, "the instance is %s, not Running", phaseOrNone(in.VMI.Status.Phase))
	}

	current := in.Phase
	if current == "" {
		current = v1alpha1.MigrationPending
	}
	if current == v1alpha1.MigrationPending {
		if ok, reason, msg := v1alpha1.LiveMigratable(&in.VMI.Spec); !ok {
			return fail(reason, "%s", msg)
		}
		// Beyond the spec, the instance's controller judges its claims' access modes.
		if c := meta.FindStatusCondition(in.VMI.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable); c != nil && c.Status == metav1.ConditionFalse {
			return fail(c.Reason, "%s", c.Message)
		}
		if in.InProgress != "" {
			return fail(ReasonMigrationInProgress, "migration %s of the same instance is in progress", in.InProgress)
		}
		if in.TargetPod == nil {
			if in.Limit != nil {
				return decision{Phase: v1alpha1.MigrationPending, Reason: in.Limit.Reason, Message: in.Limit.Message}
			}
			return decision{Phase: v1alpha1.MigrationPending, Reason: ReasonAdmitted, Action: actCreateTargetPod}
		}
		// The target pod exists although the status still says Pending: a status write was lost.
		current = v1alpha1.MigrationScheduling
	}

	tp := in.TargetPod
	if tooLateToAbort(ms) {
		// The target's node agent decides now (or, in post-copy, the guest already runs on the
		// target) (handler/vmisync/switchover.go): failing the
		// migration here makes the source take the guest back, so only a target pod that is gone
		// or has ended (no launcher of it can run the guest) fails it. Timeouts and aborts are too
		// late, and a target pod being deleted is left to its agent, which stops the target QEMU
		// before it fails the migration.
		switch {
		case tp == nil:
			return fail(ReasonTargetPodDeleted, "the target pod is gone after the source handed the guest over")
		case podEnded(tp):
			return fail(ReasonTargetPodFailed, "target pod %s ended (%s) after the source handed the guest over: %s", tp.Name, tp.Status.Phase, tp.Status.Message)
		}
		return decision{Phase: v1alpha1.MigrationRunning}
	}
	switch {
	case tp == nil:
		return fail(ReasonTargetPodDeleted, "the target pod is gone")
	case tp.DeletionTimestamp != nil:
		return fail(ReasonTargetPodDeleted, "target pod %s is being deleted", tp.Name)
	case podEnded(tp):
		return fail(ReasonTargetPodFailed, "target pod %s ended (%s): %s", tp.Name, tp.Status.Phase, tp.Status.Message)
	case len(in.ImageMismatches) > 0:
		// The guest would run on other disk or kernel bytes than it booted from.
		return fail(ReasonTargetImageMismatch, "target pod %s: %s", tp.Name, strings.Join(in.ImageMismatches, "; "))
	}

	var d decision
	switch {
	case ms != nil && ms.StartTimestamp != nil:
		d = decision{Phase: v1alpha1.MigrationRunning}
		if in.CompletionTimeout > 0 {
			deadline := ms.StartTimestamp.Add(in.CompletionTimeout)
			switch {
			case in.Now.Before(deadline):
				d.RequeueAfter = deadline.Sub(in.Now)
			case in.AbortRequestedAt == nil:
				d.Action, d.Reason = actAbort, ReasonCompletionTimeout
				d.Message = fmt.Sprintf("the migration ran longer than %s", in.CompletionTimeout)
				d.RequeueAfter = in.AbortGrace
			case in.Now.Before(in.AbortRequestedAt.Add(in.AbortGrace)):
				d.RequeueAfter = in.AbortRequestedAt.Add(in.AbortGrace).Sub(in.Now)
			default:
				return fail(ReasonCompletionTimeout, "the migration ran longer than %s and the node agent did not confirm the abort within %s",
					in.CompletionTimeout, in.AbortGrace)
			}
		}
	case ms != nil && ms.TargetReady:
		d = decision{Phase: v1alpha1.MigrationTargetReady}
	case ms != nil:
		d = decision{Phase: v1alpha1.MigrationPreparingTarget}
	case podRunningOnNode(tp) && phaseOrder[current] <= phaseOrder[v1alpha1.MigrationScheduled]:
		d = decision{Phase: v1alpha1.MigrationScheduled, Action: actStartMigration,
			Message: fmt.Sprintf("target pod %s runs on node %s", tp.Name, tp.Spec.NodeName)}
	default:
		d = decision{Phase: v1alpha1.MigrationScheduling}
	}
	if phaseOrder[d.Phase] < phaseOrder[current] {
		// The instance's status lags behind what this reconciler already saw or wrote; a cache
		// catches up quickly, a status that lost the migration state does not.
		if !in.PhaseSince.IsZero() && in.Now.After(in.PhaseSince.Add(in.AbortGrace)) {
			return fail(ReasonMigrationStateLost, "the instance's status no longer shows this migration's state")
		}
		return decision{Phase: current, RequeueAfter: time.Second}
	}
	return d
}

func phaseOrNone(p v1alpha1.VirtualMachineInstancePhase) string {
	if p == "" {
		return "without a phase"
	}
	return string(p)
}
