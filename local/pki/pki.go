// Package pki writes the certificates of a local cluster as PEM files under its state directory:
// one CA for the API server and its clients, one for the aggregation layer's front proxy, one
// for etcd and its only client (the API server), and the leaf certificates signed by them. The certificates themselves are made by package certs (ECDSA
// P-256); this package only decides their lifetimes and where they live on disk.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/qvirt/qvirt/certs"
)

// Lifetimes: a local cluster is recreated long before either ends. The CA outlives many runs of
// `local up`, which reissue the leaves on every start.
const (
	CAValidity = 10 * 365 * 24 * time.Hour
	Validity   = 365 * 24 * time.Hour
	// backdate lets a process whose clock is slightly behind accept a certificate made just now.
	backdate = time.Minute
)

// CA is a certificate authority kept as dir/name.crt and dir/name.key.
type CA struct {
	Pair *certs.Pair
}

// Leaf describes a certificate to issue.
type Leaf = certs.LeafSpec

// LoadOrCreateCA reads dir/name.crt and dir/name.key, creating both when either is absent.
func LoadOrCreateCA(dir, name string) (*CA, error) {
	crtPath, keyPath := paths(dir, name)
	ca, err := loadCA(crtPath, keyPath)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return ca, err
	}
	now := time.Now()
	pair, err := certs.NewCA(name, now.Add(-backdate), now.Add(CAValidity))
	if err != nil {
		return nil, err
	}
	if err := writePair(crtPath, keyPath, pair); err != nil {
		return nil, err
	}
	return &CA{Pair: pair}, nil
}

func loadCA(crtPath, keyPath string) (*CA, error) {
	crtPEM, err := os.ReadFile(crtPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	pair, err := certs.ParsePair(crtPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", crtPath, err)
	}
	return &CA{Pair: pair}, nil
}

// Issue writes dir/name.crt and dir/name.key, a certificate for l signed by ca, replacing any.
func (ca *CA) Issue(dir, name string, l Leaf) error {
	now := time.Now()
	leaf, err := ca.Pair.Issue(l, now.Add(-backdate), now.Add(Validity))
	if err != nil {
		return fmt.Errorf("issue %s: %w", name, err)
	}
	crtPath, keyPath := paths(dir, name)
	return writePair(crtPath, keyPath, leaf)
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
		return fmt.Errorf("service account key %s: %w", keyPath, err)
	}
	keyPEM, err := certs.EncodeKey(key)
	if err != nil {
		return fmt.Errorf("service account key %s: %w", keyPath, err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		return fmt.Errorf("service account key %s: %w", pubPath, err)
	}
	if err := os.WriteFile(pubPath, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyPath, keyPEM, 0o600)
}

func paths(dir, name string) (crt, key string) {
	return filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
}

// writePair writes p as PEM: the certificate alone and the key as PKCS #8, readable by everyone
// who reads these files (kube-apiserver, etcd, kubeconfigs, qvirt-api, the webhook server).
func writePair(crtPath, keyPath string, p *certs.Pair) error {
	keyPEM, err := p.KeyPEM()
	if err != nil {
		return fmt.Errorf("%s: %w", keyPath, err)
	}
	if err := os.MkdirAll(filepath.Dir(crtPath), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return os.WriteFile(crtPath, p.CertPEM(), 0o644)
}
