package pki_test

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/local/pki"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := certs.DecodeCerts(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cs[0]
}

// reloadCA checks that LoadOrCreateCA finds the CA want in dir rather than making a new one.
func reloadCA(t *testing.T, dir string, want *pki.CA) {
	t.Helper()
	got, err := pki.LoadOrCreateCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	if got.Pair.Cert.SerialNumber.Cmp(want.Pair.Cert.SerialNumber) != 0 {
		t.Errorf("made a new CA (serial %x) instead of loading serial %x", got.Pair.Cert.SerialNumber, want.Pair.Cert.SerialNumber)
	}
}

func TestLoadOrCreateCAKeepsTheCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	first, err := pki.LoadOrCreateCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	onDisk := readCert(t, filepath.Join(dir, "ca.crt"))
	if !onDisk.IsCA || onDisk.Subject.CommonName != "ca" || onDisk.SerialNumber.Cmp(first.Pair.Cert.SerialNumber) != 0 {
		t.Fatalf("ca.crt is CN=%s IsCA=%t serial %x, want the CA just made", onDisk.Subject.CommonName, onDisk.IsCA, onDisk.SerialNumber)
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v, mode %v, want 0600", err, fi)
	}
	reloadCA(t, dir, first)

	// A state directory from before package certs made these files holds the CA key as SEC 1
	// ("EC PRIVATE KEY"); it must still load rather than be replaced, or every kubeconfig breaks.
	der, err := x509.MarshalECPrivateKey(first.Pair.Key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	reloadCA(t, dir, first)
}

func TestLoadOrCreateCARefusesMismatchedKey(t *testing.T) {
	dir := t.TempDir()
	if _, err := pki.LoadOrCreateCA(dir, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadOrCreateCA(dir, "b"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "b.key"), filepath.Join(dir, "a.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.LoadOrCreateCA(dir, "a"); err == nil {
		t.Error("a CA whose key belongs to another certificate loaded")
	}
}

func TestIssueWritesUsableLeaf(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	ip := net.IPv4(192, 0, 2, 7)
	leaf := pki.Leaf{CommonName: "kube-apiserver", Organizations: []string{"system:masters"},
		DNSNames: []string{"kubernetes", "localhost"}, IPs: []net.IP{ip}, Server: true, Client: true}
	if err := ca.Issue(filepath.Join(dir, "leaves"), "apiserver", leaf); err != nil {
		t.Fatal(err)
	}
	// Loaded the way kube-apiserver and etcd load --tls-cert-file/--tls-private-key-file.
	kp, err := tls.LoadX509KeyPair(filepath.Join(dir, "leaves", "apiserver.crt"), filepath.Join(dir, "leaves", "apiserver.key"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(kp.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(readCert(t, filepath.Join(dir, "ca.crt")))
	for _, host := range []string{"kubernetes", "localhost", ip.String()} {
		opts := x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		if _, err := c.Verify(opts); err != nil {
			t.Errorf("as a server for %s: %v", host, err)
		}
	}
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("as a client: %v", err)
	}
	if c.Subject.CommonName != "kube-apiserver" || len(c.Subject.Organization) != 1 || c.Subject.Organization[0] != "system:masters" {
		t.Errorf("subject %s, want CN=kube-apiserver O=system:masters", c.Subject)
	}
	if got := time.Until(c.NotAfter); got < pki.Validity-time.Hour || got > pki.Validity {
		t.Errorf("leaf valid for %s more, want about %s", got, pki.Validity)
	}
}

func TestIssueRefusesNoUsage(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.LoadOrCreateCA(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.Issue(dir, "x", pki.Leaf{CommonName: "x"}); err == nil {
		t.Error("a leaf with neither server nor client usage was issued")
	}
	if _, err := os.Stat(filepath.Join(dir, "x.crt")); !os.IsNotExist(err) {
		t.Errorf("x.crt written anyway: %v", err)
	}
}

func TestServiceAccountKey(t *testing.T) {
	dir := t.TempDir()
	if err := pki.ServiceAccountKey(dir, "sa"); err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := certs.DecodeKey(keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM, err := os.ReadFile(filepath.Join(dir, "sa.pub"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pubPEM)
	if block == nil || block.Type != "PUBLIC KEY" {
		t.Fatalf("sa.pub is not a PEM public key: %q", pubPEM)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !key.Public().(*ecdsa.PublicKey).Equal(pub) {
		t.Error("sa.pub is not sa.key's public half")
	}
	if err := pki.ServiceAccountKey(dir, "sa"); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "sa.key")); string(again) != string(keyPEM) {
		t.Error("a second call replaced the existing key (every issued token would stop verifying)")
	}
}
