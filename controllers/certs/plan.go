package certs

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	qcerts "github.com/qvirt/qvirt/certs"
)

// Lifetimes are the validity periods the reconciler works with; see Reconciler.
type Lifetimes struct {
	CA, Leaf, TrustDelay, Backdate time.Duration
}

// Validate checks the relations the rotation relies on: a leaf signed by the previous CA stays
// valid through the trust delay (TrustDelay at most a fifth of the shortest leaf lifetime, which
// is min(Leaf, CA/5) because leaves are cut to the CA's expiry and the CA rotates at 80%).
func (l Lifetimes) Validate() error {
	switch {
	case l.CA <= 0 || l.Leaf <= 0 || l.TrustDelay <= 0:
		return fmt.Errorf("certificate lifetimes must be positive: CA %s, leaf %s, trust delay %s", l.CA, l.Leaf, l.TrustDelay)
	case l.Backdate < 0:
		return fmt.Errorf("certificate backdate %s is negative", l.Backdate)
	case 5*l.TrustDelay > l.Leaf || 25*l.TrustDelay > l.CA:
		return fmt.Errorf("trust delay %s is too long for a leaf lifetime of %s and a CA lifetime of %s: it must be at most a fifth of the leaf's and a 25th of the CA's", l.TrustDelay, l.Leaf, l.CA)
	}
	return nil
}

// caState is the CA the leaves are checked against, after planCA.
type caState struct {
	current *qcerts.Pair
	// bundle is what every ca.crt holds: the current CA, then previous ones in their overlap.
	bundle []*x509.Certificate
	// trustedAt is when leaves may switch to the current CA: the bundle naming it has had
	// TrustDelay to reach every peer. Before that, leaves signed by a previous CA stay.
	trustedAt time.Time
	next      time.Time
}

// update is what to write to one Secret, and why.
type update struct {
	data map[string][]byte
	// reissued says the certificate and key are new; reason and problem say why.
	reissued bool
	reason   qcerts.Reason
	problem  error
	// pair is the certificate in data (nil only when planning failed).
	pair *qcerts.Pair
}

func (u *update) changed(sec *corev1.Secret) bool {
	if sec == nil {
		return true
	}
	return !maps.EqualFunc(sec.Data, u.data, bytes.Equal)
}

// planCA decides the CA Secret's data. salvage are CAs found in the leaves' bundles: when the CA
// Secret is lost, the CAs peers still trust stay in the new bundle for the overlap, so losing or
// deleting it rotates the CA without cutting anyone off.
func planCA(sec *corev1.Secret, salvage []*x509.Certificate, l Lifetimes, now time.Time) (caState, *update, error) {
	data := dataOf(sec)
	v := qcerts.CheckCA(data[qcerts.KeyCert], data[qcerts.KeyPrivate], now)
	var candidates []*x509.Certificate
	u := &update{data: maps.Clone(data), pair: v.Pair}
	if u.data == nil {
		u.data = map[string][]byte{}
	}
	if !v.Keep() {
		if v.Pair != nil {
			candidates = append(candidates, v.Pair.Cert)
		}
		ca, err := qcerts.NewCA(qcerts.CASecret, now.Add(-l.Backdate), now.Add(l.CA))
		if err != nil {
			return caState{}, nil, err
		}
		key, err := ca.KeyPEM()
		if err != nil {
			return caState{}, nil, err
		}
		u.data[qcerts.KeyCert], u.data[qcerts.KeyPrivate] = ca.CertPEM(), key
		u.reissued, u.reason, u.problem, u.pair = true, v.Reason, v.Err, ca
	}
	if old, err := qcerts.DecodeCerts(data[qcerts.KeyCA]); err == nil {
		candidates = append(candidates, old...)
	}
	candidates = append(candidates, salvage...)

	cur := u.pair
	issuedAt := caIssuedAt(cur.Cert, l)
	dropAt := issuedAt.Add(l.Leaf)
	st := caState{current: cur, bundle: []*x509.Certificate{cur.Cert}, next: qcerts.RenewAt(cur.Cert)}
	for _, c := range candidates {
		if !c.IsCA || !now.Before(dropAt) || !now.Before(c.NotAfter) || slices.ContainsFunc(st.bundle, c.Equal) {
			continue
		}
		st.bundle = append(st.bundle, c)
	}
	if len(st.bundle) > 1 {
		st.trustedAt = issuedAt.Add(l.TrustDelay)
		st.next = earliest(st.next, dropAt)
		if now.Before(st.trustedAt) {
			st.next = earliest(st.next, st.trustedAt)
		}
	}
	u.data[qcerts.KeyCA] = qcerts.EncodeCerts(st.bundle...)
	return st, u, nil
}

// caIssuedAt is when ca was made, from its certificate, erring late: NotBefore was
// now-Backdate, truncated to the second by X.509's time encoding. Erring late keeps the trust
// delay and the overlap at least as long as configured.
func caIssuedAt(ca *x509.Certificate, l Lifetimes) time.Time {
	return ca.NotBefore.Add(l.Backdate + time.Second)
}

// planLeaf decides a leaf Secret's data; next is when it must be looked at again.
func planLeaf(sec *corev1.Secret, spec qcerts.LeafSpec, ca caState, l Lifetimes, now time.Time) (*update, time.Time, error) {
	data := dataOf(sec)
	v := qcerts.CheckLeaf(data[qcerts.KeyCert], data[qcerts.KeyPrivate], spec, ca.current.Cert, now)
	u := &update{data: maps.Clone(data), pair: v.Pair}
	if u.data == nil {
		u.data = map[string][]byte{}
	}
	u.data[qcerts.KeyCA] = qcerts.EncodeCerts(ca.bundle...)
	if v.Keep() {
		return u, v.RenewAt, nil
	}
	if until, ok := keepUntilTrusted(v, ca, now); ok {
		return u, until, nil
	}
	leaf, err := ca.current.Issue(spec, now.Add(-l.Backdate), now.Add(l.Leaf))
	if err != nil {
		return nil, time.Time{}, err
	}
	key, err := leaf.KeyPEM()
	if err != nil {
		return nil, time.Time{}, err
	}
	u.data[qcerts.KeyCert], u.data[qcerts.KeyPrivate] = leaf.CertPEM(), key
	u.reissued, u.reason, u.problem, u.pair = true, v.Reason, v.Err, leaf
	return u, qcerts.RenewAt(leaf.Cert), nil
}

// keepUntilTrusted keeps, until the new CA is trusted everywhere, a leaf that is signed by a
// previous CA still in the bundle and has not expired: replacing it earlier would present a
// certificate some peers cannot verify yet.
func keepUntilTrusted(v qcerts.Verdict, ca caState, now time.Time) (time.Time, bool) {
	if v.Reason != qcerts.WrongCA {
		return time.Time{}, false
	}
	if !now.Before(ca.trustedAt) || !now.Before(v.Pair.Cert.NotAfter) {
		return time.Time{}, false
	}
	for _, prev := range ca.bundle[1:] {
		if qcerts.SignedBy(v.Pair.Cert, prev) == nil {
			return earliest(ca.trustedAt, v.Pair.Cert.NotAfter), true
		}
	}
	return time.Time{}, false
}

func dataOf(sec *corev1.Secret) map[string][]byte {
	if sec == nil {
		return nil
	}
	return sec.Data
}

// earliest is the earlier of a and b, ignoring zero times.
func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}
