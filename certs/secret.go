package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// The objects the controller keeps in qvirt's install namespace, and the names in the leaves.
const (
	// CASecret holds the CA: tls.crt (current CA certificate), tls.key (its key) and ca.crt (the
	// trust bundle: the current CA, then the previous one during a rotation's overlap).
	CASecret = "qvirt-ca"
	// APISecret holds qvirt-api's client certificate, its key and the bundle.
	APISecret = "qvirt-api-certs"
	// BundleConfigMap holds the trust bundle alone, in key ca.crt, for the node agents: a
	// ConfigMap, since it is public. A node agent's own key never leaves its memory; its
	// certificate comes from a CertificateSigningRequest (HandlerSignerName).
	BundleConfigMap = "qvirt-ca-bundle"
	// LegacyHandlerSecret held the one serving certificate and key every node agent shared
	// before each got its own; the controller deletes it where an earlier version left it.
	LegacyHandlerSecret = "qvirt-handler-certs"

	// HandlerSignerName is the signerName of a node agent's CertificateSigningRequest. Only
	// qvirt-controller signs for it, and only for the node the requester's token is bound to.
	HandlerSignerName = "qvirt.io/handler"

	// HandlerName is the CN and DNS SAN of every node agent's certificate: the name the peers
	// check first (handlers are reached by node IP, which no certificate names). The node comes
	// with it in a URI SAN (HandlerNodeURI), checked against the node meant.
	HandlerName = "qvirt-handler"
	// APIName is the CN of qvirt-api's client certificate: the name the handler allows.
	APIName = "qvirt-api"
)

// Keys of the Secrets (the kubernetes.io/tls layout, plus ca.crt) and of the bundle ConfigMap
// (ca.crt).
const (
	KeyCert    = corev1.TLSCertKey       // tls.crt
	KeyPrivate = corev1.TLSPrivateKeyKey // tls.key
	KeyCA      = "ca.crt"
)

// APISpec is the leaf the controller issues into APISecret; node agents' leaves are
// HandlerNodeSpec, one per node, signed from certificate signing requests.
var APISpec = LeafSpec{CommonName: APIName, Client: true}

// Material is what a TLS peer needs from a leaf Secret: its certificate chain and key, and the
// CAs it trusts for the other side.
type Material struct {
	// Certificate is tls.crt and tls.key, with Leaf parsed.
	Certificate tls.Certificate
	// CAs is ca.crt, the trust bundle, current CA first; Pool holds the same certificates.
	CAs  []*x509.Certificate
	Pool *x509.CertPool
}

// Leaf is the parsed certificate of m.
func (m *Material) Leaf() *x509.Certificate { return m.Certificate.Leaf }

// ParseMaterial parses a leaf Secret's data (tls.crt, tls.key, ca.crt). Errors are *KeyError
// naming the key at fault.
func ParseMaterial(data map[string][]byte) (*Material, error) {
	for _, k := range []string{KeyCert, KeyPrivate, KeyCA} {
		if len(data[k]) == 0 {
			return nil, &KeyError{Key: k, Err: errors.New("missing or empty")}
		}
	}
	certs, err := DecodeCerts(data[KeyCert])
	if err != nil {
		return nil, &KeyError{Key: KeyCert, Err: err}
	}
	pair, err := ParsePair(data[KeyCert], data[KeyPrivate])
	if err != nil {
		return nil, err
	}
	cas, err := DecodeCerts(data[KeyCA])
	if err != nil {
		return nil, &KeyError{Key: KeyCA, Err: err}
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	chain := make([][]byte, len(certs))
	for i, c := range certs {
		chain[i] = c.Raw
	}
	return &Material{
		Certificate: tls.Certificate{Certificate: chain, PrivateKey: pair.Key, Leaf: pair.Cert},
		CAs:         cas,
		Pool:        pool,
	}, nil
}

// MaterialData is the Secret data for a leaf pair and a trust bundle: the inverse of
// ParseMaterial.
func MaterialData(leaf *Pair, bundle []*x509.Certificate) (map[string][]byte, error) {
	key, err := leaf.KeyPEM()
	if err != nil {
		return nil, err
	}
	return map[string][]byte{KeyCert: leaf.CertPEM(), KeyPrivate: key, KeyCA: EncodeCerts(bundle...)}, nil
}

// SecretError is a problem with one Secret, naming it and the key at fault when there is one.
type SecretError struct {
	Namespace, Name string
	Err             error
}

func (e *SecretError) Error() string {
	return fmt.Sprintf("Secret %s/%s: %v", e.Namespace, e.Name, e.Err)
}

func (e *SecretError) Unwrap() error { return e.Err }
