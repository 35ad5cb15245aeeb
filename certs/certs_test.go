package certs_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/qvirt/qvirt/certs"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// handlerSpec is node-a's node agent leaf.
var handlerSpec = certs.HandlerNodeSpec("node-a")

func mustCA(t *testing.T, name string, from time.Time, life time.Duration) *certs.Pair {
	t.Helper()
	ca, err := certs.NewCA(name, from, from.Add(life))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustIssue(t *testing.T, ca *certs.Pair, spec certs.LeafSpec, from time.Time, life time.Duration) *certs.Pair {
	t.Helper()
	p, err := ca.Issue(spec, from, from.Add(life))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func pemOf(t *testing.T, p *certs.Pair) (crt, key []byte) {
	t.Helper()
	key, err := p.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return p.CertPEM(), key
}

func TestIssueCutsLeafToCA(t *testing.T) {
	ca := mustCA(t, "ca", t0, time.Hour)
	leaf := mustIssue(t, ca, handlerSpec, t0, 10*time.Hour)
	if !leaf.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Errorf("leaf notAfter %s, want the CA's %s", leaf.Cert.NotAfter, ca.Cert.NotAfter)
	}
	if leaf.Cert.Subject.CommonName != certs.HandlerName || len(leaf.Cert.DNSNames) != 1 || leaf.Cert.DNSNames[0] != certs.HandlerName {
		t.Errorf("leaf names CN=%s SANs=%v", leaf.Cert.Subject.CommonName, leaf.Cert.DNSNames)
	}
	if len(leaf.Cert.URIs) != 1 || leaf.Cert.URIs[0].String() != "qvirt-handler://node-a" {
		t.Errorf("leaf URIs %v, want [qvirt-handler://node-a]", leaf.Cert.URIs)
	}
	if err := certs.SignedBy(leaf.Cert, ca.Cert); err != nil {
		t.Error(err)
	}
}

func TestLeafOrganizationsAndIPs(t *testing.T) {
	ca := mustCA(t, "ca", t0, 100*time.Hour)
	spec := certs.LeafSpec{CommonName: "admin", Organizations: []string{"system:masters"},
		IPs: []net.IP{net.IPv4(10, 0, 0, 1)}, Server: true, Client: true}
	leaf := mustIssue(t, ca, spec, t0, 10*time.Hour)
	if got := leaf.Cert.Subject.Organization; len(got) != 1 || got[0] != "system:masters" {
		t.Errorf("organizations %v, want [system:masters]", got)
	}
	if err := leaf.Cert.VerifyHostname("10.0.0.1"); err != nil {
		t.Errorf("leaf does not name its IP: %v", err)
	}
	crt, key := pemOf(t, leaf)
	if v := certs.CheckLeaf(crt, key, spec, ca.Cert, t0.Add(time.Hour)); !v.Keep() {
		t.Errorf("leaf as issued: %s %v", v.Reason, v.Err)
	}
	for name, change := range map[string]func(*certs.LeafSpec){
		"another IP":      func(s *certs.LeafSpec) { s.IPs = []net.IP{net.IPv4(10, 0, 0, 2)} },
		"no IP":           func(s *certs.LeafSpec) { s.IPs = nil },
		"no organization": func(s *certs.LeafSpec) { s.Organizations = nil },
	} {
		want := spec
		change(&want)
		if v := certs.CheckLeaf(crt, key, want, ca.Cert, t0.Add(time.Hour)); v.Reason != certs.WrongNames {
			t.Errorf("%s: reason %q (%v), want %q", name, v.Reason, v.Err, certs.WrongNames)
		}
	}
}

func TestRenewAt(t *testing.T) {
	ca := mustCA(t, "ca", t0, 100*time.Hour)
	if got, want := certs.RenewAt(ca.Cert), t0.Add(80*time.Hour); !got.Equal(want) {
		t.Errorf("RenewAt = %s, want %s", got, want)
	}
}

func TestCheckLeaf(t *testing.T) {
	ca := mustCA(t, "ca", t0, 100*time.Hour)
	other := mustCA(t, "other", t0, 100*time.Hour)
	good := mustIssue(t, ca, handlerSpec, t0, 10*time.Hour)
	crt, key := pemOf(t, good)
	_, otherKey := pemOf(t, mustIssue(t, ca, handlerSpec, t0, 10*time.Hour))
	foreignCrt, foreignKey := pemOf(t, mustIssue(t, other, handlerSpec, t0, 10*time.Hour))
	clientCrt, clientKey := pemOf(t, mustIssue(t, ca, certs.APISpec, t0, 10*time.Hour))
	nodeBCrt, nodeBKey := pemOf(t, mustIssue(t, ca, certs.HandlerNodeSpec("node-b"), t0, 10*time.Hour))
	for _, tc := range []struct {
		name     string
		crt, key []byte
		now      time.Time
		want     certs.Reason
		wantKey  string
	}{
		{"fresh", crt, key, t0.Add(time.Hour), "", ""},
		{"just before 80%", crt, key, t0.Add(8*time.Hour - time.Second), "", ""},
		{"at 80%", crt, key, t0.Add(8 * time.Hour), certs.Due, certs.KeyCert},
		{"expired", crt, key, t0.Add(11 * time.Hour), certs.Due, certs.KeyCert},
		{"no cert", nil, key, t0, certs.Missing, certs.KeyCert},
		{"no key", crt, nil, t0, certs.Missing, certs.KeyPrivate},
		{"garbage cert", []byte("garbage"), key, t0, certs.Corrupt, certs.KeyCert},
		{"truncated cert", crt[:len(crt)/2], key, t0, certs.Corrupt, certs.KeyCert},
		{"key of another cert", crt, otherKey, t0, certs.Corrupt, certs.KeyPrivate},
		{"other CA", foreignCrt, foreignKey, t0, certs.WrongCA, certs.KeyCert},
		{"client cert where a server one is wanted", clientCrt, clientKey, t0, certs.WrongNames, certs.KeyCert},
		{"another node's", nodeBCrt, nodeBKey, t0, certs.WrongNames, certs.KeyCert},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := certs.CheckLeaf(tc.crt, tc.key, handlerSpec, ca.Cert, tc.now)
			if v.Reason != tc.want {
				t.Fatalf("reason %q (%v), want %q", v.Reason, v.Err, tc.want)
			}
			if tc.wantKey == "" {
				if !v.RenewAt.Equal(t0.Add(8 * time.Hour)) {
					t.Errorf("RenewAt %s", v.RenewAt)
				}
				return
			}
			var ke *certs.KeyError
			if !errors.As(v.Err, &ke) || ke.Key != tc.wantKey {
				t.Errorf("error %v does not name key %s", v.Err, tc.wantKey)
			}
		})
	}
}

