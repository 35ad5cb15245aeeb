package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
)

// Provider yields the current TLS material. Implementations are safe for concurrent use and
// cheap to call: the configurations below call it on every handshake.
type Provider interface {
	Current() (*Material, error)
}

// ProviderFunc adapts a function to Provider.
type ProviderFunc func() (*Material, error)

// Current calls f.
func (f ProviderFunc) Current() (*Material, error) { return f() }

// Fixed is a Provider that always yields m (tests, or material read once from files).
func Fixed(m *Material) Provider {
	return ProviderFunc(func() (*Material, error) { return m, nil })
}

// GetCertificate is a tls.Config GetCertificate serving p's current certificate (a server
// whose clients verify it against a caBundle of their own, such as kube-apiserver calling a
// webhook). The handshake fails while p has none.
func GetCertificate(p Provider) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		m, err := p.Current()
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		return &m.Certificate, nil
	}
}

// ServerConfig is a server configuration that takes, on every handshake, the serving
// certificate and the trust bundle from p, and requires a client certificate that chains to the
// bundle; when allowedClients is not empty, the client certificate's CN or one of its DNS SANs
// must be listed. Session tickets are off, so every connection is checked against the current
// bundle. MinVersion and NextProtos set on the returned config after this call are honoured.
func ServerConfig(p Provider, allowedClients []string) *tls.Config {
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	allowed := slices.Clone(allowedClients)
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		m, err := p.Current()
		if err != nil {
			return nil, fmt.Errorf("serving certificate: %w", err)
		}
		cfg := &tls.Config{
			MinVersion:             base.MinVersion,
			NextProtos:             base.NextProtos,
			Certificates:           []tls.Certificate{m.Certificate},
			ClientCAs:              m.Pool,
			ClientAuth:             tls.RequireAndVerifyClientCert,
			SessionTicketsDisabled: true,
		}
		if len(allowed) > 0 {
			cfg.VerifyConnection = func(cs tls.ConnectionState) error { return peerNamed(cs, allowed, "client") }
		}
		return cfg, nil
	}
	return base
}

// ClientConfig is a client configuration that presents p's current certificate and accepts
// only a server whose chain verifies against p's current trust bundle and whose certificate has
// serverName as its CN or one of its DNS SANs. The address dialled (a node IP, which no
// certificate names) plays no part. The same config serves any number of dials: material is
// read at each handshake, so rotations need no new config.
func ClientConfig(p Provider, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			m, err := p.Current()
			if err != nil {
				return nil, fmt.Errorf("client certificate: %w", err)
			}
			return &m.Certificate, nil
		},
		// The chain and name are checked by VerifyConnection against the bundle current at the
		// handshake; crypto/tls's own check would need a fixed RootCAs and match the SAN only.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			m, err := p.Current()
			if err != nil {
				return fmt.Errorf("trust bundle: %w", err)
			}
			if err := verifyChain(cs.PeerCertificates, m.Pool, x509.ExtKeyUsageServerAuth); err != nil {
				return err
			}
			return peerNamed(cs, []string{serverName}, "server")
		},
	}
}

func verifyChain(peer []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage) error {
	if len(peer) == 0 {
		return errors.New("the peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range peer[1:] {
		inter.AddCert(c)
	}
	_, err := peer[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return fmt.Errorf("peer certificate %s: %w", describe(peer[0]), err)
	}
	return nil
}

// peerNamed checks that the (already verified) peer certificate's CN or one of its DNS SANs is
// in names.
func peerNamed(cs tls.ConnectionState, names []string, role string) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("no %s certificate", role)
	}
	leaf := cs.PeerCertificates[0]
	if slices.Contains(names, leaf.Subject.CommonName) || slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return slices.Contains(names, n) }) {
		return nil
	}
	return fmt.Errorf("%s certificate CN=%q DNS names %v is none of %v", role, leaf.Subject.CommonName, leaf.DNSNames, names)
}
