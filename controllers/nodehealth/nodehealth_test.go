package nodehealth_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers"
	"github.com/qvirt/qvirt/controllers/nodehealth"
	"github.com/qvirt/qvirt/handler/nodeagent"
	"github.com/qvirt/qvirt/test/envtest"
)

// The controller runs with a short timeout so the tests see nodes die; the node agent is the real
// nodeagent.Heartbeat where a test needs one beating. The heartbeat has whole seconds (RFC 3339,
// as KubeVirt's), so a timeout of 5 s leaves a beating node about 4 s of slack on a loaded
// machine (2 s left about 1).
const (
	timeout     = 5 * time.Second
	beat        = 300 * time.Millisecond
	waitTimeout = 20 * time.Second
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

// startController runs the nodehealth reconciler on a manager with qvirt-controller's cache
// options, until the test ends.
func startController(t *testing.T) {
	t.Helper()
	opts := cp.ManagerOptions()
	opts.Cache = controllers.CacheOptions("default")
	mgr, err := ctrl.NewManager(cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 the reconcilers record with the core/v1 Events API (see controllers.recorder)
	rec := mgr.GetEventRecorderFor("qvirt-nodehealth")
	r := &nodehealth.Reconciler{Client: mgr.GetClient(), Recorder: rec, Timeout: timeout}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	startManager(t, mgr)
}

// startAgent runs a node agent's heartbeat for node; the returned func stops it cleanly.
func startAgent(t *testing.T, node string) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(cp.Config, cp.ManagerOptions())
	if err != nil {
		t.Fatal(err)
	}
	caps := nodeagent.Capabilities{QEMUVersion: "7.2.22", KVMReason: "/dev/kvm is absent"}
	if err := mgr.Add(nodeagent.NewHeartbeat(mgr.GetClient(), node, caps, beat)); err != nil {
		t.Fatal(err)
	}
	return startManager(t, mgr)
}

func startManager(t *testing.T, mgr ctrl.Manager) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var err error
	go func() { err = mgr.Start(ctx); close(done) }()
	stop = func() {
		cancel()
		<-done
		if err != nil {
			t.Errorf("manager: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "nodehealth-"}}
	if err := cp.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), ns) })
	return ns.Name
}

func createNode(t *testing.T, name string, labels, annotations map[string]string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations}}
	if err := cp.Client.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), n) })
}

// setReady writes the node's Ready condition as a kubelet (or, once the kubelet is silent, the node
// lifecycle controller) would: status since at.
func setReady(t *testing.T, name string, status corev1.ConditionStatus, at time.Time) {
	t.Helper()
	var n corev1.Node
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "SetByTest",
		LastHeartbeatTime: metav1.NewTime(at), LastTransitionTime: metav1.NewTime(at)}}
	if err := cp.Client.Status().Update(context.Background(), &n); err != nil {
		t.Fatal(err)
	}
}

func heartbeatAt(ts time.Time) map[string]string {
	return map[string]string{v1alpha1.NodeHeartbeatAnnotation: ts.UTC().Format(time.RFC3339)}
}

var schedulable = map[string]string{v1alpha1.NodeSchedulableLabel: "true"}

// createVMI creates an instance and writes the status a node agent would have: phase, node and
// (for Running) Ready.
func createVMI(t *testing.T, ns, name string, phase v1alpha1.VirtualMachineInstancePhase, node string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	ctx := context.Background()
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{
			Resources: v1alpha1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}},
		}},
	}
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	v.Status.Phase = phase
	v.Status.NodeName = node
	v.Status.Reason = "SetByTest"
	v.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{{Phase: phase, PhaseTransitionTimestamp: metav1.Now()}}
	if phase == v1alpha1.Running {
		meta.SetStatusCondition(&v.Status.Conditions, metav1.Condition{Type: v1alpha1.VirtualMachineInstanceReady, Status: metav1.ConditionTrue, Reason: "GuestRunning"})
	}
	if err := cp.Client.Status().Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	return v
}

func getVMI(t *testing.T, v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	got := &v1alpha1.VirtualMachineInstance{}
	if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(v), got); err != nil {
		t.Fatal(err)
	}
	return got
}

func nodeLabel(t *testing.T, name string) string {
	t.Helper()
	var n corev1.Node
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return n.Labels[v1alpha1.NodeSchedulableLabel]
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stays asserts cond holds for the whole of d.
func stays(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if ok, msg := cond(); !ok {
			t.Fatalf("%s no longer holds: %s", what, msg)
		}
	}
}

