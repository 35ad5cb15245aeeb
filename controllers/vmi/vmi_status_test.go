package vmi

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

func testPod(phase corev1.PodPhase, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "qvirt-launcher-demo-abcde", UID: "pod-uid"},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: phase},
	}
}

func TestPodOutcome(t *testing.T) {
	failed := testPod(corev1.PodFailed, "node-1")
	failed.Status.Reason = "Evicted"
	failed.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: podlayout.ComputeContainer, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"},
	}}}
	// The kubelet killed the compute container for its liveness probe; the launcher powered the
	// guest off and exited 0 before the node agent read its status.
	livenessKilled := testPod(corev1.PodSucceeded, "node-1")
	livenessKilled.Spec.Containers = []corev1.Container{{Name: podlayout.ComputeContainer,
		LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(81)}}}}}
	livenessKilled.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: podlayout.ComputeContainer, State: corev1.ContainerState{
		Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", Message: podlayout.TerminatedMessagePrefix + "guest shutdown"},
	}}}
	// As the controller's cache holds it: the spec trimmed (CacheTransform).
	cached, err := CacheTransform(livenessKilled.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	deletedAfterStop := livenessKilled.DeepCopy()
	deletedAfterStop.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	poweredOff := livenessKilled.DeepCopy()
	poweredOff.Status.ContainerStatuses[0].State.Terminated.Message = "guest shutdown"
	cases := []struct {
		name        string
		cur         v1alpha1.VirtualMachineInstancePhase
		pod         *corev1.Pod
		phase       v1alpha1.VirtualMachineInstancePhase
		reason      string
		node        string
		event       string
		wantMessage string
	}{
		{name: "new instance without pod waits in Pending", cur: "", phase: v1alpha1.Pending},
		{name: "Pending without pod stays", cur: v1alpha1.Pending, phase: v1alpha1.Pending},
		{name: "pod waiting for a node", cur: v1alpha1.Pending, pod: testPod(corev1.PodPending, ""), phase: v1alpha1.Scheduling},
		{name: "pod found by a fresh controller", cur: "", pod: testPod(corev1.PodPending, ""), phase: v1alpha1.Scheduling},
		{name: "bound but not running yet", cur: v1alpha1.Scheduling, pod: testPod(corev1.PodPending, "node-1"), phase: v1alpha1.Scheduling},
		{name: "pod running on a node", cur: v1alpha1.Scheduling, pod: testPod(corev1.PodRunning, "node-1"),
			phase: v1alpha1.Scheduled, node: "node-1", event: EventScheduled,
			wantMessage: "Launcher pod qvirt-launcher-demo-abcde running on node node-1"},
		{name: "Scheduled stays for the node agent", cur: v1alpha1.Scheduled, pod: testPod(corev1.PodRunning, "node-1"), phase: v1alpha1.Scheduled},
		{name: "Running is the node agent's", cur: v1alpha1.Running, pod: testPod(corev1.PodRunning, "node-1"), phase: v1alpha1.Running},
		{name: "pod failed", cur: v1alpha1.Running, pod: failed, phase: v1alpha1.Failed, reason: ReasonPodFailed, event: EventPodFailed,
			wantMessage: "Launcher pod qvirt-launcher-demo-abcde failed: Evicted: container compute exited with code 2 (Error)"},
		{name: "pod failed while scheduling", cur: v1alpha1.Scheduling, pod: testPod(corev1.PodFailed, ""), phase: v1alpha1.Failed, reason: ReasonPodFailed, event: EventPodFailed},
		{name: "pod deleted while Scheduled", cur: v1alpha1.Scheduled, phase: v1alpha1.Failed, reason: ReasonPodDeleted, event: EventPodDeleted,
			wantMessage: "Launcher pod disappeared while the instance was Scheduled"},
		{name: "pod deleted while Running", cur: v1alpha1.Running, phase: v1alpha1.Failed, reason: ReasonPodDeleted, event: EventPodDeleted},
		{name: "pod deleted while Scheduling", cur: v1alpha1.Scheduling, phase: v1alpha1.Failed, reason: ReasonPodDeleted, event: EventPodDeleted},
		{name: "launcher exited cleanly", cur: v1alpha1.Running, pod: testPod(corev1.PodSucceeded, "node-1"), phase: v1alpha1.Succeeded, reason: ReasonPodSucceeded, event: EventPodSucceeded},
		{name: "liveness kill the node agent missed", cur: v1alpha1.Running, pod: livenessKilled, phase: v1alpha1.Failed,
			reason: vmisync.ReasonLivenessProbeFailed, event: vmisync.EventGuestEnded,
			wantMessage: "The kubelet stopped the launcher pod's compute container: spec.livenessProbe failed. The guest ended: guest shutdown"},
		{name: "liveness kill the node agent missed, pod from the cache", cur: v1alpha1.Running, pod: cached.(*corev1.Pod), phase: v1alpha1.Failed,
			reason: vmisync.ReasonLivenessProbeFailed, event: vmisync.EventGuestEnded},
		{name: "launcher stopped for its pod's deletion", cur: v1alpha1.Running, pod: deletedAfterStop, phase: v1alpha1.Succeeded, reason: ReasonPodSucceeded, event: EventPodSucceeded},
		{name: "guest powered off by itself", cur: v1alpha1.Running, pod: poweredOff, phase: v1alpha1.Succeeded, reason: ReasonPodSucceeded, event: EventPodSucceeded},
		{name: "Failed is final", cur: v1alpha1.Failed, phase: v1alpha1.Failed},
		{name: "Succeeded is final even with a failed pod", cur: v1alpha1.Succeeded, pod: testPod(corev1.PodFailed, "node-1"), phase: v1alpha1.Succeeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := podOutcome(tc.cur, tc.pod)
			if o.Phase != tc.phase || o.Reason != tc.reason || o.Node != tc.node || o.EventReason != tc.event {
				t.Fatalf("podOutcome = %+v, want phase %q reason %q node %q event %q", o, tc.phase, tc.reason, tc.node, tc.event)
			}
			if tc.wantMessage != "" && o.EventMessage != tc.wantMessage {
				t.Errorf("event message = %q, want %q", o.EventMessage, tc.wantMessage)
			}
		})
	}
}

