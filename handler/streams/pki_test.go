package streams_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// authority is a CA made by the test, able to issue server and client certificates.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newAuthority(t *testing.T, name string) *authority {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("create CA %s: %v", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issued is a certificate with its key, as PEM and as a tls.Certificate.
type issued struct {
	certPEM, keyPEM []byte
	tls             tls.Certificate
}

// issue signs a leaf certificate; server certificates are valid for 127.0.0.1 and localhost.
func (a *authority) issue(t *testing.T, cn string, server bool) issued {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatalf("issue %s: %v", cn, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	out := issued{
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}
	out.tls, err = tls.X509KeyPair(out.certPEM, out.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// pki is the test's certificates: the CA signing the server's and qvirt-api's certificates, the
// files the server reads, and a second CA nobody trusts.
type pki struct {
	ca, otherCA                 *authority
	server, client, otherClient issued
	certFile, keyFile, caFile   string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{ca: newAuthority(t, "qvirt-test-ca"), otherCA: newAuthority(t, "someone-else-ca")}
	p.server = p.ca.issue(t, "qvirt-handler", true)
	p.client = p.ca.issue(t, "qvirt-api", false)
	p.otherClient = p.otherCA.issue(t, "qvirt-api", false)
	dir := t.TempDir()
	p.certFile, p.keyFile, p.caFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	p.writeServer(t, p.server)
	if err := os.WriteFile(p.caFile, p.ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *pki) writeServer(t *testing.T, s issued) {
	t.Helper()
	if err := os.WriteFile(p.keyFile, s.keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.certFile, s.certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
}

// httpClient trusts the test CA and presents cert (none when nil).
func (p *pki) httpClient(cert *tls.Certificate) *http.Client {
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.cert)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
}
