package nodeagent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/test/envtest"
)

// With config/handler's RBAC and policy, a qvirt-handler whose token is bound to its pod on node
// A changes node A and no other: it cannot point node B's streams address at itself. A token
// of the same ServiceAccount not bound to a pod changes no node.
func TestHandlerChangesOnlyItsOwnNode(t *testing.T) {
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "qvirt-system"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "qvirt-handler"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(envtest.RepoRoot(), "config", "handler")
	for _, f := range []string{"role.yaml", "role_binding.yaml", "own_node_policy.yaml"} {
		if out, errOut, err := cp.KubectlCmd(ctx, nil, "apply", "-f", filepath.Join(dir, f)); err != nil {
			t.Fatalf("apply %s: %v: %s%s", f, err, out, errOut)
		}
	}
	createNode(t, "own-a", nil)
	createNode(t, "own-b", nil)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "qvirt-handler-a", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "own-a", ServiceAccountName: "qvirt-handler",
			Containers: []corev1.Container{{Name: "handler", Image: "qvirt-handler:test"}}},
	}
	pod, err = cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Pods(ns).Delete(context.Background(), pod.Name, *metav1.NewDeleteOptions(0)) })

	onA := handlerClient(t, cs, &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	unbound := handlerClient(t, cs, nil)
	annotate := func(c kubernetes.Interface, node string) error {
		body := fmt.Sprintf(`{"metadata":{"annotations":{"qvirt.io/streams-address":"10.0.0.66:8186","test":%q}}}`, time.Now().String())
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}
	// The policy takes effect once kube-apiserver has loaded it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := annotate(onA, "own-b")
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "only the node its pod runs on") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handler of node own-a patching node own-b: got %v, want Forbidden by the policy", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := annotate(onA, "own-a"); err != nil {
		t.Errorf("the handler of node own-a patching its own node: %v", err)
	}
	if err := annotate(unbound, "own-a"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "not bound to a pod") {
		t.Errorf("an unbound token patching node own-a: got %v, want Forbidden naming the unbound token", err)
	}
}

// handlerClient is a client with a token of ServiceAccount qvirt-system/qvirt-handler, bound to
// obj when not nil.
func handlerClient(t *testing.T, cs kubernetes.Interface, obj *authnv1.BoundObjectReference) kubernetes.Interface {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts("qvirt-system").CreateToken(context.Background(), "qvirt-handler",
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600), BoundObjectRef: obj}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token: %v", err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
