package certs

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net/url"
	"strings"
)

// HandlerNodeScheme is the scheme of the URI SAN that names a node agent's node:
// qvirt-handler://NODE. A URI rather than a DNS name: it is an identity, which no resolver
// could map to an address, and a node name of up to 253 characters fits whole.
const HandlerNodeScheme = "qvirt-handler"

// HandlerNodeURI is the URI SAN of node's qvirt-handler certificate.
func HandlerNodeURI(node string) *url.URL {
	return &url.URL{Scheme: HandlerNodeScheme, Host: node}
}

// HandlerNodeSpec is the leaf of node's qvirt-handler: CN and DNS SAN qvirt-handler (what every
// node agent is, for the peers that check only that) and the URI SAN naming its node (which
// qvirt-api and the other node agents check against the node they mean to reach). It serves
// (streams, migration endpoint) and is a client (of the other node agents' migration endpoints).
func HandlerNodeSpec(node string) LeafSpec {
	return LeafSpec{CommonName: HandlerName, DNSNames: []string{HandlerName}, URIs: []*url.URL{HandlerNodeURI(node)}, Server: true, Client: true}
}

// HandlerCSRTemplate is the certificate request of node's qvirt-handler: the names of
// HandlerNodeSpec, which the signer (controllers/certs) requires exactly.
func HandlerCSRTemplate(node string) *x509.CertificateRequest {
	spec := HandlerNodeSpec(node)
	return &x509.CertificateRequest{Subject: pkix.Name{CommonName: spec.CommonName}, DNSNames: spec.DNSNames, URIs: spec.URIs}
}

// HandlerNodeOf is the node a qvirt-handler certificate names in its URI SAN. A certificate
// naming none (the shared handler certificate of earlier versions) or more than one is an
// error: it speaks for no single node.
func HandlerNodeOf(c *x509.Certificate) (string, error) {
	var nodes []string
	for _, u := range c.URIs {
		if u.Scheme == HandlerNodeScheme {
			nodes = append(nodes, u.Host)
		}
	}
	switch len(nodes) {
	case 0:
		return "", fmt.Errorf("%s names no node (no %s:// URI)", describe(c), HandlerNodeScheme)
	case 1:
		return nodes[0], nil
	}
	return "", fmt.Errorf("%s names more than one node: %s", describe(c), strings.Join(nodes, ", "))
}

// WrongNodeError is a qvirt-handler certificate that does not speak for the node its peer
// meant to reach: another node's agent answered (or an address was redirected to it).
type WrongNodeError struct {
	// Want is the node meant; Got the node the certificate names ("" when it names none).
	Want, Got string
	// Problem says why Got is empty.
	Problem error
}

func (e *WrongNodeError) Error() string {
	if e.Got == "" {
		return fmt.Sprintf("qvirt-handler certificate is not for node %s: %v", e.Want, e.Problem)
	}
	return fmt.Sprintf("qvirt-handler certificate is for node %s, not for node %s", e.Got, e.Want)
}

// CheckHandlerNode checks that c, an already verified qvirt-handler certificate, names node;
// otherwise the error is a *WrongNodeError.
func CheckHandlerNode(c *x509.Certificate, node string) error {
	got, err := HandlerNodeOf(c)
	if err != nil {
		return &WrongNodeError{Want: node, Problem: err}
	}
	if got != node {
		return &WrongNodeError{Want: node, Got: got}
	}
	return nil
}

// HandlerClientConfig is ClientConfig(p, HandlerName) that also requires the server's
// certificate to name node: the configuration for reaching the node agent of that node.
func HandlerClientConfig(p Provider, node string) *tls.Config {
	cfg := ClientConfig(p, HandlerName)
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := verify(cs); err != nil {
			return err
		}
		return CheckHandlerNode(cs.PeerCertificates[0], node)
	}
	return cfg
}
