package vmi

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// A launcher pod's update reconciles its instance when it changes what the reconciler reads, and
// not when a kubelet only reports progress the instance does not show.
func TestPodUpdatesThatReconcile(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))
	// As the scheduler leaves it: bound, PodScheduled, the compute container not started.
	base := func() *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "qvirt-launcher-vm-x", Namespace: "ns", ResourceVersion: "10",
				Labels: map[string]string{v1alpha1.VMIUIDLabel: "uid-1"}},
			Spec: corev1.PodSpec{NodeName: "node-1"},
			Status: corev1.PodStatus{
				Phase:      corev1.PodPending,
				Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: t0}},
			},
		}
	}
	compute := func(p *corev1.Pod, st corev1.ContainerState) {
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: podlayout.ComputeContainer, State: st}}
	}
	cases := []struct {
		name   string
		change func(*corev1.Pod)
		want   bool
	}{
		{"resourceVersion only", func(p *corev1.Pod) { p.ResourceVersion = "11" }, false},
		{"the kubelet's first status: containers creating", func(p *corev1.Pod) {
			p.Status.HostIP, p.Status.StartTime = "10.0.0.1", &t0
			p.Status.Conditions = append(p.Status.Conditions,
				corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: t0},
				corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", LastTransitionTime: t0})
			compute(p, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}})
		}, false},
		{"a condition's timestamp", func(p *corev1.Pod) { p.Status.Conditions[0].LastProbeTime = t0 }, false},
		{"readiness", func(p *corev1.Pod) {
			p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue})
		}, false},
		{"an annotation", func(p *corev1.Pod) { p.Annotations = map[string]string{"k8s.v1.cni.cncf.io/network-status": "[]"} }, false},
		{"running", func(p *corev1.Pod) {
			p.Status.Phase, p.Status.PodIP = corev1.PodRunning, "10.244.0.5"
			compute(p, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t0}})
		}, true},
		{"a node", func(p *corev1.Pod) { p.Spec.NodeName = "node-2" }, true},
		{"deleted", func(p *corev1.Pod) { p.DeletionTimestamp = &t0 }, true},
		{"a label", func(p *corev1.Pod) { p.Labels[v1alpha1.MigrationUIDLabel] = "m-1" }, true},
		{"unschedulable", func(p *corev1.Pod) {
			p.Status.Conditions[0] = corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/2 nodes are available"}
		}, true},
		{"an image that cannot be pulled", func(p *corev1.Pod) {
			compute(p, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: v1alpha1.ReasonImagePullBackOff, Message: "back-off pulling example/disk:1"}})
		}, true},
		{"the container ended", func(p *corev1.Pod) {
			compute(p, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "qemu: error"}})
		}, true},
		{"the pod failed", func(p *corev1.Pod) { p.Status.Phase, p.Status.Reason = corev1.PodFailed, "Evicted" }, true},
		{"the pod's message", func(p *corev1.Pod) { p.Status.Message = "The node was low on resource: memory." }, true},
		{"an init container's image cannot be pulled", func(p *corev1.Pod) {
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", State: corev1.ContainerState{
				Waiting: &corev1.ContainerStateWaiting{Reason: v1alpha1.ReasonErrImagePull}}}}
		}, true},
		{"an image volume's digest", func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: podlayout.ComputeContainer, VolumeMounts: []corev1.VolumeMountStatus{{
				Name: "disk-root", VolumeStatus: &corev1.VolumeStatus{Image: &corev1.ImageVolumeStatus{ImageRef: "example/disk@sha256:aa"}}}}}}
		}, true},
	}
	pred := podChanged()
	for _, c := range cases {
		old, cur := base(), base()
		c.change(cur)
		if got := pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur}); got != c.want {
			t.Errorf("%s: reconcile = %v, want %v", c.name, got, c.want)
		}
	}
	// How a container ended: its reason and message are in the instance's Event.
	old, cur := base(), base()
	compute(old, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}})
	compute(cur, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: podlayout.TerminatedMessagePrefix + "guest shutdown"}})
	if !pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur}) {
		t.Error("a terminated container's message came: no reconcile")
	}
	// Scheduled after all: the instance's mirrored PodScheduled=False goes.
	old, cur = base(), base()
	old.Status.Conditions[0] = corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable"}
	if !pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur}) {
		t.Error("scheduled after being unschedulable: no reconcile")
	}
	// An image pull error that clears (the pull succeeded) must reach the instance's condition.
	old, cur = base(), base()
	compute(old, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: v1alpha1.ReasonErrImagePull}})
	compute(cur, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}})
	if !pred.Update(event.UpdateEvent{ObjectOld: old, ObjectNew: cur}) {
		t.Error("a pull error that cleared: no reconcile")
	}
}
