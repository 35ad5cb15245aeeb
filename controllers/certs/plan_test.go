package certs

import (
	"crypto/x509"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	qcerts "github.com/qvirt/qvirt/certs"
)

// world is the three Secrets' data, as the reconciler would leave them.
type world struct {
	ca, handler, api *corev1.Secret
}

// step runs one reconcile pass at now on w's Secrets (the Reconcile logic without the API).
func (w *world) step(t *testing.T, l Lifetimes, now time.Time) (caState, time.Time) {
	t.Helper()
	var salvage []*x509.Certificate
	for _, s := range []*corev1.Secret{w.handler, w.api} {
		if b, err := qcerts.DecodeCerts(dataOf(s)[qcerts.KeyCA]); err == nil {
			salvage = append(salvage, b...)
		}
	}
	ca, u, err := planCA(w.ca, salvage, l, now)
	if err != nil {
		t.Fatal(err)
	}
	w.ca = &corev1.Secret{Data: u.data}
	next := ca.next
	for _, p := range []struct {
		sec  **corev1.Secret
		spec qcerts.LeafSpec
	}{{&w.handler, qcerts.HandlerNodeSpec("node-a")}, {&w.api, qcerts.APISpec}} {
		u, at, err := planLeaf(*p.sec, p.spec, ca, l, now)
		if err != nil {
			t.Fatal(err)
		}
		*p.sec = &corev1.Secret{Data: u.data}
		next = earliest(next, at)
	}
	if !next.After(now) {
		t.Fatalf("at %s the next deadline %s is not in the future", now, next)
	}
	return ca, next
}

func certOf(t *testing.T, s *corev1.Secret) *x509.Certificate {
	t.Helper()
	c, err := qcerts.DecodeCerts(s.Data[qcerts.KeyCert])
	if err != nil {
		t.Fatal(err)
	}
	return c[0]
}

// TestCATimeline follows the reconciler from deadline to deadline through two CA lifetimes and
// checks the rotation rules at every step: leaves always valid and signed by a CA in every
// bundle; the CA replaced at 80% of its lifetime; leaves moved to a new CA only after the trust
// delay; the old CA dropped one leaf lifetime after the rotation.
func TestCATimeline(t *testing.T) {
	l := Lifetimes{CA: 100 * time.Hour, Leaf: 10 * time.Hour, TrustDelay: time.Hour, Backdate: time.Minute}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	w := &world{}
	now := start
	var rotations int
	var lastCA *x509.Certificate
	var rotatedAt time.Time
	for steps := 0; now.Before(start.Add(2*l.CA + 10*time.Hour)); steps++ {
		if steps > 1000 {
			t.Fatal("more than 1000 reconciles: the deadlines do not advance")
		}
		ca, next := w.step(t, l, now)
		cur := ca.current.Cert
		if lastCA != nil && !cur.Equal(lastCA) {
			rotations++
			rotatedAt = now
			if due := qcerts.RenewAt(lastCA); now.Before(due) || now.After(due.Add(time.Second)) {
				t.Errorf("CA replaced at %s, want at its 80%% mark %s", now, due)
			}
			if len(ca.bundle) != 2 || !ca.bundle[1].Equal(lastCA) {
				t.Errorf("at the rotation the bundle holds %d CAs, want the new and the old", len(ca.bundle))
			}
		}
		lastCA = cur
		for _, s := range []*corev1.Secret{w.handler, w.api} {
			leaf := certOf(t, s)
			if now.Before(leaf.NotBefore) || !now.Before(leaf.NotAfter) {
				t.Fatalf("at %s a leaf is not valid (%s..%s)", now, leaf.NotBefore, leaf.NotAfter)
			}
			bundle, _ := qcerts.DecodeCerts(s.Data[qcerts.KeyCA])
			signer := -1
			for i, c := range bundle {
				if qcerts.SignedBy(leaf, c) == nil {
					signer = i
				}
			}
			switch {
			case signer < 0:
				t.Fatalf("at %s a leaf is signed by no CA of its bundle", now)
			case signer == 0 && !rotatedAt.IsZero() && len(bundle) > 1 && now.Sub(rotatedAt) < l.TrustDelay:
				t.Errorf("at %s, %s after the rotation, a leaf is already signed by the new CA", now, now.Sub(rotatedAt))
			case signer > 0 && now.Sub(rotatedAt) > l.TrustDelay+2*time.Second:
				t.Errorf("at %s, %s after the rotation, a leaf is still signed by the old CA", now, now.Sub(rotatedAt))
			}
			if len(bundle) > 1 && now.Sub(rotatedAt) >= l.Leaf+2*time.Second {
				t.Errorf("at %s the old CA is still trusted, %s after the rotation", now, now.Sub(rotatedAt))
			}
		}
		if len(ca.bundle) == 1 && !rotatedAt.IsZero() && now.Sub(rotatedAt) < l.Leaf {
			t.Errorf("the old CA was dropped %s after the rotation, before one leaf lifetime", now.Sub(rotatedAt))
		}
		now = next
	}
	if rotations != 2 {
		t.Errorf("%d CA rotations in two CA lifetimes, want 2", rotations)
	}
}

func TestLifetimesValidate(t *testing.T) {
	good := Lifetimes{CA: 100 * time.Hour, Leaf: 10 * time.Hour, TrustDelay: time.Hour}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]Lifetimes{
		"zero leaf":                {CA: time.Hour, TrustDelay: time.Second},
		"trust delay > leaf/5":     {CA: 100 * time.Hour, Leaf: 10 * time.Hour, TrustDelay: 3 * time.Hour},
		"trust delay > CA/25":      {CA: 20 * time.Hour, Leaf: 10 * time.Hour, TrustDelay: time.Hour},
		"negative backdate":        {CA: 100 * time.Hour, Leaf: 10 * time.Hour, TrustDelay: time.Hour, Backdate: -1},
		"zero trust delay (unset)": {CA: 100 * time.Hour, Leaf: 10 * time.Hour},
	} {
		if err := l.Validate(); err == nil {
			t.Errorf("%s: valid", name)
		}
	}
}
