package kubenode_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/controllers/uninstall"
	"github.com/qvirt/qvirt/local/install"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/failover"
	"github.com/qvirt/qvirt/test/testutil"
)

// checkAdmissionFailover: on the installed qvirt (webhooks failurePolicy Fail), the leading
// qvirt-controller pod is deleted during 30 VMI creates, as kubectl delete pod does it; its
// Deployment replaces it. All 30 are accepted, an invalid 31st is refused, each VMI gets exactly
// one launcher pod (failover.CreateThroughReplicaLoss). The namespace is removed afterwards, with
// the controller clearing every VMI's finalizer.
func checkAdmissionFailover(t *testing.T, n *realNodes) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := n.client(t)
	failover.CheckFailClosed(ctx, t, c)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "failover-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Delete(ctx, ns); err != nil {
			t.Errorf("delete namespace %s: %v", ns.Name, err)
			return
		}
		testutil.Eventually(t, 2*time.Minute, "namespace "+ns.Name+" gone with its 30 VMIs", func() bool {
			return apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(ns), &corev1.Namespace{}))
		}, func() string { out, _ := n.kubectl("get", "vmi,pods", "-n", ns.Name); return out })
	}()
	base := failover.BaseVMI(t, envtest.RepoRoot(), ns.Name)
	// No node carries this label, so the launcher pods stay Pending: what is checked is admission
	// and the controller, and 30 guests under TCG on two nodes would cost minutes.
	base.Spec.NodeSelector = map[string]string{"qvirt.io/failover-test": "no-such-node"}
	pods := n.cs.CoreV1().Pods(install.Namespace)
	leader := n.controllerLeader(ctx, t)
	res := failover.CreateThroughReplicaLoss(ctx, t, c, base, failover.Replica{
		Name:   "pod " + leader,
		Delete: func() error { return pods.Delete(ctx, leader, metav1.DeleteOptions{}) },
		Gone: func() bool {
			_, err := pods.Get(ctx, leader, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		},
		Back: func() bool { return n.readyControllers(ctx) == 2 },
		Logs: func() string { return n.describe(install.Namespace) },
	})
	t.Logf("the Deployment's replacement was ready before create 21: %v", res.BackBefore21)
}

// controllerLeader is the qvirt-controller pod holding the leader lease (its holder identity is
// the pod's host name, which is the pod's name, and a suffix).
func (n *realNodes) controllerLeader(ctx context.Context, t *testing.T) string {
	t.Helper()
	lease, err := n.cs.CoordinationV1().Leases(install.Namespace).Get(ctx, "qvirt-controller.qvirt.io", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lease.Spec.HolderIdentity == nil || !strings.Contains(*lease.Spec.HolderIdentity, "_") {
		t.Fatalf("lease qvirt-controller.qvirt.io: holder %v, want pod-name_id", lease.Spec.HolderIdentity)
	}
	return strings.SplitN(*lease.Spec.HolderIdentity, "_", 2)[0]
}

// readyControllers counts the qvirt-controller pods that are Ready and not being deleted.
func (n *realNodes) readyControllers(ctx context.Context) int {
	list, err := n.cs.CoreV1().Pods(install.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "qvirt.io/app=qvirt-controller"})
	if err != nil {
		return 0
	}
	ready := 0
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			ready++
		}
	}
	return ready
}

