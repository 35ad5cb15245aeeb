package vmi

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// podChanged lets through the launcher pod updates that change something the reconciler reads
// from a pod (podFacts), and drops the rest: a kubelet's status updates that only move readiness,
// conditions' timestamps, IPs or a container from created to running. At a start that is one
// reconcile in seven per instance (BenchmarkStartup, vmi-reconciles-per-vmi), and one more wake-up
// of every worker for nothing after that. Creates and deletes always pass.
func podChanged() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		old, ok := e.ObjectOld.(*corev1.Pod)
		cur, ok2 := e.ObjectNew.(*corev1.Pod)
		if !ok || !ok2 {
			return true
		}
		return !equality.Semantic.DeepEqual(podFacts(old), podFacts(cur))
	}}
}

// podFacts is all the reconciler reads from its launcher pods (launcherPod, podOutcome and
// terminatedPodOutcome, podFailureDetail, imagePullCondition, unscheduledCondition,
// RecordImages): a pod update that leaves it the same cannot change the instance. A new reader of
// another field of the pod adds the field here, or its changes are never seen; it joins
// TestPodReadersSeeOnlyPodFacts's readPod too, which fails for a reader of a field left out.
// What it reads of the spec besides the node (image volumes, mounts, whether there is a liveness
// probe) cannot change on a live pod, nor can the name, UID and creation time.
func podFacts(p *corev1.Pod) corev1.Pod {
	f := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Labels: p.Labels, DeletionTimestamp: p.DeletionTimestamp},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName},
		Status: corev1.PodStatus{
			Phase: p.Status.Phase, Reason: p.Status.Reason, Message: p.Status.Message,
			InitContainerStatuses: containerFacts(p.Status.InitContainerStatuses),
			ContainerStatuses:     containerFacts(p.Status.ContainerStatuses),
		},
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			f.Status.Conditions = append(f.Status.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message})
		}
	}
	return f
}

// containerFacts keeps of each container's status what the reconciler reads: a wait for an image
// (not any other wait: ContainerCreating tells nothing), how it ended, and what the node pulled
// for its image volumes. A container with none of these is left out.
func containerFacts(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, cs := range in {
		f := corev1.ContainerStatus{Name: cs.Name}
		if w := cs.State.Waiting; w != nil && pullWait(w) {
			f.State.Waiting = &corev1.ContainerStateWaiting{Reason: w.Reason, Message: w.Message}
		}
		if t := cs.State.Terminated; t != nil {
			f.State.Terminated = &corev1.ContainerStateTerminated{ExitCode: t.ExitCode, Reason: t.Reason, Message: t.Message}
		}
		for _, m := range cs.VolumeMounts {
			if vs := m.VolumeStatus; vs != nil && vs.Image != nil {
				f.VolumeMounts = append(f.VolumeMounts, corev1.VolumeMountStatus{Name: m.Name, VolumeStatus: &corev1.VolumeStatus{Image: vs.Image}})
			}
		}
		if f.State.Waiting != nil || f.State.Terminated != nil || f.VolumeMounts != nil {
			out = append(out, f)
		}
	}
	return out
}

// pullWait reports whether a container waits for an image it could not pull.
func pullWait(w *corev1.ContainerStateWaiting) bool {
	return w.Reason == v1alpha1.ReasonErrImagePull || w.Reason == v1alpha1.ReasonImagePullBackOff
}
