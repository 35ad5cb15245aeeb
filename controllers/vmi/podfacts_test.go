package vmi

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/randfill"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// Every reader of a launcher pod answers the same for two pods with the same podFacts, whatever
// else differs: random metadata, status and the spec's fields a live pod can change, the same
// facts. So an update the predicate drops
// cannot change the instance, and a reader that starts to read a field podFacts leaves out fails
// here (a new reader joins readPod).
func TestPodReadersSeeOnlyPodFacts(t *testing.T) {
	fill := randfill.NewWithSeed(7).NilChance(0.3).NumElements(0, 3).Funcs(
		func(tm *metav1.Time, c randfill.Continue) { *tm = metav1.Unix(c.Int63n(1<<31), 0) },
		func(q *resource.Quantity, c randfill.Continue) {
			*q = *resource.NewQuantity(c.Int63n(1<<20), resource.BinarySI)
		},
		// The kubelet's own words, so that a reader of one of them is found (random text never is).
		func(w *corev1.ContainerStateWaiting, c randfill.Continue) {
			w.Reason = oneOf(c, "ContainerCreating", "PodInitializing", "CreateContainerError", "CreateContainerConfigError",
				"CrashLoopBackOff", "InvalidImageName", "ImageInspectError", "ErrImageNeverPull", "RunContainerError")
			c.Fill(&w.Message)
		},
		func(ct *corev1.PodConditionType, c randfill.Continue) {
			*ct = oneOf(c, corev1.PodReady, corev1.ContainersReady, corev1.PodInitialized, corev1.DisruptionTarget,
				corev1.PodReadyToStartContainers, corev1.PodResizePending, corev1.PodResizeInProgress)
		},
		func(cs *corev1.ConditionStatus, c randfill.Continue) {
			*cs = oneOf(c, corev1.ConditionTrue, corev1.ConditionFalse, corev1.ConditionUnknown)
		},
	)
	bases := podFactBases()
	for _, name := range slices.Sorted(maps.Keys(bases)) {
		base := bases[name]
		want := readPod(base)
		for i := range 200 {
			other := withFactsOf(base, fill)
			if !equality.Semantic.DeepEqual(podFacts(base), podFacts(other)) {
				t.Fatalf("%s: the test's pod %d has other facts than its base", name, i)
			}
			for what, got := range readPod(other) {
				if !reflect.DeepEqual(got, want[what]) {
					t.Fatalf("%s: %s reads a pod with the same facts differently:\n got  %s\n want %s\npod: %s",
						name, what, asJSON(got), asJSON(want[what]), asJSON(other))
				}
			}
		}
	}
}

func asJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%+v", v)
	}
	return string(b)
}

func oneOf[T any](c randfill.Continue, v ...T) T { return v[c.Intn(len(v))] }

// readPod is what each reader makes of pod, for an instance in each phase, by reader.
func readPod(pod *corev1.Pod) map[string]any {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: "uid-1"}}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
		ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example/disk:1"}}}}
	out := map[string]any{}
	add := func(what string, v any) { out[what] = v }
	for _, cur := range []v1alpha1.VirtualMachineInstancePhase{"", v1alpha1.Pending, v1alpha1.Scheduling,
		v1alpha1.Scheduled, v1alpha1.Running, v1alpha1.Succeeded, v1alpha1.Failed} {
		add("podOutcome "+string(cur), podOutcome(cur, pod))
		vmi.Status.Phase = cur
		add("imagePullCondition "+string(cur), imagePullCondition(vmi, pod))
		add("unscheduledCondition "+string(cur), unscheduledCondition(vmi, pod))
	}
	var st v1alpha1.VirtualMachineInstanceStatus
	RecordImages(&st, pod)
	add("RecordImages", st)
	for _, node := range []string{"", "node-1"} {
		vmi.Status.NodeName = node
		add("launcherPod on "+node, launcherPod(vmi, []corev1.Pod{*pod}) != nil)
	}
	return out
}

// withFactsOf is a pod with base's facts and random everything else, but for what cannot change
// on a live pod: its name, UID, creation time and the spec but for the node, the containers'
// images and resources, the deadline, tolerations and scheduling gates.
func withFactsOf(base *corev1.Pod, fill *randfill.Filler) *corev1.Pod {
	p := &corev1.Pod{}
	fill.Fill(&p.ObjectMeta)
	fill.Fill(&p.Status)
	p.Name, p.Namespace, p.UID, p.CreationTimestamp = base.Name, base.Namespace, base.UID, base.CreationTimestamp
	p.Labels, p.DeletionTimestamp = base.Labels, base.DeletionTimestamp
	p.Spec = *base.Spec.DeepCopy()
	for _, cs := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
		for i := range cs {
			fill.Fill(&cs[i].Image)
			fill.Fill(&cs[i].Resources)
		}
	}
	fill.Fill(&p.Spec.ActiveDeadlineSeconds)
	fill.Fill(&p.Spec.Tolerations)
	fill.Fill(&p.Spec.SchedulingGates)
	p.Status.Phase, p.Status.Reason, p.Status.Message = base.Status.Phase, base.Status.Reason, base.Status.Message
	var conds []corev1.PodCondition
	for _, c := range p.Status.Conditions {
		if c.Type != corev1.PodScheduled {
			conds = append(conds, c)
		}
	}
	for _, c := range base.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			fill.Fill(&c.LastProbeTime)
			fill.Fill(&c.LastTransitionTime)
			conds = append(conds, c)
		}
	}
	p.Status.Conditions = conds
	p.Status.InitContainerStatuses = containersWithFactsOf(base.Status.InitContainerStatuses, p.Status.InitContainerStatuses, fill)
	p.Status.ContainerStatuses = containersWithFactsOf(base.Status.ContainerStatuses, p.Status.ContainerStatuses, fill)
	return p
}