func TestApplyOutcome(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Second))
	var st v1alpha1.VirtualMachineInstanceStatus
	applyOutcome(&st, outcome{Phase: v1alpha1.Pending}, t0)
	applyOutcome(&st, outcome{Phase: v1alpha1.Pending}, t1) // no change, no new timestamp
	applyOutcome(&st, outcome{Phase: v1alpha1.Scheduled, Node: "node-1", PodUID: "p1"}, t1)
	if st.Phase != v1alpha1.Scheduled || st.NodeName != "node-1" || st.ActivePods["p1"] != "node-1" {
		t.Fatalf("status = %+v", st)
	}
	want := []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{
		{Phase: v1alpha1.Pending, PhaseTransitionTimestamp: t0},
		{Phase: v1alpha1.Scheduled, PhaseTransitionTimestamp: t1},
	}
	if len(st.PhaseTransitionTimestamps) != 2 || st.PhaseTransitionTimestamps[0] != want[0] || st.PhaseTransitionTimestamps[1] != want[1] {
		t.Fatalf("transitions = %+v, want %+v", st.PhaseTransitionTimestamps, want)
	}
}

func TestSetLiveMigratable(t *testing.T) {
	v := baseVMI()
	v.Generation = 3
	setLiveMigratable(v, nil, false)
	c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.MigratableReason || c.ObservedGeneration != 3 {
		t.Fatalf("condition = %+v, want True/%s", c, v1alpha1.MigratableReason)
	}
	if v.Status.MigrationMethod != v1alpha1.LiveMigration {
		t.Errorf("migrationMethod = %q without local disks, want %q", v.Status.MigrationMethod, v1alpha1.LiveMigration)
	}
	// A hot-plugged emptyDisk lives on the node only: migrations copy it first.
	v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "scratch",
		VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}}})
	v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "scratch"})
	setLiveMigratable(v, nil, false)
	if v.Status.MigrationMethod != v1alpha1.BlockMigration {
		t.Errorf("migrationMethod = %q with an emptyDisk, want %q", v.Status.MigrationMethod, v1alpha1.BlockMigration)
	}
	v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}
	setLiveMigratable(v, nil, false)
	c = meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.InterfaceNotLiveMigratableReason {
		t.Fatalf("condition = %+v, want False/%s", c, v1alpha1.InterfaceNotLiveMigratableReason)
	}

	// Huge pages migrate under KVM, not under emulation, where the source launcher would refuse.
	v = baseVMI()
	v.Spec.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "2Mi"}}
	for _, emulation := range []bool{false, true} {
		setLiveMigratable(v, nil, emulation)
		c = meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
		if want := !emulation; c == nil || (c.Status == metav1.ConditionTrue) != want || (!want && c.Reason != v1alpha1.HugepagesUnderEmulationReason) {
			t.Errorf("huge pages, emulation %v: condition = %+v", emulation, c)
		}
	}
}

