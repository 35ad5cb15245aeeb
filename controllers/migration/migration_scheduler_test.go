package migration

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// startScheduler runs the real kube-scheduler built with the control plane against it until the
// test ends.
func startScheduler(t *testing.T) {
	t.Helper()
	bin := filepath.Join(cp.Env.BinaryAssetsDirectory, "kube-scheduler")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", cp.Kubeconfig, "--leader-elect=false", "--secure-port=0", "-v=1")
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("kube-scheduler output:\n%s", out.String())
		}
	})
}

// fakeNode creates a Ready node with room for launcher pods, as a kubelet with qvirt's device
// plugin would report it.
func (e *testEnv) fakeNode(name, cpu, memory string) {
	e.t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	if err := cp.Client.Create(e.ctx, node); err != nil {
		e.t.Fatalf("create node %s: %v", name, err)
	}
	e.t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), node) })
	// The node lifecycle controller, which would lift the not-ready taint, does not run here.
	node.Spec.Taints = nil
	if err := cp.Client.Update(e.ctx, node); err != nil {
		e.t.Fatalf("untaint node %s: %v", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse(memory),
		corev1.ResourcePods: resource.MustParse("110"), v1alpha1.TunResource: resource.MustParse("100"),
	}
	node.Status = corev1.NodeStatus{
		Capacity: res, Allocatable: res,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
	}
	if err := cp.Client.Status().Update(e.ctx, node); err != nil {
		e.t.Fatalf("set status of node %s: %v", name, err)
	}
}

// TestSchedulerPlacesTargetElsewhere runs kube-scheduler: the target pod must land on the other
// node although the source node has more room.
func TestSchedulerPlacesTargetElsewhere(t *testing.T) {
	e := setup(t, nil)
	e.fakeNode("sched-a", "16", "64Gi")
	e.fakeNode("sched-b", "2", "4Gi")
	vmi, _ := e.runningVMIWith("vm1", "sched-a", false, func(p *corev1.Pod) {
		// Already placed, so the scheduler leaves it alone.
		p.Spec.NodeName = "sched-a"
		c := &p.Spec.Containers[0]
		c.Resources.Requests[v1alpha1.TunResource] = resource.MustParse("1")
		c.Resources.Limits = corev1.ResourceList{v1alpha1.TunResource: resource.MustParse("1")}
	})
	startScheduler(t)
	m := e.migrate("mig", vmi.Name)
	tp := e.waitTargetPod(m)
	e.eventually("target pod scheduled", func() (bool, string) {
		got := &corev1.Pod{}
		if err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(tp), got); err != nil {
			return false, err.Error()
		}
		tp = got
		return got.Spec.NodeName != "", "unscheduled: " + podScheduledMessage(got)
	})
	if tp.Spec.NodeName != "sched-b" {
		t.Fatalf("target pod scheduled to %s, want sched-b", tp.Spec.NodeName)
	}
	// The kubelet starts it; the migration proceeds to the node agents.
	e.setPodPhase(tp, corev1.PodRunning)
	e.waitPhase(m, v1alpha1.MigrationPreparingTarget)
	if ms := e.getVMI(vmi).Status.MigrationState; ms.TargetNode != "sched-b" || ms.SourceNode != "sched-a" {
		t.Errorf("vmi migration state = %+v", ms)
	}
}

func podScheduledMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Reason + ": " + c.Message
		}
	}
	return "no PodScheduled condition yet"
}
