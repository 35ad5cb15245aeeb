package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
)

// The Secrets the controller keeps in qvirt's install namespace, and the names in the leaves.
const (
	// CASecret holds the CA: tls.crt (current CA certificate), tls.key (its key) and ca.crt (the
	// trust bundle: the current CA, then the previous one during a rotation's overlap).
	CASecret = "qvirt-ca"
	// HandlerSecret holds qvirt-handler's stream server certificate, its key and the bundle.
	HandlerSecret = "qvirt-handler-certs"
	// APISecret holds qvirt-api's client certificate, its key and the bundle.
	APISecret = "qvirt-api-certs"

	// HandlerName is the CN and only DNS SAN of the handler's serving certificate: the name
	// qvirt-api checks (handlers are reached by node IP, which no certificate names).
	HandlerName = "qvirt-handler"
	// APIName is the CN of qvirt-api's client certificate: the name the handler allows.
	APIName = "qvirt-api"
)

// Keys of the Secrets (the kubernetes.io/tls layout, plus ca.crt).
const (
	KeyCert    = corev1.TLSCertKey       // tls.crt
	KeyPrivate = corev1.TLSPrivateKeyKey // tls.key
	KeyCA      = "ca.crt"
)

// HandlerSpec and APISpec are the two leaves the controller issues.
var (
	// A node agent is also a client: of the other node agents' migration endpoints (handler/migproxy).
	HandlerSpec = LeafSpec{CommonName: HandlerName, DNSNames: []string{HandlerName}, Server: true, Client: true}
	APISpec     = LeafSpec{CommonName: APIName, Client: true}
)

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
