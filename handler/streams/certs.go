package streams

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/certs"
)

// newTLSStore is the certificate store Options ask for: files, or a certs.Provider (a Secret).
func newTLSStore(opts Options) (*certStore, error) {
	files := []struct{ name, v string }{{"CertFile", opts.CertFile}, {"KeyFile", opts.KeyFile}, {"ClientCAFile", opts.ClientCAFile}}
	if opts.Certs != nil {
		for _, f := range files {
			if f.v != "" {
				return nil, fmt.Errorf("options %s and Certs are exclusive", f.name)
			}
		}
		return &certStore{provider: opts.Certs, allowed: opts.AllowedClientNames, log: opts.Log}, nil
	}
	for _, f := range files {
		if f.v == "" {
			return nil, fmt.Errorf("options: %s is required (or Certs)", f.name)
		}
	}
	return newCertStore(opts.CertFile, opts.KeyFile, opts.ClientCAFile, opts.AllowedClientNames, opts.Log)
}

// certStore holds the serving certificate and the client CA, read from files. Every handshake
// checks the files' size and modification time (a stat each, cheap next to a handshake) and reloads
// them when one changed, so a rotated Secret needs no restart. A reload that fails keeps the last
// good configuration and is logged. Safe for concurrent use.
type certStore struct {
	certFile, keyFile, caFile string
	allowed                   []string
	log                       logr.Logger
	// provider, when set, replaces the files: certs.ServerConfig reads it at every handshake.
	provider certs.Provider

	mu    sync.Mutex
	stamp [3]fileStamp
	cfg   *tls.Config
}

type fileStamp struct {
	size int64
	mod  time.Time
}

func newCertStore(certFile, keyFile, caFile string, allowed []string, log logr.Logger) (*certStore, error) {
	s := &certStore{certFile: certFile, keyFile: keyFile, caFile: caFile, allowed: allowed, log: log}
	stamp, err := s.stamps()
	if err != nil {
		return nil, err
	}
	cfg, err := s.load()
	if err != nil {
		return nil, err
	}
	s.stamp, s.cfg = stamp, cfg
	return s, nil
}

// baseConfig is the listener's configuration; every handshake gets the current one from the store.
func (s *certStore) baseConfig() *tls.Config {
	if s.provider != nil {
		cfg := certs.ServerConfig(s.provider, s.allowed)
		// Websockets need HTTP/1.1's Upgrade; the server never offers h2.
		cfg.NextProtos = []string{"http/1.1"}
		return cfg
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.current(), nil
		},
	}
}

func (s *certStore) current() *tls.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	stamp, err := s.stamps()
	if err != nil || stamp == s.stamp {
		// A file briefly missing during a Secret update keeps the old configuration.
		return s.cfg
	}
	cfg, err := s.load()
	if err != nil {
		s.log.Error(err, "reload TLS files; keeping the previous certificates")
		s.stamp = stamp // do not retry on every handshake until the files change again
		return s.cfg
	}
	s.log.Info("reloaded TLS certificate and client CA", "cert", s.certFile, "clientCA", s.caFile)
	s.stamp, s.cfg = stamp, cfg
	return cfg
}

func (s *certStore) stamps() ([3]fileStamp, error) {
	var out [3]fileStamp
	for i, f := range []string{s.certFile, s.keyFile, s.caFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return out, fmt.Errorf("stat %s: %w", f, err)
		}
		out[i] = fileStamp{size: fi.Size(), mod: fi.ModTime()}
	}
	return out, nil
}

func (s *certStore) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("load serving certificate %s and key %s: %w", s.certFile, s.keyFile, err)
	}
	pem, err := os.ReadFile(s.caFile)
	if err != nil {
		return nil, fmt.Errorf("read client CA %s: %w", s.caFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("client CA %s: no PEM certificate in it", s.caFile)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		// Websockets need HTTP/1.1's Upgrade; the server never offers h2.
		NextProtos: []string{"http/1.1"},
	}
	if len(s.allowed) > 0 {
		cfg.VerifyConnection = s.verifyName
	}
	return cfg, nil
}

// verifyName refuses, at the TLS layer, a client certificate (already verified against the CA)
// whose subject CN and DNS SANs are all outside the allowed names.
func (s *certStore) verifyName(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	if slices.Contains(s.allowed, leaf.Subject.CommonName) {
		return nil
	}
	for _, n := range leaf.DNSNames {
		if slices.Contains(s.allowed, n) {
			return nil
		}
	}
	return fmt.Errorf("client certificate CN=%q SANs=%v is not one of the allowed clients %v", leaf.Subject.CommonName, leaf.DNSNames, s.allowed)
}
