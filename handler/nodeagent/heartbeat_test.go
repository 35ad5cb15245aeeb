package nodeagent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

func createNode(t *testing.T, name string, annotations map[string]string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}}
	if err := cp.Client.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), n) })
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

// waitNode polls the API server (the test's view, as kubectl get) until cond holds.
func waitNode(t *testing.T, name, what string, cond func(*corev1.Node) bool) *corev1.Node {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := getNode(t, name)
		if cond(n) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s: %s: labels %v annotations %v", name, what, n.Labels, n.Annotations)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestHeartbeatLabelsBeatsAndStops(t *testing.T) {
	const node = "hb-node"
	createNode(t, node, nil)
	caps := Capabilities{QEMUVersion: "7.2.22", KVMReason: "/dev/kvm is absent"}

	mgr, err := ctrl.NewManager(cp.Config, cp.ManagerOptions())
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Add(NewHeartbeat(mgr.GetClient(), node, caps, 300*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mgrErr error
	stopped := make(chan struct{})
	go func() { mgrErr = mgr.Start(ctx); close(stopped) }()
	defer func() { cancel(); <-stopped }()

	n := waitNode(t, node, "labelled by the agent", func(n *corev1.Node) bool {
		return n.Labels[v1alpha1.NodeSchedulableLabel] == "true"
	})
	want := map[string]string{v1alpha1.NodeKVMLabel: "false", v1alpha1.NodeQEMUVersionLabel: "7.2.22"}
	for k, v := range want {
		if n.Labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, n.Labels[k], v)
		}
	}
	if got := n.Annotations[v1alpha1.NodeKVMReasonAnnotation]; got != caps.KVMReason {
		t.Errorf("kvm reason annotation %q, want %q", got, caps.KVMReason)
	}
	first, err := time.Parse(time.RFC3339, n.Annotations[v1alpha1.NodeHeartbeatAnnotation])
	if err != nil {
		t.Fatalf("heartbeat annotation: %v", err)
	}
	if d := time.Since(first); d > 5*time.Second || d < -5*time.Second {
		t.Fatalf("heartbeat %s is not now", first)
	}
	// RFC 3339 has whole seconds: a later beat shows within about a second.
	waitNode(t, node, "heartbeat advancing", func(n *corev1.Node) bool {
		ts, err := time.Parse(time.RFC3339, n.Annotations[v1alpha1.NodeHeartbeatAnnotation])
		return err == nil && ts.After(first)
	})

	cancel()
	<-stopped
	if mgrErr != nil {
		t.Fatalf("manager: %v", mgrErr)
	}
	n = getNode(t, node)
	if n.Labels[v1alpha1.NodeSchedulableLabel] != "false" {
		t.Fatalf("after a clean stop schedulable=%q, want false", n.Labels[v1alpha1.NodeSchedulableLabel])
	}
}

