package certs

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"
)

// Reason says why a certificate must be replaced.
type Reason string

const (
	// Missing: the Secret or one of its keys is absent.
	Missing Reason = "Missing"
	// Corrupt: a key does not parse, or the private key does not match the certificate.
	Corrupt Reason = "Corrupt"
	// Due: the certificate is past 80% of its lifetime (or expired).
	Due Reason = "Due"
	// WrongCA: the leaf is not signed by the CA that should sign it.
	WrongCA Reason = "WrongCA"
	// WrongNames: the leaf's CN, O, DNS or IP SANs or key usages are not the wanted ones.
	WrongNames Reason = "WrongNames"
)

// RenewFraction is the share of a certificate's lifetime after which it is replaced.
const RenewFraction = 0.8

// RenewAt is when c falls due: NotBefore plus 80% of its lifetime.
func RenewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(time.Duration(float64(life) * RenewFraction))
}

// Verdict is the outcome of checking a certificate held in a Secret.
type Verdict struct {
	// Pair is the parsed certificate and key; nil when Reason is Missing or Corrupt.
	Pair *Pair
	// Reason is why the certificate must be replaced now; empty when it may stay.
	Reason Reason
	// Err says what is wrong, naming the Secret key (a *KeyError) where one is at fault.
	Err error
	// RenewAt is when the certificate falls due (set whenever Pair is).
	RenewAt time.Time
}

// Keep reports whether the certificate may stay.
func (v Verdict) Keep() bool { return v.Reason == "" }

// CheckCA checks a CA's certificate and key (tls.crt and tls.key of its Secret) at now.
func CheckCA(certPEM, keyPEM []byte, now time.Time) Verdict {
	p, v := parseForCheck(certPEM, keyPEM)
	if p == nil {
		return v
	}
	if !p.Cert.IsCA || p.Cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return Verdict{Pair: p, Reason: Corrupt, Err: &KeyError{Key: KeyCert, Err: fmt.Errorf("%s is not a CA certificate", describe(p.Cert))}, RenewAt: RenewAt(p.Cert)}
	}
	return due(p, now)
}

// CheckLeaf checks a leaf's certificate and key against what spec wants and the CA that should
// have signed it, at now.
func CheckLeaf(certPEM, keyPEM []byte, spec LeafSpec, ca *x509.Certificate, now time.Time) Verdict {
	p, v := parseForCheck(certPEM, keyPEM)
	if p == nil {
		return v
	}
	if err := matchSpec(p.Cert, spec); err != nil {
		return Verdict{Pair: p, Reason: WrongNames, Err: &KeyError{Key: KeyCert, Err: err}, RenewAt: RenewAt(p.Cert)}
	}
	if err := SignedBy(p.Cert, ca); err != nil {
		return Verdict{Pair: p, Reason: WrongCA, Err: &KeyError{Key: KeyCert, Err: err}, RenewAt: RenewAt(p.Cert)}
	}
	return due(p, now)
}

// SignedBy reports (as nil) whether ca signed c.
func SignedBy(c, ca *x509.Certificate) error {
	if err := c.CheckSignatureFrom(ca); err != nil {
		return fmt.Errorf("%s is not signed by CA %s: %w", describe(c), describe(ca), err)
	}
	return nil
}

func parseForCheck(certPEM, keyPEM []byte) (*Pair, Verdict) {
	switch {
	case len(certPEM) == 0:
		return nil, Verdict{Reason: Missing, Err: &KeyError{Key: KeyCert, Err: errors.New("missing or empty")}}
	case len(keyPEM) == 0:
		return nil, Verdict{Reason: Missing, Err: &KeyError{Key: KeyPrivate, Err: errors.New("missing or empty")}}
	}
	p, err := ParsePair(certPEM, keyPEM)
	if err != nil {
		return nil, Verdict{Reason: Corrupt, Err: err}
	}
	return p, Verdict{}
}

func due(p *Pair, now time.Time) Verdict {
	at := RenewAt(p.Cert)
	if !now.Before(at) {
		return Verdict{Pair: p, Reason: Due, Err: &KeyError{Key: KeyCert, Err: fmt.Errorf("%s is past %d%% of its lifetime (renew at %s, expires %s)",
			describe(p.Cert), int(RenewFraction*100), at.UTC().Format(time.RFC3339), p.Cert.NotAfter.UTC().Format(time.RFC3339))}, RenewAt: at}
	}
	return Verdict{Pair: p, RenewAt: at}
}

func matchSpec(c *x509.Certificate, spec LeafSpec) error {
	if c.Subject.CommonName != spec.CommonName {
		return fmt.Errorf("%s: common name is not %q", describe(c), spec.CommonName)
	}
	if !slices.Equal(sortedCopy(c.DNSNames), sortedCopy(spec.DNSNames)) {
		return fmt.Errorf("%s: DNS names %v, want %v", describe(c), c.DNSNames, spec.DNSNames)
	}
	if !slices.Equal(sortedCopy(c.Subject.Organization), sortedCopy(spec.Organizations)) {
		return fmt.Errorf("%s: organizations %v, want %v", describe(c), c.Subject.Organization, spec.Organizations)
	}
	if !slices.Equal(ipStrings(c.IPAddresses), ipStrings(spec.IPs)) {
		return fmt.Errorf("%s: IP addresses %v, want %v", describe(c), c.IPAddresses, spec.IPs)
	}
	if !slices.Equal(uriStrings(c.URIs), uriStrings(spec.URIs)) {
		return fmt.Errorf("%s: URIs %v, want %v", describe(c), uriStrings(c.URIs), uriStrings(spec.URIs))
	}
	if !slices.Equal(c.ExtKeyUsage, extKeyUsages(spec)) {
		return fmt.Errorf("%s: extended key usages %v, want server=%t client=%t", describe(c), c.ExtKeyUsage, spec.Server, spec.Client)
	}
	return nil
}

// ipStrings is ips in their text form, sorted: a parsed certificate holds an IPv4 address in 4
// bytes where net.IPv4 makes 16, so the bytes cannot be compared directly.
func ipStrings(ips []net.IP) []string {
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	slices.Sort(out)
	return out
}

// uriStrings is uris in their text form, sorted.
func uriStrings(uris []*url.URL) []string {
	out := make([]string, 0, len(uris))
	for _, u := range uris {
		out = append(out, u.String())
	}
	slices.Sort(out)
	return out
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
