package vmi

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/internal/patch"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/machine"
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
		if o, ok := terminatedPodOutcome(pod); ok {
			return o
		}
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

// terminatedPodOutcome is the node agent's end for a launcher that stopped its guest because it was
// told to stop (its termination message says so) while the pod stays, as after the kubelet's
// liveness kill: Failed, not Succeeded. The node agent says the same when it reads the launcher's
// status in time; this covers a launcher that exited first.
func terminatedPodOutcome(pod *corev1.Pod) (outcome, bool) {
	if !pod.DeletionTimestamp.IsZero() {
		return outcome{}, false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		t := cs.State.Terminated
		if cs.Name != podlayout.ComputeContainer || t == nil {
			continue
		}
		how, ok := strings.CutPrefix(t.Message, podlayout.TerminatedMessagePrefix)
		if !ok {
			return outcome{}, false
		}
		phase, reason, msg := vmisync.TerminatedOutcome(pod, vmisync.GuestEndedMessage(how))
		return outcome{Phase: phase, Reason: reason, EventType: corev1.EventTypeWarning,
			EventReason: vmisync.EventGuestEnded, EventMessage: msg}, true
	}
	return outcome{}, false
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

// setLiveMigratable sets the LiveMigratable condition from the spec and its claims' access modes,
// and the migration method from the disks.
func setLiveMigratable(vmi *v1alpha1.VirtualMachineInstance, claims Claims, emulation bool) {
	ok, reason, msg := v1alpha1.LiveMigratable(&vmi.Spec)
	if m := vmi.Spec.Domain.Memory; ok && emulation && m != nil && m.Hugepages != nil {
		// The source launcher would refuse it (launcher/migration.go): say so before a target
		// pod holds huge pages on another node.
		ok, reason = false, v1alpha1.HugepagesUnderEmulationReason
		msg = "memory.hugepages under emulation (useEmulation): " + machine.HugePagesTCGMigration
	}
	if m, g := vmi.Spec.Domain.Memory, v1alpha1.GuestMemory(&vmi.Spec.Domain); ok && emulation && m != nil && m.MaxGuest != nil && g != nil && m.MaxGuest.Cmp(*g) > 0 {
		ok, reason = false, v1alpha1.MemoryHotplugUnderEmulationReason
		msg = "memory.maxGuest under emulation (useEmulation): " + machine.MemoryHotplugTCGMigration
	}
	if vol, claim, modes := unsharedClaim(&vmi.Spec, claims); ok && claim != "" {
		ok, reason = false, v1alpha1.DisksNotLiveMigratableReason
		msg = fmt.Sprintf("volume %q uses PersistentVolumeClaim %q with access modes %v: live migration needs claims that are ReadWriteMany "+
			"(or ReadOnlyMany, attached read-only), which the target's node can attach while the source still has them", vol, claim, modes)
	}
	if m := unsharedState(vmi, claims); ok && m != "" {
		ok, reason, msg = false, v1alpha1.PersistentStateReason, m
	}
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	vmi.Status.MigrationMethod = v1alpha1.LiveMigration
	if len(v1alpha1.LocalDisks(&vmi.Spec)) > 0 {
		vmi.Status.MigrationMethod = v1alpha1.BlockMigration
	}
	patch.SetCondition(&vmi.Status.Conditions, vmi, metav1.Condition{
		Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: status, Reason: reason, Message: msg,
	})
}

// imagePullCondition is the Synchronized condition the launcher pod's images call for: false with
// the kubelet's waiting reason (ErrImagePull, ImagePullBackOff) and its message while a container
// of the pod waits for an image or an image volume, nil while none does. KubeVirt's virt-controller
// reports a launcher pod's image errors the same way; the VirtualMachine shows the reason as its
// status. The kubelet (or a virtual node) retries the pull with back-off meanwhile.
func imagePullCondition(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) *metav1.Condition {
	if pod == nil {
		return nil
	}
	statuses := append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...)
	for _, cs := range statuses {
		w := cs.State.Waiting
		if w == nil || !pullWait(w) {
			continue
		}
		msg := fmt.Sprintf("launcher pod %s, container %s: %s", pod.Name, cs.Name, w.Message)
		if fields := imageFields(&vmi.Spec, w.Message); len(fields) > 0 {
			msg = strings.Join(fields, ", ") + ": " + msg
		}
		return &metav1.Condition{Type: v1alpha1.VirtualMachineInstanceSynchronized, Status: metav1.ConditionFalse, Reason: w.Reason, Message: msg}
	}
	return nil
}

// imageFields are the spec fields whose image a kubelet's pull message names, so the condition
// says which volume's image cannot be had. The kubelet names the image, not the volume.
func imageFields(spec *v1alpha1.VirtualMachineInstanceSpec, message string) []string {
	var out []string
	if fw := spec.Domain.Firmware; fw != nil && fw.KernelBoot != nil && fw.KernelBoot.Container != nil &&
		strings.Contains(message, fw.KernelBoot.Container.Image) {
		out = append(out, "spec.domain.firmware.kernelBoot.container.image")
	}
	for _, v := range spec.Volumes {
		if v.ContainerDisk != nil && v.ContainerDisk.Image != "" && strings.Contains(message, v.ContainerDisk.Image) {
			out = append(out, "spec.volumes["+v.Name+"].containerDisk.image")
		}
	}
	return out
}

// setImagePullCondition records imagePullCondition on an instance that has not ended. Once the pod
// no longer waits for an image, a Synchronized condition of those reasons is removed; the node
// agent owns the condition's other reasons (and sets it true once it runs the launcher).
func setImagePullCondition(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) {
	if vmi.Status.Phase.Final() {
		return
	}
	if c := imagePullCondition(vmi, pod); c != nil {
		patch.SetCondition(&vmi.Status.Conditions, vmi, *c)
		return
	}
	cur := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
	if cur != nil && (cur.Reason == v1alpha1.ReasonErrImagePull || cur.Reason == v1alpha1.ReasonImagePullBackOff) {
		meta.RemoveStatusCondition(&vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
	}
}

// setPodScheduledCondition mirrors the launcher pod's PodScheduled=False condition while the
// instance waits for a node, so the user reads why (the scheduler's message: not enough memory,
// no node matching the selector) on the instance and the VirtualMachine says Unschedulable. Once
// the pod is placed, or the instance has a node or has ended, the mirrored condition is removed:
// KubeVirt's virt-controller keeps the condition only while it explains a wait.
func setPodScheduledCondition(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) {
	if c := unscheduledCondition(vmi, pod); c != nil {
		patch.SetCondition(&vmi.Status.Conditions, vmi, *c)
		return
	}
	meta.RemoveStatusCondition(&vmi.Status.Conditions, v1alpha1.VirtualMachineInstancePodScheduled)
}

// unscheduledCondition is the condition to mirror: the pod's own PodScheduled=False while the
// instance is not yet placed, nil otherwise.
func unscheduledCondition(vmi *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) *metav1.Condition {
	if pod == nil || vmi.Status.Phase.Final() || vmi.Status.NodeName != "" {
		return nil
	}
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodScheduled || c.Status != corev1.ConditionFalse {
			continue
		}
		return &metav1.Condition{Type: v1alpha1.VirtualMachineInstancePodScheduled, Status: metav1.ConditionFalse,
			Reason: c.Reason, Message: fmt.Sprintf("launcher pod %s: %s", pod.Name, c.Message)}
	}
	return nil
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