func TestCheckCA(t *testing.T) {
	ca := mustCA(t, "ca", t0, 100*time.Hour)
	crt, key := pemOf(t, ca)
	if v := certs.CheckCA(crt, key, t0.Add(time.Hour)); !v.Keep() {
		t.Errorf("fresh CA: %s %v", v.Reason, v.Err)
	}
	if v := certs.CheckCA(crt, key, t0.Add(80*time.Hour)); v.Reason != certs.Due {
		t.Errorf("CA at 80%%: %q", v.Reason)
	}
	leafCrt, leafKey := pemOf(t, mustIssue(t, ca, certs.APISpec, t0, time.Hour))
	if v := certs.CheckCA(leafCrt, leafKey, t0); v.Reason != certs.Corrupt {
		t.Errorf("a leaf as CA: %q", v.Reason)
	}
}

func TestDecodeCertsStrict(t *testing.T) {
	ca := mustCA(t, "ca", t0, time.Hour)
	two := certs.EncodeCerts(ca.Cert, mustCA(t, "b", t0, time.Hour).Cert)
	if got, err := certs.DecodeCerts(two); err != nil || len(got) != 2 {
		t.Fatalf("bundle of two: %d, %v", len(got), err)
	}
	for name, data := range map[string][]byte{
		"empty":            nil,
		"trailing garbage": append(bytes.Clone(two), "junk"...),
		"a key block":      must(ca.KeyPEM()),
	} {
		if _, err := certs.DecodeCerts(data); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func TestParseMaterialNamesKey(t *testing.T) {
	ca := mustCA(t, "ca", t0, time.Hour)
	good, err := certs.MaterialData(mustIssue(t, ca, certs.APISpec, t0, time.Hour), []*x509.Certificate{ca.Cert})
	if err != nil {
		t.Fatal(err)
	}
	m, err := certs.ParseMaterial(good)
	if err != nil {
		t.Fatal(err)
	}
	if m.Leaf().Subject.CommonName != certs.APIName || len(m.CAs) != 1 {
		t.Errorf("material: CN %s, %d CAs", m.Leaf().Subject.CommonName, len(m.CAs))
	}
	for _, key := range []string{certs.KeyCert, certs.KeyPrivate, certs.KeyCA} {
		for name, value := range map[string][]byte{"missing": nil, "garbage": []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")} {
			data := maps.Clone(good)
			data[key] = value
			_, err := certs.ParseMaterial(data)
			var ke *certs.KeyError
			if !errors.As(err, &ke) || ke.Key != key {
				t.Errorf("%s %s: error %v does not name the key", name, key, err)
			}
		}
	}
}

// material is a leaf for spec signed by ca, trusting trust.
func material(t *testing.T, ca *certs.Pair, spec certs.LeafSpec, trust ...*x509.Certificate) *certs.Material {
	t.Helper()
	now := time.Now()
	data, err := certs.MaterialData(mustIssue(t, ca, spec, now.Add(-time.Minute), time.Hour), trust)
	if err != nil {
		t.Fatal(err)
	}
	m, err := certs.ParseMaterial(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// serve accepts TLS connections with cfg on 127.0.0.1 until the test ends, completing each
// handshake; it returns the address.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Write([]byte("ok"))
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake dials addr with cfg and reads the server's greeting; it returns the server
// certificate's serial in hex.
func handshake(addr string, cfg *tls.Config) (string, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil {
		return "", fmt.Errorf("read after handshake: %w", err)
	}
	return fmt.Sprintf("%x", c.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber), nil
}

func TestHandshake(t *testing.T) {
	ca := mustCA(t, "ca", time.Now().Add(-time.Hour), 10*time.Hour)
	foreign := mustCA(t, "foreign", time.Now().Add(-time.Hour), 10*time.Hour)
	server := material(t, ca, handlerSpec, ca.Cert)
	addr := serve(t, certs.ServerConfig(certs.Fixed(server), []string{certs.APIName}))

	ok := certs.ClientConfig(certs.Fixed(material(t, ca, certs.APISpec, ca.Cert)), certs.HandlerName)
	serial, err := handshake(addr, ok)
	if err != nil {
		t.Fatalf("client of the same CA, dialling an IP: %v", err)
	}
	if want := fmt.Sprintf("%x", server.Leaf().SerialNumber); serial != want {
		t.Errorf("server serial %s, want %s", serial, want)
	}

	for name, cfg := range map[string]*tls.Config{
		"client cert from another CA": certs.ClientConfig(certs.Fixed(material(t, foreign, certs.APISpec, ca.Cert)), certs.HandlerName),
		"client name not allowed":     certs.ClientConfig(certs.Fixed(material(t, ca, certs.LeafSpec{CommonName: "intruder", Client: true}, ca.Cert)), certs.HandlerName),
		"server name not the wanted":  certs.ClientConfig(certs.Fixed(material(t, ca, certs.APISpec, ca.Cert)), "other-server"),
		"client trusting another CA":  certs.ClientConfig(certs.Fixed(material(t, ca, certs.APISpec, foreign.Cert)), certs.HandlerName),
	} {
		if _, err := handshake(addr, cfg); err == nil {
			t.Errorf("%s: handshake succeeded", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// A client that means node-a's agent accepts node-a's certificate and refuses node-b's, though
// both are valid certificates of the same CA: the error is a WrongNodeError naming both.
func TestHandlerClientConfigChecksTheNode(t *testing.T) {
	ca := mustCA(t, "ca", time.Now().Add(-time.Hour), 10*time.Hour)
	api := certs.Fixed(material(t, ca, certs.APISpec, ca.Cert))
	nodeA := serve(t, certs.ServerConfig(certs.Fixed(material(t, ca, certs.HandlerNodeSpec("node-a"), ca.Cert)), []string{certs.APIName}))
	nodeB := serve(t, certs.ServerConfig(certs.Fixed(material(t, ca, certs.HandlerNodeSpec("node-b"), ca.Cert)), []string{certs.APIName}))
	shared := serve(t, certs.ServerConfig(certs.Fixed(material(t, ca, certs.LeafSpec{CommonName: certs.HandlerName,
		DNSNames: []string{certs.HandlerName}, Server: true, Client: true}, ca.Cert)), []string{certs.APIName}))

	if _, err := handshake(nodeA, certs.HandlerClientConfig(api, "node-a")); err != nil {
		t.Fatalf("node-a's agent for node-a: %v", err)
	}
	_, err := handshake(nodeB, certs.HandlerClientConfig(api, "node-a"))
	var wrong *certs.WrongNodeError
	if !errors.As(err, &wrong) || wrong.Want != "node-a" || wrong.Got != "node-b" {
		t.Fatalf("node-b's agent for node-a: %v, want a WrongNodeError for node-b instead of node-a", err)
	}
	if msg := err.Error(); msg != "qvirt-handler certificate is for node node-b, not for node node-a" {
		t.Errorf("message %q", msg)
	}
	// The certificate all agents shared before names no node: refused too.
	if _, err := handshake(shared, certs.HandlerClientConfig(api, "node-a")); !errors.As(err, &wrong) || wrong.Got != "" {
		t.Errorf("a certificate naming no node: %v, want a WrongNodeError", err)
	} else {
		t.Logf("shared certificate: %v", err)
	}
}

func TestHandlerNodeOf(t *testing.T) {
	ca := mustCA(t, "ca", t0, time.Hour)
	two := handlerSpec
	two.URIs = append(two.URIs, certs.HandlerNodeURI("node-b"))
	for name, tc := range map[string]struct {
		spec certs.LeafSpec
		want string
	}{
		"one node":  {handlerSpec, "node-a"},
		"no node":   {certs.APISpec, ""},
		"two nodes": {two, ""},
	} {
		got, err := certs.HandlerNodeOf(mustIssue(t, ca, tc.spec, t0, time.Hour).Cert)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("%s: %q, %v; want %q", name, got, err, tc.want)
		}
	}
}
