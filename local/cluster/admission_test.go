package cluster

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/local/supervise"
	"github.com/qvirt/qvirt/test/failover"
	"github.com/qvirt/qvirt/test/testutil"
)

// checkCABundles waits until every webhook of qvirt's webhook configurations carries, as its
// caBundle, the trust bundle qvirt-controller keeps in ConfigMap qvirt-ca-bundle: nobody else
// wrote one (Install sets none).
func checkCABundles(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	var last string
	testutil.Eventually(t, 30*time.Second, "the controller's CA bundle in every webhook configuration", func() bool {
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

// checkAdmissionThroughReplicaDeletion runs failover.CreateThroughReplicaLoss with the leading
// controller replica deleted as a pod is (SIGTERM; the supervisor starts it again a second after it
// exits, as a Deployment replaces the pod). The premise is one create while it is gone, so the
// restarted replica must not be back before it.
func checkAdmissionThroughReplicaDeletion(ctx context.Context, t *testing.T, c client.Client, sup *supervise.Supervisor, ctl ControllerOptions) {
	failover.CheckFailClosed(ctx, t, c)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "admission-"}}
	if err := c.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	leader := leaderReplica(t, sup)
	victim := ControllerName(leader)
	var pid int
	res := failover.CreateThroughReplicaLoss(ctx, t, c, failover.BaseVMI(t, "../..", ns.Name), failover.Replica{
		Name: victim,
		Delete: func() (err error) {
			pid, err = sup.Signal(victim, syscall.SIGTERM)
			return err
		},
		Gone: func() bool { return syscall.Kill(pid, 0) != nil },
		Back: func() bool { return probeOK(ctx, nil, "http://"+ctl.probe(leader)+"/readyz") },
		Logs: func() string {
			data, _ := os.ReadFile(sup.LogPath(victim))
			return testutil.Tail(string(data), 4000)
		},
	})
	if res.BackBefore21 {
		t.Errorf("%s was back before create 21: the test did not create while it was gone", victim)
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
