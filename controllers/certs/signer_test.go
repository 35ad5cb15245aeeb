package certs_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate/csr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/controllers/certs"
)

// A node agent gets a certificate for its own node only: asking for another node, with a token
// bound to no node, as another user, or for more names than a node agent has, is denied with
// the reason on the request, and the agent reports it.
func TestNodeAgentGetsNoCertificateForAnotherNode(t *testing.T) {
	ns := namespace(t)
	startReconciler(t, ns, &certs.Reconciler{})
	waitSecrets(t, ns)
	agentIdentity(t, ns)
	nodeA, nodeB := node(t, "a"), node(t, "b")
	onA := agentClient(t, ns, boundTo(nodeA))

	// Node A's agent asks for node B: denied, and the agent says why.
	a := startAgent(t, onA, ns, nodeB.Name)
	waitFor(t, "node A's agent to report the denial", func() bool {
		err := a.cert.Err()
		return err != nil && strings.Contains(err.Error(), "denied")
	})
	msg := a.cert.Err().Error()
	t.Logf("the agent reports: %s", msg)
	for _, want := range []string{certs.ReasonWrongNode, "node agent of node " + nodeA.Name, "naming node " + nodeB.Name} {
		if !strings.Contains(msg, want) {
			t.Errorf("the agent's error %q does not say %q", msg, want)
		}
	}
	if _, err := a.cert.Current(); err == nil || a.cert.Ready() == nil {
		t.Error("node A's agent holds a certificate for node B")
	}
	reqs := csrsOf(t, handlerUser(ns))
	if len(reqs) == 0 {
		t.Fatal("no request of node A's agent")
	}
	for _, r := range reqs {
		c := conditionOf(&r, certificatesv1.CertificateDenied)
		if c == nil || c.Reason != certs.ReasonWrongNode || len(r.Status.Certificate) > 0 {
			t.Errorf("request %s: Denied condition %+v, certificate of %d bytes", r.Name, c, len(r.Status.Certificate))
		}
		if conditionOf(&r, certificatesv1.CertificateApproved) != nil {
			t.Errorf("request %s was approved", r.Name)
		}
	}
	waitFor(t, "a "+certs.ReasonCSRDenied+" Event on the request", func() bool {
		var list corev1.EventList
		if err := cp.Client.List(context.Background(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == "CertificateSigningRequest" && e.InvolvedObject.Name == reqs[0].Name && e.Reason == certs.ReasonCSRDenied {
				return strings.Contains(e.Message, nodeB.Name)
			}
		}
		return false
	})

	admin := kubernetes.NewForConfigOrDie(cp.Config)
	for _, tc := range []struct {
		name   string
		cs     kubernetes.Interface
		tmpl   *x509.CertificateRequest
		reason string
	}{
		{"a token bound to no node", agentClient(t, ns, nil), qcerts.HandlerCSRTemplate(nodeA.Name), certs.ReasonNotBound},
		{"another user than the node agents", admin, qcerts.HandlerCSRTemplate(nodeA.Name), certs.ReasonNotNodeAgent},
		{"more names than a node agent has", onA, withDNS(qcerts.HandlerCSRTemplate(nodeA.Name), "evil.example.com"), certs.ReasonBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := submit(t, tc.cs, tc.tmpl)
			var got certificatesv1.CertificateSigningRequest
			waitFor(t, "a decision on "+name, func() bool {
				if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, &got); err != nil {
					t.Fatal(err)
				}
				return len(got.Status.Conditions) > 0
			})
			c := conditionOf(&got, certificatesv1.CertificateDenied)
			if c == nil || c.Reason != tc.reason || len(got.Status.Certificate) > 0 {
				t.Fatalf("conditions %+v, certificate of %d bytes; want Denied %s", got.Status.Conditions, len(got.Status.Certificate), tc.reason)
			}
			t.Logf("denied: %s", c.Message)
		})
	}
}

// A request an administrator approved by hand against the rule is never signed: the signer
// marks it Failed.
func TestSignerRefusesRequestApprovedAgainstTheRule(t *testing.T) {
	ns := namespace(t)
	nodeA := node(t, "a")
	admin := kubernetes.NewForConfigOrDie(cp.Config)
	name := submit(t, admin, qcerts.HandlerCSRTemplate(nodeA.Name))
	req, err := admin.CertificatesV1().CertificateSigningRequests().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	req.Status.Conditions = append(req.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ByHand", Message: "looks fine to me"})
	if _, err := admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(context.Background(), name, req, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	startReconciler(t, ns, &certs.Reconciler{})
	var got certificatesv1.CertificateSigningRequest
	waitFor(t, "the signer to look at "+name, func() bool {
		if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		return conditionOf(&got, certificatesv1.CertificateFailed) != nil || len(got.Status.Certificate) > 0
	})
	c := conditionOf(&got, certificatesv1.CertificateFailed)
	if len(got.Status.Certificate) > 0 || c == nil || c.Reason != certs.ReasonNotNodeAgent {
		t.Fatalf("certificate of %d bytes, Failed condition %+v; want no certificate and Failed %s", len(got.Status.Certificate), c, certs.ReasonNotNodeAgent)
	}
	t.Logf("failed: %s", c.Message)
}

// submit creates a request of signer qvirt.io/handler for tmpl, with a new key, as cs.
func submit(t *testing.T, cs kubernetes.Interface, tmpl *x509.CertificateRequest) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	life := time.Hour
	name, _, err := csr.RequestCertificateWithContext(context.Background(), cs, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		"", qcerts.HandlerSignerName, &life, qcerts.HandlerUsages, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.Delete(context.Background(), &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	return name
}

func withDNS(r *x509.CertificateRequest, names ...string) *x509.CertificateRequest {
	r.DNSNames = append(r.DNSNames, names...)
	return r
}
