package vmi

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/patch"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// Values of status.reason set by the VMI reconciler.
const (
	// ReasonPodFailed: the launcher pod ended in phase Failed.
	ReasonPodFailed = "PodFailed"
	// ReasonPodDeleted: the launcher pod disappeared before the instance ended.
	ReasonPodDeleted = "PodDeleted"
	// ReasonPodSucceeded: the launcher pod exited successfully (the launcher exits 0 only after
	// the guest powered off) before the node agent reported the end.
	ReasonPodSucceeded = "PodSucceeded"
)

// Event reasons, for `kubectl describe vmi`.
const (
	EventSuccessfulCreate = "SuccessfulCreate"
	EventFailedCreate     = "FailedCreate"
	EventScheduled        = "Scheduled"
	EventPodFailed        = "PodFailed"
	EventPodDeleted       = "PodDeleted"
	EventPodSucceeded     = "PodSucceeded"
	EventSuccessfulDelete = "SuccessfulDelete"
	EventFailedDelete     = "FailedDelete"
)

// outcome is what the launcher pod says about the instance: the phase to move to (the current one
// when nothing changes), and for a move the reason, node and the Event telling a user.
type outcome struct {
	Phase  v1alpha1.VirtualMachineInstancePhase
	Reason string
	// Node and PodUID are set when the instance becomes Scheduled.
	Node   string
	PodUID types.UID
	// Event is empty when there is nothing to tell.
	EventType, EventReason, EventMessage string
}

// podOutcome decides the instance's phase from its current phase and its launcher pod (nil when it
// has none). The reconciler owns Pending, Scheduling and Scheduled, and ends an instance whose pod
// failed or vanished; the node agent owns Running, Succeeded and Failed from the guest. The caller
// must not call it for a missing pod while a create is in flight (see Expectations).
func podOutcome(cur v1alpha1.VirtualMachineInstancePhase, pod *corev1.Pod) outcome {
	same := outcome{Phase: cur}
	if cur.Final() {
		return same
	}
	if pod == nil {
		switch cur {
		case "", v1alpha1.Pending:
			return outcome{Phase: v1alpha1.Pending}
		default:
			return outcome{
				Phase: v1alpha1.Failed, Reason: ReasonPodDeleted,
				EventType: corev1.EventTypeWarning, EventReason: EventPodDeleted,
				EventMessage: fmt.Sprintf("Launcher pod disappeared while the instance was %s", cur),
			}
		}
	}
	switch pod.Status.Phase {
	case corev1.PodFailed:
		return outcome{
			Phase: v1alpha1.Failed, Reason: ReasonPodFailed,
			EventType: corev1.EventTypeWarning, EventReason: EventPodFailed,
			EventMessage: fmt.Sprintf("Launcher pod %s failed%s", pod.Name, podFailureDetail(pod)),
		}
	case corev1.PodSucceeded:
		return outcome{
			Phase: v1alpha1.Succeeded, Reason: ReasonPodSucceeded,
			EventType: corev1.EventTypeNormal, EventReason: EventPodSucceeded,
			EventMessage: fmt.Sprintf("Launcher pod %s exited successfully", pod.Name),
		}
	case corev1.PodRunning:
		if pod.Spec.NodeName != "" && (cur == "" || cur == v1alpha1.Pending || cur == v1alpha1.Scheduling) {
			return outcome{
				Phase: v1alpha1.Scheduled, Node: pod.Spec.NodeName, PodUID: pod.UID,
				EventType: corev1.EventTypeNormal, EventReason: EventScheduled,
				EventMessage: fmt.Sprintf("Launcher pod %s running on node %s", pod.Name, pod.Spec.NodeName),
			}
		}
	}
	if cur == "" || cur == v1alpha1.Pending {
		return outcome{Phase: v1alpha1.Scheduling}
	}
	return same
}

// podFailureDetail is ": <reason>: <message>" from the pod or its compute container, if any.
func podFailureDetail(pod *corev1.Pod) string {
	var parts []string
	if pod.Status.Reason != "" {
		parts = append(parts, pod.Status.Reason)
	}
	if pod.Status.Message != "" {
		parts = append(parts, pod.Status.Message)
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if t := cs.State.Terminated; cs.Name == podlayout.ComputeContainer && t != nil {
			s := fmt.Sprintf("container %s exited with code %d", cs.Name, t.ExitCode)
			if t.Reason != "" {
				s += " (" + t.Reason + ")"
			}
			if t.Message != "" {
				s += ": " + t.Message
			}
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return ": " + strings.Join(parts, ": ")
}

// applyOutcome writes an outcome into the status, appending a phase transition timestamp when the
// phase changes.
func applyOutcome(st *v1alpha1.VirtualMachineInstanceStatus, o outcome, now metav1.Time) {
	st.SetPhase(o.Phase, now)
	if o.Reason != "" {
		st.Reason = o.Reason
	}
	if o.Node != "" {
		st.NodeName = o.Node
		if st.ActivePods == nil {
			st.ActivePods = map[types.UID]string{}
		}
		st.ActivePods[o.PodUID] = o.Node
	}
}

// setLiveMigratable sets the LiveMigratable condition from the spec and its claims' access modes.
func setLiveMigratable(vmi *v1alpha1.VirtualMachineInstance, claims Claims) {
	ok, reason, msg := v1alpha1.LiveMigratable(&vmi.Spec)
	if vol, claim, modes := unsharedClaim(&vmi.Spec, claims); ok && claim != "" {
		ok, reason = false, v1alpha1.DisksNotLiveMigratableReason
		msg = fmt.Sprintf("volume %q uses PersistentVolumeClaim %q with access modes %v: live migration needs claims that are ReadWriteMany "+
			"(or ReadOnlyMany, attached read-only), which the target's node can attach while the source still has them", vol, claim, modes)
	}
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	patch.SetCondition(&vmi.Status.Conditions, vmi, metav1.Condition{
		Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: status, Reason: reason, Message: msg,
	})
}

// launcherPod picks the instance's own launcher pod from the pods carrying its UID label: the one on
// status.nodeName once a node is known (after a migration that is the target's pod, so removing the
// source pod does not end the instance), otherwise the pod without the migration label. Among
// several candidates (there should be none) the oldest wins, so the choice is stable. Nil when none.
func launcherPod(vmi *v1alpha1.VirtualMachineInstance, pods []corev1.Pod) *corev1.Pod {
	var cands []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.Labels[v1alpha1.VMIUIDLabel] != string(vmi.UID) {
			continue
		}
		if node := vmi.Status.NodeName; node != "" {
			if p.Spec.NodeName == node {
				cands = append(cands, p)
			}
		} else if _, target := p.Labels[v1alpha1.MigrationUIDLabel]; !target {
			cands = append(cands, p)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		_, aActive := vmi.Status.ActivePods[a.UID]
		_, bActive := vmi.Status.ActivePods[b.UID]
		if aActive != bActive {
			return aActive
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return cands[0]
}
