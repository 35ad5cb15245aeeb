package certs

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	mathrand "math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/internal/ctxsleep"
	certificatesv1 "k8s.io/api/certificates/v1"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/klog/v2"
)

// DefaultNodeCertValidity is the lifetime a node agent asks for. Short, since nothing revokes a
// certificate: a node taken out of the cluster (or whose agent was compromised and rebuilt) is
// trusted at most this long after. Renewals are cheap: one CertificateSigningRequest.
const DefaultNodeCertValidity = 24 * time.Hour

// csrWaitTimeout bounds the wait for one request to be signed before a new one is made (as the
// kubelet does): the signer may hold a request through a CA rotation's trust delay.
const csrWaitTimeout = 15 * time.Minute

// retryMin and retryMax bound the pause between failed attempts.
const (
	retryMin = 2 * time.Second
	retryMax = 5 * time.Minute
)

// HandlerUsages are the key usages a node agent's request asks for: serving (streams, migration
// endpoint) and client (of the other node agents' migration endpoints).
var HandlerUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}

// NodeCertificate is a node agent's own certificate, a Provider: a key made in memory at start
// (and at every renewal), never written anywhere, certified by qvirt-controller through a
// CertificateSigningRequest of signer HandlerSignerName for this node (HandlerCSRTemplate), and
// the trust bundle from a BundleSource. The signer grants it only to the qvirt-handler service
// account whose token is bound to this node.
//
// Start obtains the first certificate, then renews it at a random point between 70% and 90% of
// its lifetime (so the nodes of a cluster do not all ask at once), and as soon as the bundle
// names a newer CA than the one that signed it (a CA rotation; the signer answers once that CA
// is trusted everywhere). The previous certificate serves until its replacement arrives. Safe for
// concurrent use; a manager.Runnable.
type NodeCertificate struct {
	client   kubernetes.Interface
	node     string
	bundle   *BundleSource
	lifetime time.Duration
	now      func() time.Time

	ready     chan struct{}
	readyOnce sync.Once

	mu      sync.RWMutex
	cert    *tls.Certificate // Leaf set
	renewAt time.Time
	err     error
	renewed chan struct{} // closed and replaced on every new certificate
}

// NewNodeCertificate requests node's certificate through c, with the trust bundle of bundle
// (start it too), asking for lifetime (DefaultNodeCertValidity when zero; the signer may cut it).
func NewNodeCertificate(c kubernetes.Interface, node string, bundle *BundleSource, lifetime time.Duration) *NodeCertificate {
	if lifetime == 0 {
		lifetime = DefaultNodeCertValidity
	}
	return &NodeCertificate{client: c, node: node, bundle: bundle, lifetime: lifetime, now: time.Now,
		ready: make(chan struct{}), renewed: make(chan struct{}),
		err: fmt.Errorf("the certificate of node %s is not issued yet", node)}
}

// NeedLeaderElection is false: every node agent needs its own certificate.
func (n *NodeCertificate) NeedLeaderElection() bool { return false }

// Current is the certificate with the current trust bundle.
func (n *NodeCertificate) Current() (*Material, error) {
	n.mu.RLock()
	cert, err := n.cert, n.err
	n.mu.RUnlock()
	if cert == nil {
		return nil, err
	}
	b, err := n.bundle.Current()
	if err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	return &Material{Certificate: *cert, CAs: b.CAs, Pool: b.Pool}, nil
}

// Err is why the last attempt to get a certificate failed (a denial names the signer's reason),
// nil after a success.
func (n *NodeCertificate) Err() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.err
}

// Ready is nil once a certificate is held (a health check: the agent serves nothing before).
func (n *NodeCertificate) Ready() error {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.cert == nil {
		return n.err
	}
	return nil
}

// Renewed is closed when a new certificate is held after the call.
func (n *NodeCertificate) Renewed() <-chan struct{} {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.renewed
}

// WaitReady blocks until the first certificate is held or ctx ends.
func (n *NodeCertificate) WaitReady(ctx context.Context) error {
	select {
	case <-n.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the certificate of node %s: %w (last problem: %v)", n.node, ctx.Err(), n.Err())
	}
}

// Start obtains and renews the certificate until ctx ends. It logs through the context's logr
// logger; failures are retried with a growing pause (2 s to 5 min).
func (n *NodeCertificate) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("node", n.node, "signer", HandlerSignerName)
	pause := retryMin
	var obtained time.Time
	for {
		// A certificate due as soon as it came (a signer cutting lifetimes to almost nothing)
		// is asked for again after a pause, not in a loop.
		if wait := time.Until(obtained.Add(retryMin)); wait > 0 && !ctxsleep.Sleep(ctx, wait) {
			return nil
		}
		// Taken before due() looks at the bundle, so that a change after that wakes the wait.
		changed := n.bundle.Changed()
		if why := n.due(); why != "" {
			log.Info("requesting a certificate", "why", why)
			if err := n.obtain(ctx, log); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				n.mu.Lock()
				n.err = err
				n.mu.Unlock()
				log.Error(err, "no certificate for this node; retrying", "in", pause)
				if !ctxsleep.Sleep(ctx, pause) {
					return nil
				}
				pause = min(2*pause, retryMax)
				continue
			}
			pause, obtained = retryMin, time.Now()
		}
		n.mu.RLock()
		wait := n.renewAt.Sub(n.now())
		n.mu.RUnlock()
		timer := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		case <-changed:
			timer.Stop()
		}
	}
}

