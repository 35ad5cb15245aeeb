package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	qcerts "github.com/qvirt/qvirt/certs"
)

// NodeNameExtra is the key kube-apiserver puts the node of a pod-bound (or node-bound)
// ServiceAccount token under, in the user's extra and so in a CertificateSigningRequest's
// spec.extra. A token of a pod on node N says N; nothing a requester sends can change it.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// HandlerServiceAccount is the ServiceAccount of the node agents in the install namespace.
const HandlerServiceAccount = "qvirt-handler"

// Reasons of the conditions the signer sets on a node agent's CertificateSigningRequest.
const (
	// ReasonApproved: the requester is the node agent of the node the request names.
	ReasonApproved = "NodeAgentOfThisNode"
	// ReasonNotNodeAgent: the requester is not ServiceAccount qvirt-handler of the install
	// namespace.
	ReasonNotNodeAgent = "NotANodeAgent"
	// ReasonNotBound: the requester's token is bound to no node (not a pod's projected token).
	ReasonNotBound = "TokenNotBoundToANode"
	// ReasonWrongNode: the request names a node other than the requester's.
	ReasonWrongNode = "WrongNode"
	// ReasonBadRequest: the request does not parse, is not self-signed by its key, uses a weak
	// key, or asks for names or usages a node agent does not get.
	ReasonBadRequest = "BadRequest"
)

// refusal is why the signer will not certify a request: a condition reason and a message for
// whoever reads the CertificateSigningRequest (the node agent logs it).
type refusal struct{ reason, message string }

func (r *refusal) Error() string { return r.reason + ": " + r.message }

// allowedUsages are the key usages a node agent may ask for; it must ask for both auth ones.
var allowedUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment,
	certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}

// checkHandlerCSR applies the signer's rule to a request: the requester is ServiceAccount
// qvirt-handler of namespace, with a token bound to a node N, and the request is exactly
// certs.HandlerCSRTemplate(N) self-signed by an ECDSA P-256 key, for serving and client use. It
// returns N and the parsed request, or why not.
func checkHandlerCSR(csr *certificatesv1.CertificateSigningRequest, namespace string) (string, *x509.CertificateRequest, *refusal) {
	want := "system:serviceaccount:" + namespace + ":" + HandlerServiceAccount
	if csr.Spec.Username != want {
		return "", nil, &refusal{ReasonNotNodeAgent, fmt.Sprintf("requested by %q: only %s signs for the node agents, and only for %s", csr.Spec.Username, qcerts.HandlerSignerName, want)}
	}
	nodes := csr.Spec.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return "", nil, &refusal{ReasonNotBound, fmt.Sprintf("the requester's token names no node (%s is %v): a node agent asks with the token of its pod, which is bound to its node", NodeNameExtra, []string(nodes))}
	}
	node := nodes[0]
	if errs := validation.IsDNS1123Subdomain(node); len(errs) > 0 {
		return "", nil, &refusal{ReasonBadRequest, fmt.Sprintf("node name %q: %s", node, strings.Join(errs, "; "))}
	}
	req, err := parseRequest(csr.Spec.Request)
	if err != nil {
		return "", nil, &refusal{ReasonBadRequest, "spec.request: " + err.Error()}
	}
	if asked := requestedNodes(req); !slices.Equal(asked, []string{node}) && len(asked) > 0 {
		return "", nil, &refusal{ReasonWrongNode, fmt.Sprintf("the node agent of node %s asked for a certificate naming node %s: a node agent gets a certificate for its own node only", node, strings.Join(asked, ", "))}
	}
	if err := matchTemplate(req, qcerts.HandlerCSRTemplate(node)); err != nil {
		return "", nil, &refusal{ReasonBadRequest, "spec.request: " + err.Error()}
	}
	if err := checkUsages(csr.Spec.Usages); err != nil {
		return "", nil, &refusal{ReasonBadRequest, "spec.usages: " + err.Error()}
	}
	return node, req, nil
}

// parseRequest parses one PEM CERTIFICATE REQUEST, checks its self-signature and its key.
func parseRequest(data []byte) (*x509.CertificateRequest, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("PEM block is a %q, want CERTIFICATE REQUEST", block.Type)
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, errors.New("more than one PEM block")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, err
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("not signed by its own key: %w", err)
	}
	key, ok := req.PublicKey.(*ecdsa.PublicKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("key %T: want ECDSA P-256", req.PublicKey)
	}
	return req, nil
}

// requestedNodes are the nodes a request's qvirt-handler URIs name.
func requestedNodes(req *x509.CertificateRequest) []string {
	var out []string
	for _, u := range req.URIs {
		if u.Scheme == qcerts.HandlerNodeScheme {
			out = append(out, u.Host)
		}
	}
	return out
}

// matchTemplate checks that req asks for exactly want's subject and SANs, nothing more.
func matchTemplate(req, want *x509.CertificateRequest) error {
	if got, w := req.Subject.String(), want.Subject.String(); got != w {
		return fmt.Errorf("subject %q, want %q", got, w)
	}
	if !slices.Equal(req.DNSNames, want.DNSNames) {
		return fmt.Errorf("DNS names %v, want %v", req.DNSNames, want.DNSNames)
	}
	got, w := make([]string, 0, len(req.URIs)), make([]string, 0, len(want.URIs))
	for _, u := range req.URIs {
		got = append(got, u.String())
	}
	for _, u := range want.URIs {
		w = append(w, u.String())
	}
	if !slices.Equal(got, w) {
		return fmt.Errorf("URIs %v, want %v", got, w)
	}
	if len(req.IPAddresses) > 0 || len(req.EmailAddresses) > 0 {
		return fmt.Errorf("IP addresses %v and email addresses %v: a node agent's certificate has none", req.IPAddresses, req.EmailAddresses)
	}
	return nil
}

func checkUsages(usages []certificatesv1.KeyUsage) error {
	for _, u := range usages {
		if !slices.Contains(allowedUsages, u) {
			return fmt.Errorf("%q is not among %v", u, allowedUsages)
		}
	}
	for _, u := range []certificatesv1.KeyUsage{certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth} {
		if !slices.Contains(usages, u) {
			return fmt.Errorf("%v lacks %q", usages, u)
		}
	}
	return nil
}
