package cluster

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/local/supervise"
	"github.com/qvirt/qvirt/test/testutil"
)

// freePortRun is the first of n consecutive TCP ports nobody listens on now.
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	for {
		first := testutil.FreePortPair(t)
		ok := true
		for i := 1; i < n && ok; i++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", itoa(first+i)))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok {
			return first
		}
	}
}

// checkCABundles waits until every webhook of qvirt's webhook configurations carries, as its
// caBundle, the trust bundle qvirt-controller keeps in ConfigMap qvirt-ca-bundle: nobody else
// wrote one (Install sets none).
func checkCABundles(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	var last string
	eventuallyMsg(t, 30*time.Second, "the controller's CA bundle in every webhook configuration", func() bool {
		var cm corev1.ConfigMap
		if err := c.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: certs.BundleConfigMap}, &cm); err != nil {
			last = err.Error()
			return false
		}
		want := []byte(cm.Data[certs.KeyCA])
		for _, tg := range certs.CABundleTargets {
			if tg.Kind == certs.KindAPIService {
				continue // qvirt-api is not installed here
			}
			o := &unstructured.Unstructured{}
			o.SetAPIVersion("admissionregistration.k8s.io/v1")
			o.SetKind(tg.Kind)
			if err := c.Get(ctx, client.ObjectKey{Name: tg.Name}, o); err != nil {
				last = err.Error()
				return false
			}
			hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
			for _, h := range hooks {
				enc, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "caBundle")
				got, _ := base64.StdEncoding.DecodeString(enc)
				if len(want) == 0 || !bytes.Equal(got, want) {
					last = fmt.Sprintf("%s %s: caBundle of %d bytes, want the %d of %s", tg.Kind, tg.Name, len(got), len(want), certs.BundleConfigMap)
					return false
				}
			}
		}
		return true
	}, func() string { return last })
}

// evictionWebhook is the launcher pods' eviction webhook (controllers/admission/eviction.go).
const evictionWebhook = "veviction.qvirt.io"

// checkAdmissionThroughReplicaDeletion creates 30 VMIs (webhooks failurePolicy Fail) while the
// leading controller replica is deleted as a pod is (SIGTERM; the supervisor starts it
// again, as a Deployment replaces the pod): 10 before, 10 while it drains, 10 from the moment it is
// gone (at least the first while it is).
// Every create is accepted, an invalid 31st is refused by the validating webhook naming the
// field, and each VMI gets exactly one launcher pod.
func checkAdmissionThroughReplicaDeletion(ctx context.Context, t *testing.T, c client.Client, sup *supervise.Supervisor, ctl ControllerOptions) {
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
			// The launcher pods' eviction webhook fails open, as KubeVirt's (a controller that is
			// down must not block every drain); the VM and VMI webhooks must fail closed.
			if hookName, _, _ := unstructured.NestedString(hook, "name"); hookName == evictionWebhook {
				continue
			}
			if fp, _, _ := unstructured.NestedString(hook, "failurePolicy"); fp != "Fail" {
				t.Fatalf("%s %s: failurePolicy %q, want Fail", kind, name, fp)
			}
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "admission-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("../../config/samples/vmi_testguest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := &v1alpha1.VirtualMachineInstance{}
	if err := yaml.UnmarshalStrict(data, base); err != nil {
		t.Fatal(err)
	}
	base.Namespace = ns.Name
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
	leader := leaderReplica(t, sup)
	victim := ControllerName(leader)
	pid, err := sup.Signal(victim, syscall.SIGTERM)
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	create(11, 20)
	eventuallyMsg(t, 30*time.Second, victim+" (pid "+itoa(pid)+") to exit", func() bool {
		return syscall.Kill(pid, 0) != nil
	}, func() string { return "" })
	gone := time.Now()
	// The supervisor restarts the replica a second after it exits, and it is ready a moment later:
	// a quick machine can make ten creates take longer than that. The premise is one create while
	// it is gone, so the check follows the first.
	create(21, 21)
	if !probeOK(ctx, nil, "http://"+ctl.probe(leader)+"/readyz") {
		t.Logf("%s was still down after create 21 (%.2fs after it exited)", victim, time.Since(gone).Seconds())
	} else {
		t.Errorf("%s was back before create 21: the test did not create while it was gone", victim)
	}
	create(22, 30)
	t.Logf("SIGTERM -> exit %.2fs; slowest create %.0fms", gone.Sub(deleted).Seconds(), slowest.Seconds()*1000)

	bad := base.DeepCopy()
	bad.Name = "vmi-31-invalid"
	bad.Spec.Volumes = append(bad.Spec.Volumes, v1alpha1.Volume{Name: "scratch0",
		VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("0")}}})
	bad.Spec.Domain.Devices.Disks = append(bad.Spec.Domain.Devices.Disks,
		v1alpha1.Disk{Name: "scratch0", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	err = c.Create(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "vvmi.qvirt.io") || !strings.Contains(err.Error(), "capacity") {
		t.Errorf("the invalid 31st VMI: %v, want the validating webhook's refusal naming capacity", err)
	}

	podsOf := func() (map[string]int, error) {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(ns.Name), client.MatchingLabels{v1alpha1.AppLabel: v1alpha1.LauncherApp}); err != nil {
			return nil, err
		}
		n := map[string]int{}
		for _, p := range pods.Items {
			n[p.Labels[v1alpha1.VMINameLabel]]++
		}
		return n, nil
	}
	var counts map[string]int
	eventuallyMsg(t, time.Minute, "a launcher pod for each of the 30 VMIs", func() bool {
		counts, err = podsOf()
		return err == nil && len(counts) == 30
	}, func() string { return fmt.Sprintf("%v %v", counts, err) })
	t.Logf("all 30 launcher pods %.2fs after the deletion", time.Since(deleted).Seconds())
	// Both replicas up again and settled: still one pod each.
	eventuallyMsg(t, 30*time.Second, victim+" ready again", func() bool {
		return probeOK(ctx, nil, "http://"+ctl.probe(leader)+"/readyz")
	}, func() string {
		data, _ := os.ReadFile(sup.LogPath(victim))
		return testutil.Tail(string(data), 4000)
	})
	time.Sleep(3 * time.Second)
	if counts, err = podsOf(); err != nil {
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
}

// leaderReplica is the replica that leads: the one whose reconcilers started (controller-runtime
// starts them only once the lease is won).
func leaderReplica(t *testing.T, sup *supervise.Supervisor) int {
	t.Helper()
	var found []int
	for i := 1; i <= ControllerReplicas; i++ {
		data, err := os.ReadFile(sup.LogPath(ControllerName(i)))
		if err != nil {
			t.Fatal(err)
		}
		// Every replica follows qvirt-config (its webhooks read it); the other reconcilers start
		// on the leader only.
		for line := range strings.Lines(string(data)) {
			if strings.Contains(line, `"msg":"Starting workers"`) && !strings.Contains(line, `"controller":"config"`) {
				found = append(found, i)
				break
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("replicas %v started their reconcilers, want exactly one (the leader)", found)
	}
	return found[0]
}

func eventuallyMsg(t *testing.T, d time.Duration, what string, ok func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", d, what, msg())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
