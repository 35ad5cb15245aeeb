package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"slices"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"

	qcerts "github.com/qvirt/qvirt/certs"
)

const testNS = "qvirt-system"

// validCSR is node-a's agent's request, as certs.NodeCertificate makes it.
func validCSR(t testing.TB) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	return csrFor(t, qcerts.HandlerCSRTemplate("node-a"), nil)
}

// csrFor is a request for tmpl from node-a's agent, signed by key (a new P-256 key when nil).
func csrFor(t testing.TB, tmpl *x509.CertificateRequest, key any) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		key = k
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
		Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		SignerName: qcerts.HandlerSignerName,
		Usages:     qcerts.HandlerUsages,
		Username:   "system:serviceaccount:" + testNS + ":qvirt-handler",
		Extra:      map[string]certificatesv1.ExtraValue{NodeNameExtra: {"node-a"}},
	}}
}

func TestCheckHandlerCSR(t *testing.T) {
	if node, req, no := checkHandlerCSR(validCSR(t), testNS); no != nil || node != "node-a" || req == nil {
		t.Fatalf("node-a's agent asking for node-a: %q %v", node, no)
	}
	tmpl := func(change func(*x509.CertificateRequest)) *x509.CertificateRequest {
		r := qcerts.HandlerCSRTemplate("node-a")
		change(r)
		return r
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		change func(*certificatesv1.CertificateSigningRequest)
		reason string
	}{
		{"another namespace's qvirt-handler", func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Username = "system:serviceaccount:tenant:qvirt-handler"
		}, ReasonNotNodeAgent},
		{"a kubelet", func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Username = "system:node:node-a" }, ReasonNotNodeAgent},
		{"token bound to no node", func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Extra = nil }, ReasonNotBound},
		{"two nodes in extra", func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Extra[NodeNameExtra] = certificatesv1.ExtraValue{"node-a", "node-b"}
		}, ReasonNotBound},
		{"asks for node-b", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, qcerts.HandlerCSRTemplate("node-b"), c.Spec.Extra)
		}, ReasonWrongNode},
		{"asks for node-a and node-b", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, tmpl(func(r *x509.CertificateRequest) { r.URIs = append(r.URIs, qcerts.HandlerNodeURI("node-b")) }), c.Spec.Extra)
		}, ReasonWrongNode},
		{"names no node", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, tmpl(func(r *x509.CertificateRequest) { r.URIs = nil }), c.Spec.Extra)
		}, ReasonBadRequest},
		{"another URI", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, tmpl(func(r *x509.CertificateRequest) { r.URIs = append(r.URIs, &url.URL{Scheme: "spiffe", Host: "x"}) }), c.Spec.Extra)
		}, ReasonBadRequest},
		{"an extra DNS name", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, tmpl(func(r *x509.CertificateRequest) { r.DNSNames = append(r.DNSNames, "kubernetes.default.svc") }), c.Spec.Extra)
		}, ReasonBadRequest},
		{"an IP address", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, tmpl(func(r *x509.CertificateRequest) { r.IPAddresses = []net.IP{net.IPv4(10, 0, 0, 1)} }), c.Spec.Extra)
		}, ReasonBadRequest},
		{"another CN", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, tmpl(func(r *x509.CertificateRequest) { r.Subject.CommonName = "qvirt-api" }), c.Spec.Extra)
		}, ReasonBadRequest},
		{"an organization (a group to kube-apiserver)", func(c *certificatesv1.CertificateSigningRequest) {
			*c = *csrWithExtra(t, tmpl(func(r *x509.CertificateRequest) { r.Subject.Organization = []string{"system:masters"} }), c.Spec.Extra)
		}, ReasonBadRequest},
		{"an RSA key", func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Request = csrFor(t, qcerts.HandlerCSRTemplate("node-a"), rsaKey).Spec.Request
		}, ReasonBadRequest},
		{"a P-384 key", func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Request = csrFor(t, qcerts.HandlerCSRTemplate("node-a"), p384).Spec.Request
		}, ReasonBadRequest},
		{"a broken self-signature", func(c *certificatesv1.CertificateSigningRequest) {
			block, _ := pem.Decode(c.Spec.Request)
			block.Bytes[len(block.Bytes)-3] ^= 0xff
			c.Spec.Request = pem.EncodeToMemory(block)
		}, ReasonBadRequest},
		{"not PEM", func(c *certificatesv1.CertificateSigningRequest) { c.Spec.Request = []byte("hello") }, ReasonBadRequest},
		{"two PEM blocks", func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Request = append(slices.Clone(c.Spec.Request), c.Spec.Request...)
		}, ReasonBadRequest},
		{"no client auth", func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
		}, ReasonBadRequest},
		{"code signing", func(c *certificatesv1.CertificateSigningRequest) {
			c.Spec.Usages = append(c.Spec.Usages, certificatesv1.UsageCodeSigning)
		}, ReasonBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validCSR(t)
			tc.change(c)
			node, _, no := checkHandlerCSR(c, testNS)
			if no == nil || no.reason != tc.reason {
				t.Fatalf("got node %q, refusal %v; want %s", node, no, tc.reason)
			}
			t.Log(no.message)
		})
	}
}

func csrWithExtra(t testing.TB, tmpl *x509.CertificateRequest, extra map[string]certificatesv1.ExtraValue) *certificatesv1.CertificateSigningRequest {
	c := csrFor(t, tmpl, nil)
	c.Spec.Extra = extra
	return c
}

// FuzzCheckHandlerCSR feeds arbitrary requests and node names to the signer's rule: it never
// panics, and what it grants is exactly node's template from the node's own agent.
func FuzzCheckHandlerCSR(f *testing.F) {
	good := validCSR(f)
	f.Add(good.Spec.Request, "node-a")
	f.Add(good.Spec.Request, "node-b")
	f.Add(good.Spec.Request[:len(good.Spec.Request)/2], "node-a")
	f.Add([]byte("-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n"), "")
	f.Fuzz(func(t *testing.T, request []byte, node string) {
		c := &certificatesv1.CertificateSigningRequest{Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: request, Usages: qcerts.HandlerUsages, Username: good.Spec.Username,
			Extra: map[string]certificatesv1.ExtraValue{NodeNameExtra: {node}}}}
		got, req, no := checkHandlerCSR(c, testNS)
		if no != nil {
			if no.reason == "" || no.message == "" {
				t.Fatalf("refusal without reason or message: %+v", no)
			}
			return
		}
		want := qcerts.HandlerCSRTemplate(node)
		if got != node || req.Subject.String() != want.Subject.String() || !slices.Equal(req.DNSNames, want.DNSNames) ||
			len(req.URIs) != 1 || req.URIs[0].String() != want.URIs[0].String() || len(req.IPAddresses)+len(req.EmailAddresses) > 0 {
			t.Fatalf("granted node %q for a request of subject %s DNS %v URIs %v IPs %v", got, req.Subject, req.DNSNames, req.URIs, req.IPAddresses)
		}
	})
}
