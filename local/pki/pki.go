// Package pki makes the certificates of a local cluster: one CA for the API server and its clients,
// one for the aggregation layer's front proxy, and the leaf certificates signed by them. Keys are
// ECDSA P-256; everything is written as PEM files under the cluster's state directory.
package pki

import (
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
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// Validity of the certificates: a local cluster is recreated long before.
const Validity = 365 * 24 * time.Hour

// CA is a certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// Leaf describes a certificate to issue.
type Leaf struct {
	CommonName    string
	Organizations []string
	DNSNames      []string
	IPs           []net.IP
	// Server and Client select the extended key usages.
	Server, Client bool
}

// LoadOrCreateCA reads dir/name.crt and dir/name.key, creating them when absent.
func LoadOrCreateCA(dir, name string) (*CA, error) {
	crtPath, keyPath := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if ca, err := loadCA(crtPath, keyPath); err == nil {
		return ca, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	crt, err := cert.NewSelfSignedCACert(cert.Config{CommonName: name}, key)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", name, err)
	}
	if err := writePair(crtPath, keyPath, crt.Raw, key); err != nil {
		return nil, err
	}
	return &CA{Cert: crt, Key: key}, nil
}

func loadCA(crtPath, keyPath string) (*CA, error) {
	certs, err := cert.CertsFromFile(crtPath)
	if err != nil {
		return nil, err
	}
	key, err := keyutil.PrivateKeyFromFile(keyPath)
	if err != nil {
		return nil, err
	}
	signer, ok := key.(crypto.Signer)
	if !ok || len(certs) == 0 {
		return nil, fmt.Errorf("%s: not a CA key pair", crtPath)
	}
	return &CA{Cert: certs[0], Key: signer}, nil
}

// Issue writes dir/name.crt and dir/name.key, a certificate for l signed by ca, replacing any.
func (ca *CA) Issue(dir, name string, l Leaf) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: l.CommonName, Organization: l.Organizations},
		DNSNames:     l.DNSNames, IPAddresses: l.IPs,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(Validity),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return fmt.Errorf("issue %s: %w", name, err)
	}
	return writePair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), der, key)
}

// ServiceAccountKey writes dir/name.key (and its public half dir/name.pub) unless present: the
// key the API server signs service account tokens with.
func ServiceAccountKey(dir, name string) error {
	keyPath, pubPath := filepath.Join(dir, name+".key"), filepath.Join(dir, name+".pub")
	if _, err := os.Stat(keyPath); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return err
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyPath, keyPEM, 0o600)
}

func writePair(crtPath, keyPath string, der []byte, key crypto.Signer) error {
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(crtPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(crtPath, pem.EncodeToMemory(&pem.Block{Type: cert.CertificateBlockType, Bytes: der}), 0o644)
}