func TestHeartbeatWithKVMDropsReason(t *testing.T) {
	const node = "hb-kvm-node"
	createNode(t, node, map[string]string{v1alpha1.NodeKVMReasonAnnotation: "an old reason"})
	hb := NewHeartbeat(cp.Client, node, Capabilities{QEMUVersion: "9.0.0", KVM: true}, 0).AdvertiseStreams("10.0.0.7:8186")
	if err := hb.Beat(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := getNode(t, node)
	if got := n.Annotations[v1alpha1.NodeStreamsAddressAnnotation]; got != "10.0.0.7:8186" {
		t.Errorf("streams address annotation %q, want 10.0.0.7:8186", got)
	}
	if n.Labels[v1alpha1.NodeKVMLabel] != "true" || n.Labels[v1alpha1.NodeSchedulableLabel] != "true" {
		t.Fatalf("labels %v", n.Labels)
	}
	if r, ok := n.Annotations[v1alpha1.NodeKVMReasonAnnotation]; ok {
		t.Fatalf("kvm reason %q left behind", r)
	}
}

func TestHeartbeatMissingNode(t *testing.T) {
	hb := NewHeartbeat(cp.Client, "no-such-node", Capabilities{QEMUVersion: "7.2.22"}, 0)
	if err := hb.Beat(context.Background()); err == nil {
		t.Fatal("beating a missing node succeeded")
	}
}

// The node is labelled for post-copy from the userfaultfd sysctl at each beat: a node that turns
// it on (or off) is relabelled without an agent restart, and the reason names the sysctl.
func TestHeartbeatLabelsPostCopyFromTheSysctl(t *testing.T) {
	const node = "hb-postcopy-node"
	createNode(t, node, nil)
	sysctl := filepath.Join(t.TempDir(), "unprivileged_userfaultfd")
	set := func(v string) {
		if err := os.WriteFile(sysctl, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hb := NewHeartbeat(cp.Client, node, Capabilities{QEMUVersion: "7.2.22"}, 0).WithUserfaultfdSysctl(sysctl)
	beat := func() *corev1.Node { return beatAndGet(t, hb, node) }
	set("0")
	n := beat()
	if n.Labels[v1alpha1.NodePostCopyLabel] != "false" || !strings.Contains(n.Annotations[v1alpha1.NodePostCopyReasonAnnotation], "unprivileged_userfaultfd is 0") {
		t.Fatalf("with the sysctl at 0: labels %v annotations %v", n.Labels, n.Annotations)
	}
	set("1")
	n = beat()
	if n.Labels[v1alpha1.NodePostCopyLabel] != "true" {
		t.Fatalf("with the sysctl at 1: labels %v", n.Labels)
	}
	if r, ok := n.Annotations[v1alpha1.NodePostCopyReasonAnnotation]; ok {
		t.Fatalf("post-copy reason %q left behind", r)
	}
	if err := os.Remove(sysctl); err != nil {
		t.Fatal(err)
	}
	if n = beat(); n.Labels[v1alpha1.NodePostCopyLabel] != "false" {
		t.Fatalf("without the sysctl: labels %v", n.Labels)
	}
}

// TestHeartbeatLabelsCPUManagerFromTheKubeletState: the Node's cpumanager label follows the policy
// in the kubelet's CPU manager checkpoint, as KubeVirt's virt-handler sets it; a checkpoint the
// agent cannot read leaves the label as the administrator set it, with the reason annotated.
func TestHeartbeatLabelsCPUManagerFromTheKubeletState(t *testing.T) {
	const node = "hb-cpumanager-node"
	createNode(t, node, nil)
	n := getNode(t, node)
	n.Labels = map[string]string{v1alpha1.NodeCPUManagerLabel: "true"}
	if err := cp.Client.Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(t.TempDir(), "cpu_manager_state")
	hb := NewHeartbeat(cp.Client, node, Capabilities{QEMUVersion: "7.2.22"}, 0).WithCPUManagerState(state)
	beat := func() *corev1.Node { return beatAndGet(t, hb, node) }
	n = beat()
	if n.Labels[v1alpha1.NodeCPUManagerLabel] != "true" || !strings.Contains(n.Annotations[v1alpha1.NodeCPUManagerReasonAnnotation], "cpu_manager_state") {
		t.Fatalf("without the kubelet's state: labels %v annotations %v; want the administrator's label kept and the reason", n.Labels, n.Annotations)
	}
	write := func(policy string) {
		body := `{"policyName":"` + policy + `","defaultCpuSet":"0-1","checksum":1}`
		if err := os.WriteFile(state, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("none")
	if n = beat(); n.Labels[v1alpha1.NodeCPUManagerLabel] != "false" || !strings.Contains(n.Annotations[v1alpha1.NodeCPUManagerReasonAnnotation], `policy is "none"`) {
		t.Fatalf("with policy none: labels %v annotations %v", n.Labels, n.Annotations)
	}
	write("static")
	if n = beat(); n.Labels[v1alpha1.NodeCPUManagerLabel] != "true" {
		t.Fatalf("with policy static: labels %v", n.Labels)
	}
	if r, ok := n.Annotations[v1alpha1.NodeCPUManagerReasonAnnotation]; ok {
		t.Fatalf("CPU manager reason %q left behind", r)
	}
}

// beatAndGet beats once and reads the node back.
func beatAndGet(t *testing.T, hb *Heartbeat, node string) *corev1.Node {
	t.Helper()
	if err := hb.Beat(context.Background()); err != nil {
		t.Fatal(err)
	}
	return getNode(t, node)
}