func TestLauncherPod(t *testing.T) {
	const uid = "vmi-uid"
	mk := func(name, node string, migration bool, age int) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID(name + "-uid"),
			Labels:            map[string]string{v1alpha1.VMIUIDLabel: uid},
			CreationTimestamp: metav1.NewTime(time.Unix(int64(1000-age), 0)),
		}, Spec: corev1.PodSpec{NodeName: node}}
		if migration {
			p.Labels[v1alpha1.MigrationUIDLabel] = "mig"
		}
		return p
	}
	vmi := func(node string, active ...string) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{UID: uid}}
		v.Status.NodeName = node
		for _, a := range active {
			if v.Status.ActivePods == nil {
				v.Status.ActivePods = map[types.UID]string{}
			}
			v.Status.ActivePods[types.UID(a+"-uid")] = node
		}
		return v
	}
	source := mk("source", "node-1", false, 10)
	target := mk("target", "node-2", true, 5)
	other := mk("other", "", false, 1)
	other.Labels[v1alpha1.VMIUIDLabel] = "someone-else"
	cases := []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		pods []corev1.Pod
		want string
	}{
		{"none", vmi(""), nil, ""},
		{"before a node is known: the non-target pod", vmi(""), []corev1.Pod{target, source}, "source"},
		{"only a target pod and no node: none", vmi(""), []corev1.Pod{target}, ""},
		{"on the instance's node", vmi("node-1"), []corev1.Pod{target, source}, "source"},
		{"after migration: the target on the new node", vmi("node-2", "target"), []corev1.Pod{source, target}, "target"},
		{"after migration, source gone", vmi("node-2", "target"), []corev1.Pod{target}, "target"},
		{"node known but its pod gone", vmi("node-1"), []corev1.Pod{target}, ""},
		{"another instance's pod is never ours", vmi(""), []corev1.Pod{other}, ""},
		{"duplicates: the oldest", vmi(""), []corev1.Pod{mk("young", "", false, 1), mk("old", "", false, 9)}, "old"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if p := launcherPod(tc.vmi, tc.pods); p != nil {
				got = p.Name
			}
			if got != tc.want {
				t.Fatalf("launcherPod = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestExpectations(t *testing.T) {
	now := time.Unix(0, 0)
	e := NewExpectations(30 * time.Second)
	e.now = func() time.Time { return now }
	if ok, _ := e.Satisfied("a"); !ok {
		t.Fatal("no expectation must be satisfied")
	}
	e.ExpectCreate("a")
	if ok, wait := e.Satisfied("a"); ok || wait != 30*time.Second {
		t.Fatalf("in flight: ok=%v wait=%v", ok, wait)
	}
	if ok, _ := e.Satisfied("b"); !ok {
		t.Fatal("another VMI's expectation must not block")
	}
	e.Observed("a")
	if ok, _ := e.Satisfied("a"); !ok {
		t.Fatal("observed must satisfy")
	}
	e.ExpectCreate("a")
	now = now.Add(31 * time.Second)
	if ok, _ := e.Satisfied("a"); !ok || e.Len() != 0 {
		t.Fatalf("expired expectation must satisfy and be dropped; len %d", e.Len())
	}
}

// The launcher pod's image pulls, as a kubelet reports them, become the Synchronized condition
// naming the spec field of the image; the condition goes once the pod no longer waits for an
// image, and the node agent's own reasons are left alone.
func TestSetImagePullCondition(t *testing.T) {
	const kernelImage, diskImage = "registry.example/kernel:1", "registry.example/disk:1"
	vmi := func(conds ...metav1.Condition) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Scheduling, Conditions: conds}}
		v.Spec.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{Container: &v1alpha1.KernelBootContainer{Image: kernelImage}}}
		v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: diskImage}}}}
		return v
	}
	waiting := func(init bool, reason, msg string) *corev1.Pod {
		p := testPod(corev1.PodPending, "node-1")
		cs := []corev1.ContainerStatus{{Name: "c", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}}
		if init {
			p.Status.InitContainerStatuses = cs
		} else {
			p.Status.ContainerStatuses = cs
		}
		return p
	}
	sync := func(reason string) metav1.Condition {
		return metav1.Condition{Type: v1alpha1.VirtualMachineInstanceSynchronized, Status: metav1.ConditionFalse, Reason: reason, Message: "m"}
	}
	cases := []struct {
		name       string
		vmi        *v1alpha1.VirtualMachineInstance
		pod        *corev1.Pod
		wantReason string // "" for no condition
		wantFields []string
	}{
		{"containerDisk image", vmi(), waiting(false, "ErrImagePull", `failed to pull image "`+diskImage+`"`), "ErrImagePull",
			[]string{"spec.volumes[root].containerDisk.image"}},
		{"kernelBoot image, backing off", vmi(), waiting(false, "ImagePullBackOff", `Back-off pulling image "`+kernelImage+`"`), "ImagePullBackOff",
			[]string{"spec.domain.firmware.kernelBoot.container.image"}},
		{"init container", vmi(), waiting(true, "ErrImagePull", "x"), "ErrImagePull", nil},
		{"other waiting reasons say nothing", vmi(), waiting(false, "ContainerCreating", diskImage), "", nil},
		{"pulled at last", vmi(sync("ImagePullBackOff")), testPod(corev1.PodRunning, "node-1"), "", nil},
		{"the node agent's reason stays", vmi(sync("SyncFailed")), testPod(corev1.PodRunning, "node-1"), "SyncFailed", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			setImagePullCondition(c.vmi, c.pod)
			got := meta.FindStatusCondition(c.vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
			if c.wantReason == "" {
				if got != nil {
					t.Fatalf("condition %+v, want none", got)
				}
				return
			}
			if got == nil || got.Reason != c.wantReason || got.Status != metav1.ConditionFalse {
				t.Fatalf("condition %+v, want False with reason %s", got, c.wantReason)
			}
			for _, f := range c.wantFields {
				if !strings.Contains(got.Message, f+": launcher pod ") {
					t.Errorf("message %q does not name %s", got.Message, f)
				}
			}
		})
	}
	final := vmi()
	final.Status.Phase = v1alpha1.Failed
	if setImagePullCondition(final, waiting(false, "ErrImagePull", "x")); len(final.Status.Conditions) != 0 {
		t.Errorf("an ended instance got %+v", final.Status.Conditions)
	}
}

