package apiserver

import (
	"context"
	"crypto"
	"encoding/pem"
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	"github.com/qvirt/qvirt/certs"
)

// SecretServingCert is qvirt-api's serving certificate taken from a watched Secret (kept by
// qvirt-controller): the generic server reloads it whenever the Secret changes, as it does for
// --tls-cert-file when the file changes. Until the Secret is read, handshakes fail.
type SecretServingCert struct {
	src *certs.Source

	mu        sync.Mutex
	listeners []dynamiccertificates.Listener
}

var (
	_ dynamiccertificates.CertKeyContentProvider = (*SecretServingCert)(nil)
	_ dynamiccertificates.ControllerRunner       = (*SecretServingCert)(nil)
)

// NewSecretServingCert serves src's certificate; the caller starts src.
func NewSecretServingCert(src *certs.Source) *SecretServingCert { return &SecretServingCert{src: src} }

// Name names the Secret.
func (s *SecretServingCert) Name() string { return "secret " + s.src.String() }

// CurrentCertKeyContent is the Secret's certificate chain and key as PEM; empty before it is read.
func (s *SecretServingCert) CurrentCertKeyContent() ([]byte, []byte) {
	m, err := s.src.Current()
	if err != nil {
		return nil, nil
	}
	signer, ok := m.Certificate.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil
	}
	key, err := certs.EncodeKey(signer)
	if err != nil {
		return nil, nil
	}
	var chain []byte
	for _, der := range m.Certificate.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	return chain, key
}

// AddListener registers l, told whenever the Secret's certificate changes.
func (s *SecretServingCert) AddListener(l dynamiccertificates.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, l)
}

// RunOnce tells the listeners once, so a certificate read before serving starts is used.
func (s *SecretServingCert) RunOnce(context.Context) error {
	s.notify()
	return nil
}

// Run tells the listeners of every change until ctx ends.
func (s *SecretServingCert) Run(ctx context.Context, _ int) {
	for {
		changed := s.src.Changed()
		s.notify()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

func (s *SecretServingCert) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range s.listeners {
		l.Enqueue()
	}
}
