package apiserver

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/qvirt/qvirt/certs"
)

// HandlerServerName is the name a qvirt-handler's serving certificate must carry, as subject CN
// or DNS SAN. Handler certificates are not issued for node addresses, so qvirt-api checks this
// name instead of the dialled host, and then that the certificate names the VMI's node (forNode).
const HandlerServerName = certs.HandlerName

// TLSConfigSource gives the TLS client configuration for one dial to a handler: qvirt-api's
// client certificate and the verification of the handler's. It is called for every dial, so a
// source backed by a Secret or by files can rotate certificates without a restart.
type TLSConfigSource func() (*tls.Config, error)

// FileTLSConfig reads the client certificate, its key and the CA bundle that signs handler
// certificates from PEM files, on every call (they are small, and a rotated file takes effect on
// the next dial).
func FileTLSConfig(certFile, keyFile, caFile string) TLSConfigSource {
	return func() (*tls.Config, error) {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("handler client certificate (--handler-client-cert-file %s, --handler-client-key-file %s): %w", certFile, keyFile, err)
		}
		caPEM, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("handler CA (--handler-ca-file): %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(caPEM) {
			return nil, fmt.Errorf("handler CA (--handler-ca-file %s): no PEM certificate in it", caFile)
		}
		return HandlerTLSConfig(cert, roots), nil
	}
}

// HandlerTLSConfig is the client configuration for a handler: cert is presented, and the handler's
// chain must verify against roots with a leaf named HandlerServerName. Hostname verification is
// replaced (handlers are dialled by IP address, their certificates do not name it), not dropped.
func HandlerTLSConfig(cert tls.Certificate, roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// The standard verification checks the dialled host name; VerifyConnection below does
		// the chain check and the name check against HandlerServerName instead.
		InsecureSkipVerify: true, //nolint:gosec // replaced by VerifyConnection
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyHandler(cs.PeerCertificates, roots)
		},
	}
}

// forNode is cfg (whose VerifyConnection checks the handler's chain and name) that also
// requires the handler's certificate to name node, the VMI's: a handler of another node, even
// with a valid certificate of ours, is refused with a *certs.WrongNodeError.
func forNode(cfg *tls.Config, node string) *tls.Config {
	cfg = cfg.Clone()
	verify := cfg.VerifyConnection
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if verify != nil {
			if err := verify(cs); err != nil {
				return err
			}
		}
		if len(cs.PeerCertificates) == 0 {
			return errors.New("qvirt-handler presented no certificate")
		}
		return certs.CheckHandlerNode(cs.PeerCertificates[0], node)
	}
	return cfg
}

// verifyHandler checks the handler's chain against roots and its leaf's name.
func verifyHandler(chain []*x509.Certificate, roots *x509.CertPool) error {
	if len(chain) == 0 {
		return errors.New("qvirt-handler presented no certificate")
	}
	leaf := chain[0]
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("qvirt-handler certificate %q: %w", leaf.Subject.CommonName, err)
	}
	if leaf.Subject.CommonName != HandlerServerName && !slices.Contains(leaf.DNSNames, HandlerServerName) {
		return fmt.Errorf("qvirt-handler certificate names CN %q, DNS %v: want %q", leaf.Subject.CommonName, leaf.DNSNames, HandlerServerName)
	}
	return nil
}