// checkUninstallRefused: `kubectl delete -k` of the installed overlay while VM demo runs fails,
// saying why and naming the VM. Nothing it deleted is gone: the objects a webhook sees are
// refused; the webhook configurations and admission policies, which none can, are held
// Terminating by the finalizer (and stay in force).
func (n *realNodes) checkUninstallRefused(t *testing.T, in *install.Installed) {
	t.Helper()
	out, err := n.kubectl("delete", "-k", in.Dir)
	if err == nil {
		t.Fatalf("kubectl delete -k succeeded with VM demo running:\n%s", out)
	}
	for _, want := range []string{"vuninstall.qvirt.io", "qvirt is still in use", "default/demo", "kubectl delete vm,vmi,vmim --all -A"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl delete -k said %q; want it to say %q", testutil.Tail(out, 3000), want)
		}
	}
	for _, o := range n.installed(t, in.Dir) {
		what := o.GetKind() + " " + o.GetName()
		exempt := slices.ContainsFunc(uninstall.Targets, func(tg uninstall.Target) bool { return tg.GVK.Kind == o.GetKind() && tg.Name == o.GetName() })
		switch {
		case exempt && (o.GetDeletionTimestamp() == nil || !slices.Contains(o.GetFinalizers(), uninstall.Finalizer)):
			t.Errorf("%s: deletion timestamp %v, finalizers %v; want it held Terminating by %s", what, o.GetDeletionTimestamp(), o.GetFinalizers(), uninstall.Finalizer)
		case !exempt && o.GetDeletionTimestamp() != nil:
			t.Errorf("%s is being deleted though its deletion was refused", what)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("kubectl delete -k refused while VM demo runs:\n%s", testutil.Tail(out, 600))
}

// installed is every object the overlay at dir installs, as the cluster has it; it fails t if one
// is missing.
func (n *realNodes) installed(t *testing.T, dir string) []unstructured.Unstructured {
	t.Helper()
	out, err := n.kubectlWith(nil, "get", "-k", dir, "-o", "json")
	if err != nil {
		t.Fatalf("kubectl get -k: %v\n%s", err, testutil.Tail(out, 3000))
	}
	var list unstructured.UnstructuredList
	if err := list.UnmarshalJSON([]byte(out)); err != nil {
		t.Fatalf("kubectl get -k: %v", err)
	}
	if len(list.Items) < 20 {
		t.Fatalf("kubectl get -k found %d objects, want all config/default installs", len(list.Items))
	}
	return list.Items
}

// checkUninstall: with no VM left, qvirt still has its admission (the webhook configurations and
// policies an earlier refused uninstall marked for deletion are held, in force); `kubectl delete
// -k --ignore-not-found` of the installed overlay, as README says it, goes through and waits
// until every object is gone (the held ones go as soon as the guard lets the namespace go, before
// kubectl gets to them, hence --ignore-not-found); nothing of qvirt's pods is left on the nodes.
func (n *realNodes) checkUninstall(t *testing.T, in *install.Installed) {
	t.Helper()
	for _, o := range n.installed(t, in.Dir) {
		if slices.ContainsFunc(uninstall.Targets, func(tg uninstall.Target) bool { return tg.GVK.Kind == o.GetKind() && tg.Name == o.GetName() }) &&
			!slices.Contains(o.GetFinalizers(), uninstall.Finalizer) {
			t.Errorf("%s %s with no VM left: finalizers %v; want it still held since the refused uninstall", o.GetKind(), o.GetName(), o.GetFinalizers())
		}
	}
	list, err := n.cs.CoreV1().Pods(install.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var uids []types.UID
	for _, p := range list.Items {
		uids = append(uids, p.UID)
	}
	if len(uids) < 4 {
		t.Fatalf("%d pods in %s before the uninstall, want qvirt's controllers, API servers and node agents", len(uids), install.Namespace)
	}
	started := time.Now()
	if out, err := n.kubectl("delete", "-k", in.Dir, "--ignore-not-found", "--timeout=3m"); err != nil {
		t.Fatalf("kubectl delete -k with no VM left: %v\n%s\n%s", err, out, n.describe(install.Namespace))
	}
	t.Logf("kubectl delete -k removed qvirt in %.1fs", time.Since(started).Seconds())
	if out, err := n.kubectl("get", "-k", in.Dir, "--ignore-not-found", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("after kubectl delete -k: %v, still installed:\n%s", err, out)
	}
	testutil.Eventually(t, time.Minute, "nothing of qvirt's pods left on the nodes", func() bool { return len(n.podLeftovers(uids)) == 0 },
		func() string { return strings.Join(n.podLeftovers(uids), "\n") })
}

// podLeftovers lists what is left on the nodes of the pods with these UIDs: the pod objects,
// processes in the pods' cgroups, the pods' directories under each kubelet's pods directory,
// the pods' cgroups under each node's cgroup root.
func (n *realNodes) podLeftovers(uids []types.UID) []string {
	var out []string
	list, err := n.cs.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		out = append(out, err.Error())
	}
	for _, p := range list.Items {
		if slices.Contains(uids, p.UID) {
			out = append(out, "pod "+p.Namespace+"/"+p.Name)
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range procs {
		cg, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, uid := range uids {
			if bytes.Contains(cg, []byte("pod"+string(uid))) {
				cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
				out = append(out, fmt.Sprintf("process %s of pod %s: %s", filepath.Base(filepath.Dir(p)), uid, bytes.ReplaceAll(cmdline, []byte{0}, []byte(" "))))
			}
		}
	}
	for node, dir := range n.dirs {
		for _, uid := range uids {
			if _, err := os.Stat(filepath.Join(dir, "kubelet", "pods", string(uid))); err == nil {
				out = append(out, fmt.Sprintf("%s's kubelet directory of pod %s", node, uid))
			}
			// cgroup v1 (a hierarchy per controller) and v2 (one); guaranteed pods sit right
			// under kubepods, the others under their QoS class.
			for _, root := range []string{"/sys/fs/cgroup/*/qvirt-" + node, "/sys/fs/cgroup/qvirt-" + node} {
				for _, pattern := range []string{"kubepods/pod", "kubepods/*/pod"} {
					found, _ := filepath.Glob(filepath.Join(root, pattern+string(uid)))
					out = append(out, found...)
				}
			}
		}
	}
	return out
}