// containersWithFactsOf is random container statuses without facts, then base's containers with
// their facts and random everything else.
func containersWithFactsOf(base, random []corev1.ContainerStatus, fill *randfill.Filler) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for _, cs := range random {
		out = append(out, withoutFacts(cs))
	}
	for _, b := range base {
		var cs corev1.ContainerStatus
		fill.Fill(&cs)
		cs = withoutFacts(cs)
		cs.Name = b.Name
		if w := b.State.Waiting; w != nil && pullWait(w) {
			cs.State.Waiting = w.DeepCopy()
		}
		if bt := b.State.Terminated; bt != nil {
			t := &corev1.ContainerStateTerminated{}
			fill.Fill(t)
			t.ExitCode, t.Reason, t.Message = bt.ExitCode, bt.Reason, bt.Message
			cs.State.Terminated = t
		}
		for _, m := range b.VolumeMounts {
			if m.VolumeStatus != nil && m.VolumeStatus.Image != nil {
				var r corev1.VolumeMountStatus
				fill.Fill(&r)
				r.Name, r.VolumeStatus = m.Name, &corev1.VolumeStatus{Image: m.VolumeStatus.Image.DeepCopy()}
				cs.VolumeMounts = append(cs.VolumeMounts, r)
			}
		}
		out = append(out, cs)
	}
	return out
}

// withoutFacts drops what containerFacts keeps of a container's status.
func withoutFacts(cs corev1.ContainerStatus) corev1.ContainerStatus {
	if w := cs.State.Waiting; w != nil && pullWait(w) {
		cs.State.Waiting = nil
	}
	cs.State.Terminated = nil
	var mounts []corev1.VolumeMountStatus
	for _, m := range cs.VolumeMounts {
		if m.VolumeStatus != nil {
			m.VolumeStatus.Image = nil
		}
		mounts = append(mounts, m)
	}
	cs.VolumeMounts = mounts
	return cs
}

// podFactBases are launcher pods in each state the readers tell apart.
func podFactBases() map[string]*corev1.Pod {
	t0 := metav1.NewTime(time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC))
	base := func(change func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "qvirt-launcher-vm-x", Namespace: "ns", UID: "pod-1", CreationTimestamp: t0,
				Labels: map[string]string{v1alpha1.VMIUIDLabel: "uid-1"}},
			Spec: corev1.PodSpec{
				NodeName: "node-1",
				Containers: []corev1.Container{{Name: podlayout.ComputeContainer, LivenessProbe: &corev1.Probe{},
					VolumeMounts: []corev1.VolumeMount{{Name: "disk-root", MountPath: podlayout.ContainerDiskDir + "/root"}}}},
				Volumes: []corev1.Volume{{Name: "disk-root", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "example/disk:1"}}}},
			},
			Status: corev1.PodStatus{
				Phase:      corev1.PodPending,
				Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: t0}},
			},
		}
		change(p)
		return p
	}
	compute := func(st corev1.ContainerState, mounts ...corev1.VolumeMountStatus) []corev1.ContainerStatus {
		return []corev1.ContainerStatus{{Name: podlayout.ComputeContainer, State: st, VolumeMounts: mounts}}
	}
	digest := corev1.VolumeMountStatus{Name: "disk-root", VolumeStatus: &corev1.VolumeStatus{
		Image: &corev1.ImageVolumeStatus{ImageRef: "example/disk@sha256:aa"}}}
	return map[string]*corev1.Pod{
		"scheduled": base(func(*corev1.Pod) {}),
		"unschedulable": base(func(p *corev1.Pod) {
			p.Spec.NodeName = ""
			p.Status.Conditions[0] = corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: "Unschedulable", Message: "0/2 nodes are available"}
		}),
		"a pull error": base(func(p *corev1.Pod) {
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", State: corev1.ContainerState{
				Waiting: &corev1.ContainerStateWaiting{Reason: v1alpha1.ReasonErrImagePull, Message: "pull example/disk:1: not found"}}}}
			p.Status.ContainerStatuses = compute(corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason: v1alpha1.ReasonImagePullBackOff, Message: "back-off pulling example/disk:1"}})
		}),
		"running": base(func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = compute(corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t0}}, digest)
		}),
		"a migration target, running": base(func(p *corev1.Pod) {
			p.Labels = map[string]string{v1alpha1.VMIUIDLabel: "uid-1", v1alpha1.MigrationUIDLabel: "m-1"}
			p.Status.Phase = corev1.PodRunning
		}),
		"deleted while running": base(func(p *corev1.Pod) {
			p.DeletionTimestamp = &t0
			p.Status.Phase = corev1.PodRunning
		}),
		"failed": base(func(p *corev1.Pod) {
			p.Status.Phase, p.Status.Reason, p.Status.Message = corev1.PodFailed, "Evicted", "The node was low on resource: memory."
			p.Status.ContainerStatuses = compute(corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 137, Reason: "OOMKilled", Message: "qemu: killed"}})
		}),
		"stopped by its liveness probe": base(func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodSucceeded
			p.Status.ContainerStatuses = compute(corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				Reason: "Completed", Message: podlayout.TerminatedMessagePrefix + "SIGTERM"}}, digest)
		}),
		"succeeded": base(func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodSucceeded
			p.Status.ContainerStatuses = compute(corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}})
		}),
	}
}
