package certs

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"time"
)

// DefaultCAValidity and DefaultLeafValidity are the lifetimes the controller uses unless told
// otherwise. A leaf lives much shorter than the CA, so that the CA's 20% tail (about 73 days)
// always outlasts a leaf and a rotated CA's overlap (one leaf lifetime) ends before the old CA
// expires.
const (
	DefaultCAValidity   = 365 * 24 * time.Hour
	DefaultLeafValidity = 30 * 24 * time.Hour
)

// Pair is a certificate and its private key.
type Pair struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// LeafSpec describes a leaf certificate: its subject (CN and O), SANs and extended key usages.
type LeafSpec struct {
	CommonName string
	// Organizations are the subject's O values; kube-apiserver reads them as a client's groups.
	Organizations []string
	DNSNames      []string
	// IPs are IP address SANs, for a server reached by address rather than by name.
	IPs []net.IP
	// URIs are URI SANs: identities rather than addresses (a node agent's node, HandlerNodeURI).
	URIs []*url.URL
	// Server and Client select the extended key usages serverAuth and clientAuth.
	Server, Client bool
}

// NewCA makes a self-signed CA certificate with a new ECDSA P-256 key, valid from notBefore to
// notAfter. Callers backdate notBefore a little so that a peer whose clock is slightly behind
// still accepts it.
func NewCA(commonName string, notBefore, notAfter time.Time) (*Pair, error) {
	if !notAfter.After(notBefore) {
		return nil, fmt.Errorf("CA %s: notAfter %s is not after notBefore %s", commonName, notAfter, notBefore)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA %s: generate key: %w", commonName, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		// Leaves only: this CA signs no intermediate.
		MaxPathLenZero: true,
	}
	return sign(tmpl, tmpl, key, key)
}

// Issue signs a leaf for spec with a new ECDSA P-256 key. notAfter is cut to the CA's own
// notAfter: a leaf never outlives the certificate that vouches for it.
func (ca *Pair) Issue(spec LeafSpec, notBefore, notAfter time.Time) (*Pair, error) {
	if err := checkLeafSpec(spec); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("issue %s: generate key: %w", spec.CommonName, err)
	}
	cert, err := ca.Sign(spec, key.Public(), notBefore, notAfter)
	if err != nil {
		return nil, err
	}
	return &Pair{Cert: cert, Key: key}, nil
}

// Sign signs a leaf for spec certifying pub, a key someone else holds (the public key of a
// certificate signing request). notAfter is cut to the CA's own notAfter, as in Issue.
func (ca *Pair) Sign(spec LeafSpec, pub crypto.PublicKey, notBefore, notAfter time.Time) (*x509.Certificate, error) {
	if err := checkLeafSpec(spec); err != nil {
		return nil, err
	}
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if notBefore.Before(ca.Cert.NotBefore) {
		notBefore = ca.Cert.NotBefore
	}
	if !notAfter.After(notBefore) {
		return nil, fmt.Errorf("issue %s: no validity left (CA %s expires %s)", spec.CommonName, ca.Cert.Subject.CommonName, ca.Cert.NotAfter)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: spec.CommonName, Organization: slices.Clone(spec.Organizations)},
		DNSNames:     slices.Clone(spec.DNSNames),
		IPAddresses:  slices.Clone(spec.IPs),
		URIs:         slices.Clone(spec.URIs),
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  extKeyUsages(spec),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate %s: %w", spec.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate %s just signed: %w", spec.CommonName, err)
	}
	return cert, nil
}

func checkLeafSpec(spec LeafSpec) error {
	if spec.CommonName == "" {
		return errors.New("issue leaf: empty common name")
	}
	if !spec.Server && !spec.Client {
		return fmt.Errorf("issue %s: neither a server nor a client certificate", spec.CommonName)
	}
	return nil
}

func extKeyUsages(spec LeafSpec) []x509.ExtKeyUsage {
	var out []x509.ExtKeyUsage
	if spec.Server {
		out = append(out, x509.ExtKeyUsageServerAuth)
	}
	if spec.Client {
		out = append(out, x509.ExtKeyUsageClientAuth)
	}
	return out
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey crypto.Signer) (*Pair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("sign certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse certificate %s just signed: %w", tmpl.Subject.CommonName, err)
	}
	return &Pair{Cert: cert, Key: key}, nil
}

// newSerial is a random 128-bit serial number, as RFC 5280 recommends (at most 20 octets).
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// CertPEM is the certificate as one PEM block.
func (p *Pair) CertPEM() []byte { return EncodeCerts(p.Cert) }

// KeyPEM is the private key as a PKCS #8 PEM block.
func (p *Pair) KeyPEM() ([]byte, error) { return EncodeKey(p.Key) }

// EncodeCerts is certs as consecutive PEM CERTIFICATE blocks (a bundle).
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

// EncodeKey is key as a PKCS #8 "PRIVATE KEY" PEM block.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// DecodeCerts parses a PEM bundle of one or more certificates. It is strict: a block of another
// type, a certificate that does not parse or anything but whitespace outside the blocks is an
// error, so a truncated or garbled Secret value is noticed rather than half used.
func DecodeCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for {
		block, next := pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is a %q, want CERTIFICATE", len(out)+1, block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(out)+1, err)
		}
		out = append(out, cert)
		rest = next
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("%d bytes that are not a PEM block after certificate %d", len(bytes.TrimSpace(rest)), len(out))
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// DecodeKey parses one PEM private key: PKCS #8, SEC 1 ("EC PRIVATE KEY") or PKCS #1
// ("RSA PRIVATE KEY").
func DecodeKey(data []byte) (crypto.Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM private key")
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("more than one PEM block")
	}
	var key any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block is a %q, want a private key", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", block.Type, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%T is not a signing key", key)
	}
	return signer, nil
}

// ParsePair parses a PEM certificate (the first of a bundle is the leaf; the rest are ignored
// here) and its PEM key, and checks that they belong together.
func ParsePair(certPEM, keyPEM []byte) (*Pair, error) {
	certs, err := DecodeCerts(certPEM)
	if err != nil {
		return nil, &KeyError{Key: KeyCert, Err: err}
	}
	key, err := DecodeKey(keyPEM)
	if err != nil {
		return nil, &KeyError{Key: KeyPrivate, Err: err}
	}
	if !publicKeyEqual(certs[0].PublicKey, key.Public()) {
		return nil, &KeyError{Key: KeyPrivate, Err: fmt.Errorf("the key does not match the certificate %s", describe(certs[0]))}
	}
	return &Pair{Cert: certs[0], Key: key}, nil
}

func publicKeyEqual(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}

// describe names a certificate in messages: subject CN and serial.
func describe(c *x509.Certificate) string {
	return fmt.Sprintf("CN=%s serial %x", c.Subject.CommonName, c.SerialNumber)
}

// KeyError is a problem with one key of a Secret (tls.crt, tls.key or ca.crt).
type KeyError struct {
	Key string
	Err error
}

func (e *KeyError) Error() string { return e.Key + ": " + e.Err.Error() }
func (e *KeyError) Unwrap() error { return e.Err }
