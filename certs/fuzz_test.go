package certs_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/qvirt/qvirt/certs"
)

// FuzzParseMaterial feeds arbitrary Secret values to the decoder the Source and the controller
// use: it must never panic, must name a key in every error, and what it accepts must be
// consistent (the key matches the certificate, the pool holds the bundle).
func FuzzParseMaterial(f *testing.F) {
	now := time.Now()
	ca, err := certs.NewCA("ca", now, now.Add(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	leaf, err := ca.Issue(certs.APISpec, now, now.Add(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	good, err := certs.MaterialData(leaf, []*x509.Certificate{ca.Cert})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good[certs.KeyCert], good[certs.KeyPrivate], good[certs.KeyCA])
	f.Add(good[certs.KeyCert][:100], good[certs.KeyPrivate], good[certs.KeyCA])
	f.Add(good[certs.KeyCA], good[certs.KeyPrivate], append(bytes.Clone(good[certs.KeyCA]), "x"...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), []byte{}, []byte("\n"))
	f.Fuzz(func(t *testing.T, crt, key, bundle []byte) {
		m, err := certs.ParseMaterial(map[string][]byte{certs.KeyCert: crt, certs.KeyPrivate: key, certs.KeyCA: bundle})
		if err != nil {
			var ke *certs.KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("error %v names no key", err)
			}
			return
		}
		if m.Leaf() == nil || len(m.CAs) == 0 || m.Pool == nil {
			t.Fatalf("accepted material is incomplete: %+v", m)
		}
		if _, err := certs.ParsePair(crt, key); err != nil {
			t.Fatalf("ParseMaterial accepted a pair ParsePair refuses: %v", err)
		}
		// Re-encoding what was accepted decodes to the same certificates.
		again, err := certs.DecodeCerts(certs.EncodeCerts(m.CAs...))
		if err != nil || len(again) != len(m.CAs) {
			t.Fatalf("re-encoded bundle: %d certificates, %v", len(again), err)
		}
	})
}

// FuzzCheckLeaf runs the controller's rotation decision on arbitrary Secret values: no panic,
// a verdict that keeps a certificate has parsed it, and one that refuses it says why.
func FuzzCheckLeaf(f *testing.F) {
	now := time.Now()
	ca, err := certs.NewCA("ca", now, now.Add(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	leaf, err := ca.Issue(certs.HandlerNodeSpec("node-a"), now, now.Add(time.Hour))
	if err != nil {
		f.Fatal(err)
	}
	key, err := leaf.KeyPEM()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(leaf.CertPEM(), key, int64(0))
	f.Add(leaf.CertPEM(), key, int64(time.Hour))
	f.Add(ca.CertPEM(), key, int64(0))
	f.Fuzz(func(t *testing.T, crt, key []byte, offset int64) {
		v := certs.CheckLeaf(crt, key, certs.HandlerNodeSpec("node-a"), ca.Cert, now.Add(time.Duration(offset)))
		if v.Keep() && v.Pair == nil {
			t.Fatal("kept without a parsed certificate")
		}
		if !v.Keep() && v.Err == nil {
			t.Fatalf("refused (%s) without saying why", v.Reason)
		}
	})
}