func waitFailedUnresponsive(t *testing.T, v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	var got *v1alpha1.VirtualMachineInstance
	eventually(t, v.Name+" Failed with NodeUnresponsive", func() (bool, string) {
		got = getVMI(t, v)
		return got.Status.Phase == v1alpha1.Failed && got.Status.Reason == nodehealth.ReasonNodeUnresponsive,
			fmt.Sprintf("phase %s reason %s", got.Status.Phase, got.Status.Reason)
	})
	return got
}

func phaseIs(t *testing.T, v *v1alpha1.VirtualMachineInstance, want v1alpha1.VirtualMachineInstancePhase) func() (bool, string) {
	return func() (bool, string) {
		got := getVMI(t, v)
		return got.Status.Phase == want, fmt.Sprintf("%s is %s (reason %s), want %s", v.Name, got.Status.Phase, got.Status.Reason, want)
	}
}

func labelIs(t *testing.T, node, want string) func() (bool, string) {
	return func() (bool, string) {
		got := nodeLabel(t, node)
		return got == want, fmt.Sprintf("node %s schedulable=%q, want %q", node, got, want)
	}
}

// An agent outage is not a guest failure: a node whose agent stopped beating (its kubelet still
// Ready) gets no new launcher pods, but its guests keep running and their instances stay as they
// were.
func TestStaleHeartbeatStopsSchedulingButKeepsGuests(t *testing.T) {
	ns := namespace(t)
	createNode(t, "stale", schedulable, heartbeatAt(time.Now().Add(-10*time.Minute)))
	setReady(t, "stale", corev1.ConditionTrue, time.Now().Add(-time.Hour))
	createNode(t, "gone-agent", schedulable, nil) // labelled by an agent, heartbeat removed
	running := createVMI(t, ns, "running", v1alpha1.Running, "stale")
	scheduled := createVMI(t, ns, "scheduled", v1alpha1.Scheduled, "stale")
	other := createVMI(t, ns, "other", v1alpha1.Running, "gone-agent")
	startController(t)

	eventually(t, "node stale unschedulable", labelIs(t, "stale", "false"))
	eventually(t, "node gone-agent unschedulable", labelIs(t, "gone-agent", "false"))
	stays(t, 2*timeout, "instances on nodes without a beating agent as they were", func() (bool, string) {
		for _, c := range []func() (bool, string){phaseIs(t, running, v1alpha1.Running), phaseIs(t, scheduled, v1alpha1.Scheduled), phaseIs(t, other, v1alpha1.Running)} {
			if ok, msg := c(); !ok {
				return false, msg
			}
		}
		return true, ""
	})
}