// due says why a certificate must be requested now, "" when the one held may stay.
func (n *NodeCertificate) due() string {
	n.mu.RLock()
	cert, renewAt := n.cert, n.renewAt
	n.mu.RUnlock()
	switch {
	case cert == nil:
		return "none held"
	case !n.now().Before(renewAt):
		return fmt.Sprintf("renewal time %s reached (expires %s)", renewAt.UTC().Format(time.RFC3339), cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if b, err := n.bundle.Current(); err == nil && supersededCA(cert.Leaf, b.CAs) {
		return fmt.Sprintf("the trust bundle names a newer CA (%s) than the one that signed the certificate", describe(b.CAs[0]))
	}
	return ""
}

// supersededCA reports whether leaf is signed by a CA of bundle other than its first (current)
// one. A leaf signed by none of them says only that the bundle has not caught up yet.
func supersededCA(leaf *x509.Certificate, bundle []*x509.Certificate) bool {
	if len(bundle) == 0 || SignedBy(leaf, bundle[0]) == nil {
		return false
	}
	return slices.ContainsFunc(bundle[1:], func(ca *x509.Certificate) bool { return SignedBy(leaf, ca) == nil })
}

// obtain makes a key, requests a certificate for it and waits until it is signed or refused.
func (n *NodeCertificate) obtain(ctx context.Context, log logr.Logger) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate a key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, HandlerCSRTemplate(n.node), key)
	if err != nil {
		return fmt.Errorf("make the certificate request: %w", err)
	}
	req := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	// client-go's helpers log through klog's context logger, which is logr's.
	ctx = klog.NewContext(ctx, log)
	name, uid, err := csr.RequestCertificateWithContext(ctx, n.client, req, csrName(n.node), HandlerSignerName, &n.lifetime, HandlerUsages, key)
	if err != nil {
		return fmt.Errorf("create a CertificateSigningRequest: %w", err)
	}
	log.Info("waiting for qvirt-controller to sign", "csr", name)
	wctx, cancel := context.WithTimeout(ctx, csrWaitTimeout)
	defer cancel()
	certPEM, err := csr.WaitForCertificate(wctx, n.client, name, uid)
	if err != nil {
		if wctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("CertificateSigningRequest %s not signed within %s (is qvirt-controller running?)", name, csrWaitTimeout)
		}
		return fmt.Errorf("CertificateSigningRequest %s: %w", name, err)
	}
	cert, err := n.accept(certPEM, key)
	if err != nil {
		return fmt.Errorf("CertificateSigningRequest %s: %w", name, err)
	}
	renewAt := jitteredRenewal(cert.Leaf)
	n.mu.Lock()
	n.cert, n.renewAt, n.err = cert, renewAt, nil
	close(n.renewed)
	n.renewed = make(chan struct{})
	n.mu.Unlock()
	n.readyOnce.Do(func() { close(n.ready) })
	log.Info("certificate issued", "csr", name, "serial", fmt.Sprintf("%x", cert.Leaf.SerialNumber),
		"issuer", cert.Leaf.Issuer.CommonName, "notAfter", cert.Leaf.NotAfter, "renewAt", renewAt)
	return nil
}

// accept checks what the signer returned: a certificate for key, naming this node, usable for
// both ends of a connection, valid now.
func (n *NodeCertificate) accept(certPEM []byte, key *ecdsa.PrivateKey) (*tls.Certificate, error) {
	chain, err := DecodeCerts(certPEM)
	if err != nil {
		return nil, fmt.Errorf("issued certificate: %w", err)
	}
	leaf := chain[0]
	if !publicKeyEqual(leaf.PublicKey, key.Public()) {
		return nil, fmt.Errorf("issued certificate %s is not for the key requested", describe(leaf))
	}
	if err := CheckHandlerNode(leaf, n.node); err != nil {
		return nil, err
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if !slices.Contains(leaf.ExtKeyUsage, u) {
			return nil, fmt.Errorf("issued certificate %s lacks extended key usage %v", describe(leaf), u)
		}
	}
	if now := n.now(); now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("issued certificate %s expired at %s", describe(leaf), leaf.NotAfter)
	}
	raw := make([][]byte, len(chain))
	for i, c := range chain {
		raw[i] = c.Raw
	}
	return &tls.Certificate{Certificate: raw, PrivateKey: key, Leaf: leaf}, nil
}

// jitteredRenewal is a random point between 70% and 90% of c's lifetime: RenewAt's 80%, spread.
func jitteredRenewal(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	frac := RenewFraction - 0.1 + 0.2*mathrand.Float64()
	return c.NotBefore.Add(time.Duration(float64(life) * frac))
}

// csrName names a request after its node, for `kubectl get csr`, with a random suffix (a name
// is used once); a node name too long for that gets a generated name.
func csrName(node string) string {
	name := "qvirt-handler-" + node + "-" + utilrand.String(5)
	if len(name) > 253 {
		return ""
	}
	return name
}

var _ Provider = (*NodeCertificate)(nil)