func TestSetPodScheduledCondition(t *testing.T) {
	unschedulable := func() *corev1.Pod {
		p := testPod(corev1.PodPending, "")
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: "Unschedulable", Message: "0/2 nodes are available: 2 Insufficient memory."}}
		return p
	}
	mirrored := metav1.Condition{Type: v1alpha1.VirtualMachineInstancePodScheduled, Status: metav1.ConditionFalse, Reason: "Unschedulable", Message: "m"}
	cases := []struct {
		name  string
		phase v1alpha1.VirtualMachineInstancePhase
		node  string
		pod   *corev1.Pod
		want  string // the condition's message, "" for none
	}{
		{"waiting for a node", v1alpha1.Scheduling, "", unschedulable(),
			"launcher pod qvirt-launcher-demo-abcde: 0/2 nodes are available: 2 Insufficient memory."},
		{"placed at last", v1alpha1.Scheduled, "node-1", testPod(corev1.PodRunning, "node-1"), ""},
		{"ended", v1alpha1.Failed, "", unschedulable(), ""},
		{"no pod", v1alpha1.Pending, "", nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := &v1alpha1.VirtualMachineInstance{Status: v1alpha1.VirtualMachineInstanceStatus{Phase: c.phase, NodeName: c.node,
				Conditions: []metav1.Condition{mirrored}}}
			setPodScheduledCondition(v, c.pod)
			got := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstancePodScheduled)
			switch {
			case c.want == "" && got != nil:
				t.Errorf("condition %+v, want none", got)
			case c.want != "" && (got == nil || got.Message != c.want || got.Reason != v1alpha1.ReasonUnschedulable):
				t.Errorf("condition %+v, want Unschedulable with message %q", got, c.want)
			}
		})
	}
}