func TestNotReadyNodeFailsInstances(t *testing.T) {
	ns := namespace(t)
	createNode(t, "lost", schedulable, heartbeatAt(time.Now().Add(-10*time.Minute)))
	setReady(t, "lost", corev1.ConditionUnknown, time.Now().Add(-10*time.Minute))
	createNode(t, "plain", nil, nil) // never had a qvirt agent
	running := createVMI(t, ns, "running", v1alpha1.Running, "lost")
	scheduled := createVMI(t, ns, "scheduled", v1alpha1.Scheduled, "lost")
	done := createVMI(t, ns, "done", v1alpha1.Succeeded, "lost")
	elsewhere := createVMI(t, ns, "elsewhere", v1alpha1.Running, "plain")
	startController(t)

	got := waitFailedUnresponsive(t, running)
	last := got.Status.PhaseTransitionTimestamps[len(got.Status.PhaseTransitionTimestamps)-1]
	if last.Phase != v1alpha1.Failed || time.Since(last.PhaseTransitionTimestamp.Time) > time.Minute {
		t.Errorf("last phase transition %+v, want Failed just now", last)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != nodehealth.ReasonNodeUnresponsive {
		t.Errorf("Ready condition %+v, want False/NodeUnresponsive", c)
	}
	waitFailedUnresponsive(t, scheduled)
	eventually(t, "a NodeUnresponsive Warning event on the instance", func() (bool, string) {
		var evs corev1.EventList
		if err := cp.Client.List(context.Background(), &evs, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.UID == running.UID && e.Reason == nodehealth.ReasonNodeUnresponsive && e.Type == corev1.EventTypeWarning {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, none matching", len(evs.Items))
	})
	eventually(t, "node lost unschedulable", labelIs(t, "lost", "false"))

	if got := getVMI(t, done); got.Status.Phase != v1alpha1.Succeeded || got.Status.Reason != "SetByTest" {
		t.Errorf("finished instance changed: %s/%s", got.Status.Phase, got.Status.Reason)
	}
	stays(t, time.Second, "instance on a node without an agent untouched", phaseIs(t, elsewhere, v1alpha1.Running))
	if got := nodeLabel(t, "plain"); got != "" {
		t.Errorf("node without an agent labelled schedulable=%q", got)
	}
}

func TestBeatingNodeIsUntouched(t *testing.T) {
	ns := namespace(t)
	createNode(t, "beating", nil, nil)
	startAgent(t, "beating")
	eventually(t, "agent labels node", labelIs(t, "beating", "true"))
	v := createVMI(t, ns, "vm", v1alpha1.Running, "beating")
	startController(t)

	stays(t, 3*timeout, "instance on a beating node Running", phaseIs(t, v, v1alpha1.Running))
	if got := nodeLabel(t, "beating"); got != "true" {
		t.Fatalf("beating node schedulable=%q", got)
	}
}

func TestNodeIsLostAtItsDeadline(t *testing.T) {
	ns := namespace(t)
	// Not Ready from now on and then silence: nothing changes on the Node, so only the requeue at
	// the deadline can find it lost.
	since := time.Now().Truncate(time.Second)
	createNode(t, "silent", schedulable, heartbeatAt(since))
	setReady(t, "silent", corev1.ConditionFalse, since)
	v := createVMI(t, ns, "vm", v1alpha1.Running, "silent")
	startController(t)

	got := waitFailedUnresponsive(t, v)
	failedAt := got.Status.PhaseTransitionTimestamps[len(got.Status.PhaseTransitionTimestamps)-1].PhaseTransitionTimestamp.Time
	// metav1.Time has whole seconds on the wire.
	if deadline := since.Add(timeout); failedAt.Before(deadline.Truncate(time.Second)) {
		t.Errorf("failed at %s, before the deadline %s", failedAt, deadline)
	}
}

func TestInstancePlacedOnLostNodeFails(t *testing.T) {
	ns := namespace(t)
	createNode(t, "dead", schedulable, heartbeatAt(time.Now().Add(-time.Hour)))
	setReady(t, "dead", corev1.ConditionUnknown, time.Now().Add(-time.Hour))
	startController(t)
	eventually(t, "node dead unschedulable", labelIs(t, "dead", "false"))
	// The node is lost and idle: only the instance watch brings it back.
	v := createVMI(t, ns, "late", v1alpha1.Scheduled, "dead")
	waitFailedUnresponsive(t, v)
}

func TestNodeComesBackOnlyWhenItsAgentSaysSo(t *testing.T) {
	ns := namespace(t)
	createNode(t, "flaky", schedulable, heartbeatAt(time.Now().Add(-time.Hour)))
	v := createVMI(t, ns, "vm", v1alpha1.Running, "flaky")
	startController(t)
	eventually(t, "node flaky unschedulable", labelIs(t, "flaky", "false"))

	// A fresh heartbeat written by someone else is not the agent saying "schedulable".
	n := &corev1.Node{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: "flaky"}, n); err != nil {
		t.Fatal(err)
	}
	base := n.DeepCopy()
	n.Annotations = heartbeatAt(time.Now())
	if err := cp.Client.Patch(context.Background(), n, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	stays(t, time.Second, "node flaky unschedulable without its agent", labelIs(t, "flaky", "false"))

	stopAgent := startAgent(t, "flaky")
	eventually(t, "node flaky schedulable again", labelIs(t, "flaky", "true"))
	stays(t, 2*timeout, "node flaky schedulable while its agent beats", labelIs(t, "flaky", "true"))
	if got := getVMI(t, v); got.Status.Phase != v1alpha1.Running {
		t.Fatalf("the instance that ran through its agent's outage is %s", got.Status.Phase)
	}

	stopAgent()
	if got := nodeLabel(t, "flaky"); got != "false" {
		t.Fatalf("after the agent stopped cleanly schedulable=%q", got)
	}
}
