package certs_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	authnv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/test/envtest"
)

// A node agent here is what a qvirt-handler pod is to the API server: ServiceAccount
// qvirt-handler of the reconciler's namespace, bound to config/handler's ClusterRole, with a
// token bound to its node (to the Node object; a pod's projected token carries the same
// authentication.kubernetes.io/node-name), running certs.NodeCertificate as the agent does.

// node creates a Node named after name (with a random suffix) until the test ends.
func node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name + "-" + utilrand.String(5)}}
	if err := cp.Client.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), n) })
	return n
}

// agentIdentity creates ServiceAccount qvirt-handler in ns with config/handler's ClusterRole.
func agentIdentity(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	role := handlerClusterRole(t)
	if err := cp.Client.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qvirt-handler"}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "qvirt-handler-" + ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa.Name}},
	}
	for _, o := range []client.Object{sa, binding} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), binding) })
}

// handlerClusterRole is config/handler/role.yaml's ClusterRole, as `make manifests` generated it.
func handlerClusterRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "config", "handler", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var role rbacv1.ClusterRole
		if err := dec.Decode(&role); err != nil {
			if errors.Is(err, io.EOF) {
				t.Fatal("config/handler/role.yaml has no ClusterRole")
			}
			t.Fatal(err)
		}
		if role.Kind == "ClusterRole" {
			return &role
		}
	}
}

// agentClient is a client of ServiceAccount ns/qvirt-handler with a token bound to obj (none
// when nil).
func agentClient(t *testing.T, ns string, obj *authnv1.BoundObjectReference) kubernetes.Interface {
	t.Helper()
	cs := kubernetes.NewForConfigOrDie(cp.Config)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), "qvirt-handler",
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600), BoundObjectRef: obj}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token: %v", err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	return kubernetes.NewForConfigOrDie(cfg)
}

// boundTo is a bound object reference to n.
func boundTo(n *corev1.Node) *authnv1.BoundObjectReference {
	return &authnv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: n.Name, UID: n.UID}
}

// agent is a node agent's certificate and trust bundle, running until the test ends.
type agent struct {
	cert   *qcerts.NodeCertificate
	bundle *qcerts.BundleSource
}

// startAgent runs, as cs, the trust bundle of ns and the certificate of node name (which need not
// be cs's node: a test may ask for another).
func startAgent(t *testing.T, cs kubernetes.Interface, ns, name string) *agent {
	t.Helper()
	a := &agent{bundle: qcerts.NewBundleSource(cs, ns, qcerts.BundleConfigMap)}
	a.cert = qcerts.NewNodeCertificate(cs, name, a.bundle, 0)
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.New(t).WithName("agent-"+name)))
	done := make(chan struct{}, 2)
	go func() { _ = a.bundle.Start(ctx); done <- struct{}{} }()
	go func() { _ = a.cert.Start(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	return a
}

// waitCertificate waits for the agent's first certificate.
func (a *agent) waitCertificate(t *testing.T) *x509.Certificate {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := a.cert.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := a.cert.Current()
	if err != nil {
		t.Fatal(err)
	}
	return m.Leaf()
}

// csrsOf are the CertificateSigningRequests of signer qvirt.io/handler by requester username.
func csrsOf(t *testing.T, username string) []certificatesv1.CertificateSigningRequest {
	t.Helper()
	var list certificatesv1.CertificateSigningRequestList
	if err := cp.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	var out []certificatesv1.CertificateSigningRequest
	for _, c := range list.Items {
		if c.Spec.SignerName == qcerts.HandlerSignerName && c.Spec.Username == username {
			out = append(out, c)
		}
	}
	return out
}

func conditionOf(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range csr.Status.Conditions {
		if csr.Status.Conditions[i].Type == typ {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

func handlerUser(ns string) string { return "system:serviceaccount:" + ns + ":qvirt-handler" }
