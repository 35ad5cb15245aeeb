package migration

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// ReasonPostCopyUnavailable: a migration allowed to switch to post-copy cannot (Event, and the
// reason of ConditionPostCopyUnavailable).
const ReasonPostCopyUnavailable = "PostCopyUnavailable"

// ConditionPostCopyUnavailable is True on a migration whose settings allow post-copy when it
// cannot use it; its message says why.
const ConditionPostCopyUnavailable = "PostCopyUnavailable"

// noPostCopy says why a migration whose settings allow post-copy cannot use it ("" when it can,
// or when they do not allow it): the instance has local disks, whose copy must be complete
// before the guest runs on the target, or the target node does not give launchers userfaultfd
// (its node agent's label).
func (r *Reconciler) noPostCopy(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, cfg *v1alpha1.MigrationConfiguration, targetNode string) (string, error) {
	if !cfg.PostCopy() {
		return "", nil
	}
	if disks := v1alpha1.LocalDisks(&vmi.Spec); len(disks) > 0 {
		return fmt.Sprintf("the instance has local disks (%s), which are copied in pre-copy only", disks[0]), nil
	}
	var node corev1.Node
	if err := r.Client.Get(ctx, client.ObjectKey{Name: targetNode}, &node); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	if node.Labels[v1alpha1.NodePostCopyLabel] == "true" {
		return "", nil
	}
	why := node.Annotations[v1alpha1.NodePostCopyReasonAnnotation]
	if why == "" {
		why = "its node agent has not reported it"
	}
	return fmt.Sprintf("target node %s does not give launchers userfaultfd (%s=%q: %s)", targetNode, v1alpha1.NodePostCopyLabel,
		node.Labels[v1alpha1.NodePostCopyLabel], why), nil
}

// tooLateToAbort: the source has handed the guest over (the target's agent decides who runs
// it), or the migration switched to post-copy (the guest runs on the target): deleting the
// target pod then would lose the guest, and the source can no longer cancel.
func tooLateToAbort(ms *v1alpha1.VirtualMachineInstanceMigrationState) bool {
	return ms != nil && (ms.SourceHandedOver || ms.Mode == v1alpha1.MigrationPostCopy)
}

// completionDeadline is how long the migration in ms may run before qvirt aborts it, given its
// completion timeout: none once it switched to post-copy (it cannot be cancelled, and completes
// by itself), twice the timeout while it may still switch (its source launcher switches at the
// timeout; this only catches a switch that did not happen), the timeout otherwise.
func completionDeadline(ms *v1alpha1.VirtualMachineInstanceMigrationState, timeout time.Duration) time.Duration {
	switch {
	case ms == nil:
		return timeout
	case ms.Mode == v1alpha1.MigrationPostCopy:
		return 0
	case ms.MigrationConfiguration.PostCopy():
		return 2 * timeout
	}
	return timeout
}
