package e2e

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// launcherSelector is the pod selector a user drains VMs with (kubectl drain --pod-selector):
// launcher pods only, not the qvirt components the local nodes also run.
const launcherSelector = v1alpha1.AppLabel + "=" + v1alpha1.LauncherApp

// TestDrainMovesVMs: `kubectl drain` of a node with three VMs of different evictionStrategy, as a
// user runs it, completes, and each VM gets what its strategy says: the LiveMigrate one (migratable)
// moves to the other node through an evacuation migration that `qvirtctl migrate-list` shows, and
// its guest keeps counting (no reboot); the LiveMigrateIfPossible one, which cannot migrate (bridge
// binding on the pod network), shuts down with its pod; the None one is deleted with its pod. Both
// nodes are schedulable again afterwards.
func TestDrainMovesVMs(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()
	source, other := "qvirt-node-1", "qvirt-node-2"
	// All three on one node: the other is cordoned while they are placed.
	cordon(t, other)
	mover := demoVM(t, ns, "mover", v1alpha1.RunStrategyAlways)
	mover.Spec.Template.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	stopper := demoVM(t, ns, "stopper", v1alpha1.RunStrategyOnce)
	stopper.Spec.Template.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrateIfPossible)
	stopper.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
	stopper.Spec.Template.Spec.Domain.Devices.Interfaces[0] = v1alpha1.Interface{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}
	dropper := demoVM(t, ns, "dropper", v1alpha1.RunStrategyOnce)
	dropper.Spec.Template.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyNone)
	dropper.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
	for _, vm := range []*v1alpha1.VirtualMachine{mover, stopper, dropper} {
		applyVM(t, vm)
	}
	vmis := map[string]*v1alpha1.VirtualMachineInstance{}
	for _, name := range []string{"mover", "stopper", "dropper"} {
		vmis[name] = waitVMI(t, ns, name, bootTimeout, "Running", running(""))
		if vmis[name].Status.NodeName != source {
			t.Fatalf("VMI %s runs on %s, want %s (%s is cordoned)", name, vmis[name].Status.NodeName, source, other)
		}
	}
	src := console(t, vmis["mover"])
	src.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	waitVMI(t, ns, "stopper", 30*time.Second, "not LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		if v == nil {
			return false
		}
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
		return c != nil && c.Status == metav1.ConditionFalse
	})
	uncordon(t, other)
	pods := map[string]*corev1.Pod{}
	for name, v := range vmis {
		pods[name] = launcherPod(t, v)
	}

	started := time.Now()
	drained := make(chan drainResult, 1)
	go func() {
		out, err := drainCmd(source, 4*time.Minute)
		drained <- drainResult{out, err}
	}()
	t.Cleanup(func() { uncordonQuiet(source) })
	// The target's console is attached while its QEMU waits for the guest, so that it sees the
	// counter resume where the source left it.
	target := waitVMI(t, ns, "mover", 2*time.Minute, "migrating to "+other, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && v.Status.EvacuationNodeName == source && v.Status.MigrationState != nil && v.Status.MigrationState.TargetNode == other
	}).DeepCopy()
	targetPod := &corev1.Pod{}
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: target.Status.MigrationState.TargetPod}, targetPod); err != nil {
		t.Fatalf("mover's target pod: %v", err)
	}
	target.Status.NodeName = other
	target.Status.ActivePods = map[types.UID]string{targetPod.UID: other}
	dst := console(t, target)
	res := <-drained
	t.Logf("kubectl drain %s took %.1fs", source, time.Since(started).Seconds())
	if res.err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", source, res.err, res.out)
	}
	if !strings.Contains(res.out, "Eviction triggered evacuation of VMI "+ns+"/mover") {
		t.Errorf("kubectl drain's output does not show the evacuation of mover:\n%s", res.out)
	}

	waitVMI(t, ns, "mover", 30*time.Second, "Running on "+other, func(v *v1alpha1.VirtualMachineInstance) bool {
		return running("")(v) && v.UID == vmis["mover"].UID && v.Status.NodeName == other && v.Status.EvacuationNodeName == ""
	})
	expectSameGuest(t, src, dst)
	list := mustQvirtctl(t, "migrate-list", "-n", ns)
	if !strings.Contains(list, "mover") || !strings.Contains(list, "evacuation of "+source) || !strings.Contains(list, "Succeeded") {
		t.Errorf("qvirtctl migrate-list does not show mover's evacuation off %s:\n%s", source, list)
	}
	for _, name := range []string{"stopper", "dropper"} {
		v := waitVMI(t, ns, name, time.Minute, "ended", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v == nil || v.Status.Phase.Final()
		})
		if v != nil && v.UID != vmis[name].UID {
			t.Errorf("VMI %s was started again (%s on %s)", name, v.Status.Phase, v.Status.NodeName)
		}
	}
	for name, p := range pods {
		if err := cl.Get(ctx, client.ObjectKeyFromObject(p), p); err == nil && p.DeletionTimestamp == nil {
			t.Errorf("launcher pod %s of %s still on %s after the drain", p.Name, name, p.Spec.NodeName)
		}
	}
	var migs v1alpha1.VirtualMachineInstanceMigrationList
	if err := cl.List(ctx, &migs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, m := range migs.Items {
		if m.Spec.VMIName != "mover" {
			t.Errorf("migration %s of %s: only mover may migrate", m.Name, m.Spec.VMIName)
		}
	}
}

// cordon marks node unschedulable until the test ends (and uncordons it then).
func cordon(t testing.TB, node string) {
	t.Helper()
	runKubectl(t, "cordon", node)
	t.Cleanup(func() { uncordonQuiet(node) })
}

func uncordon(t testing.TB, node string) {
	t.Helper()
	runKubectl(t, "uncordon", node)
}

func uncordonQuiet(node string) {
	cmd := exec.Command(kubectl, "--kubeconfig", lc.Kubeconfig, "uncordon", node)
	_ = cmd.Run()
}

func runKubectl(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.Command(kubectl, append([]string{"--kubeconfig", lc.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

type drainResult struct {
	out string
	err error
}

// drainCmd runs `kubectl drain` on node's launcher pods as a user would (kubectl retries refused
// evictions every 5 s), giving up after d; it leaves the node cordoned.
func drainCmd(node string, d time.Duration) (string, error) {
	cmd := exec.Command(kubectl, "--kubeconfig", lc.Kubeconfig, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data",
		"--pod-selector="+launcherSelector, "--timeout="+d.String())
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// drain is drainCmd failing the test when the drain does not complete; the node is uncordoned when
// the test ends.
func drain(t testing.TB, node string, d time.Duration) string {
	t.Helper()
	t.Cleanup(func() { uncordonQuiet(node) })
	out, err := drainCmd(node, d)
	if err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", node, err, out)
	}
	return out
}
