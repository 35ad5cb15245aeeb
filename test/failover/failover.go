// Package failover checks, against a running qvirt, that admission holds while a qvirt-controller
// replica goes away (issue 14's "Done when"): every webhook that guards VMs fails closed, 30 VMIs
// created around a replica's deletion are all accepted, an invalid 31st is refused by the
// validating webhook, and each VMI gets exactly one launcher pod. Local mode (a supervised process)
// and the real-node tier (a Deployment's pod) each say how their replica goes and comes back.
package failover

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/test/testutil"
)

// FailOpen are the webhooks that fail open by design: the launcher pods' eviction webhook (as
// KubeVirt's: a controller that is down must not block every drain) and the uninstall guard (a
// controller that is down must not make a broken installation impossible to remove).
var FailOpen = []string{"veviction.qvirt.io", "vuninstall.qvirt.io"}

// CheckFailClosed fails t unless every other webhook of qvirt's configurations has failurePolicy
// Fail.
func CheckFailClosed(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	for _, kind := range []string{certs.KindValidatingWebhook, certs.KindMutatingWebhook} {
		o := &unstructured.Unstructured{}
		o.SetAPIVersion("admissionregistration.k8s.io/v1")
		o.SetKind(kind)
		name := "qvirt-validating-webhook"
		if kind == certs.KindMutatingWebhook {
			name = "qvirt-mutating-webhook"
		}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, o); err != nil {
			t.Fatal(err)
		}
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for _, h := range hooks {
			hook := h.(map[string]any)
			if hookName, _, _ := unstructured.NestedString(hook, "name"); slices.Contains(FailOpen, hookName) {
				continue
			}
			if fp, _, _ := unstructured.NestedString(hook, "failurePolicy"); fp != "Fail" {
				t.Fatalf("%s %s: failurePolicy %q, want Fail", kind, name, fp)
			}
		}
	}
}

// Replica is one qvirt-controller replica, as a test removes it.
type Replica struct {
	Name string
	// Delete removes it the way deleting its pod does: SIGTERM, then the shutdown delay.
	Delete func() error
	// Gone says whether its process has exited.
	Gone func() bool
	// Back says whether a replica serves again in its place (the same one restarted, or a
	// Deployment's replacement pod).
	Back func() bool
	// Logs is what to show when it does not come back.
	Logs func() string
}

// Result is what happened around the deletion.
type Result struct {
	// BackBefore21 is whether a replica was serving again in the deleted one's place before the
	// create that followed its exit: then no create ran with only one replica left.
	BackBefore21 bool
}

// BaseVMI is config/samples/vmi_testguest.yaml in namespace ns; repo is the repository's root.
func BaseVMI(t *testing.T, repo, ns string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repo, "config", "samples", "vmi_testguest.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	base := &v1alpha1.VirtualMachineInstance{}
	if err := yaml.UnmarshalStrict(data, base); err != nil {
		t.Fatal(err)
	}
	base.Namespace = ns
	return base
}

// CreateThroughReplicaLoss creates 30 copies of base (vmi-01 … vmi-30) with r deleted after the
// tenth: ten before, ten while it drains, one as soon as it has exited, nine more. Every create
// must be accepted at the first try; an invalid 31st must be refused by the validating webhook
// naming the field; and once a replica is back in r's place, each VMI has exactly one launcher pod.
func CreateThroughReplicaLoss(ctx context.Context, t *testing.T, c client.Client, base *v1alpha1.VirtualMachineInstance, r Replica) Result {
	t.Helper()
	var slowest time.Duration
	create := func(from, to int) {
		for i := from; i <= to; i++ {
			v := base.DeepCopy()
			v.Name = fmt.Sprintf("vmi-%02d", i)
			started := time.Now()
			if err := c.Create(ctx, v); err != nil {
				t.Errorf("create %s (%d of 30): %v", v.Name, i, err)
			}
			slowest = max(slowest, time.Since(started))
		}
	}

	create(1, 10)
	if err := r.Delete(); err != nil {
		t.Fatalf("delete controller replica %s: %v", r.Name, err)
	}
	deleted := time.Now()
	create(11, 20)
	testutil.Eventually(t, time.Minute, r.Name+" to exit", r.Gone, func() string { return "" })
	gone := time.Now()
	var res Result
	create(21, 21)
	res.BackBefore21 = r.Back()
	create(22, 30)
	t.Logf("%s: SIGTERM -> exit %.2fs; a replica back in its place before create 21: %v; slowest create %.0fms",
		r.Name, gone.Sub(deleted).Seconds(), res.BackBefore21, slowest.Seconds()*1000)

	bad := base.DeepCopy()
	bad.Name = "vmi-31-invalid"
	bad.Spec.Volumes = append(bad.Spec.Volumes, v1alpha1.Volume{Name: "scratch0",
		VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("0")}}})
	bad.Spec.Domain.Devices.Disks = append(bad.Spec.Domain.Devices.Disks,
		v1alpha1.Disk{Name: "scratch0", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	if err := c.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "vvmi.qvirt.io") || !strings.Contains(err.Error(), "capacity") {
		t.Errorf("the invalid 31st VMI: %v, want the validating webhook's refusal naming capacity", err)
	}

	var counts map[string]int
	var err error
	testutil.Eventually(t, time.Minute, "a launcher pod for each of the 30 VMIs", func() bool {
		counts, err = launcherPods(ctx, c, base.Namespace)
		return err == nil && len(counts) == 30
	}, func() string { return fmt.Sprintf("%v %v", counts, err) })
	t.Logf("all 30 launcher pods %.2fs after the deletion", time.Since(deleted).Seconds())
	testutil.Eventually(t, time.Minute, "a replica serving in "+r.Name+"'s place", r.Back, r.Logs)
	// Both replicas up and settled (a new leader has resynced): still one pod each.
	time.Sleep(3 * time.Second)
	if counts, err = launcherPods(ctx, c, base.Namespace); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 30; i++ {
		if n := counts[fmt.Sprintf("vmi-%02d", i)]; n != 1 {
			t.Errorf("VMI vmi-%02d has %d launcher pods, want 1", i, n)
		}
	}
	if n := counts[bad.Name]; n != 0 {
		t.Errorf("the refused VMI has %d launcher pods", n)
	}
	return res
}

// launcherPods counts the launcher pods in ns by the VMI they serve.
func launcherPods(ctx context.Context, c client.Client, ns string) (map[string]int, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.AppLabel: v1alpha1.LauncherApp}); err != nil {
		return nil, err
	}
	n := map[string]int{}
	for _, p := range pods.Items {
		n[p.Labels[v1alpha1.VMINameLabel]]++
	}
	return n, nil
}
