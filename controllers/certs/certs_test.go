package certs_test

import (
	"context"
	"crypto/x509"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/controllers/certs"
)

func TestCreatesSecretsAndMutualTLSWorks(t *testing.T) {
	ns := namespace(t)
	startReconciler(t, ns, &certs.Reconciler{})
	secs := waitSecrets(t, ns)

	ca := secs[qcerts.CASecret]
	caCert := leafOf(t, ca)
	if !caCert.IsCA || caCert.Subject.CommonName != qcerts.CASecret {
		t.Errorf("qvirt-ca tls.crt: IsCA %t CN %s", caCert.IsCA, caCert.Subject.CommonName)
	}
	if life := caCert.NotAfter.Sub(caCert.NotBefore); life < 365*24*time.Hour {
		t.Errorf("CA lifetime %s, want a year", life)
	}
	for _, sec := range secs {
		if sec.Type != corev1.SecretTypeTLS || sec.Labels[certs.ManagedLabel] == "" {
			t.Errorf("Secret %s: type %s labels %v", sec.Name, sec.Type, sec.Labels)
		}
		if b := bundleOf(t, sec); len(b) != 1 || !b[0].Equal(caCert) {
			t.Errorf("Secret %s ca.crt is not the CA", sec.Name)
		}
		waitEvent(t, ns, sec.Name, certs.ReasonCreated, sec.Name)
	}
	handler, api := leafOf(t, secs[qcerts.HandlerSecret]), leafOf(t, secs[qcerts.APISecret])
	if handler.Subject.CommonName != qcerts.HandlerName || !slices.Equal(handler.DNSNames, []string{qcerts.HandlerName}) || len(handler.IPAddresses) != 0 {
		t.Errorf("handler certificate CN=%s DNS=%v IPs=%v", handler.Subject.CommonName, handler.DNSNames, handler.IPAddresses)
	}
	if api.Subject.CommonName != qcerts.APIName || !slices.Equal(api.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("api certificate CN=%s usages %v", api.Subject.CommonName, api.ExtKeyUsage)
	}
	for _, leaf := range []*x509.Certificate{handler, api} {
		if err := qcerts.SignedBy(leaf, caCert); err != nil {
			t.Error(err)
		}
	}

	// The handler's Source runs as a user that may read only its Secret, by name.
	handlerSrc := source(t, restrictedUser(t, ns, qcerts.HandlerSecret), ns, qcerts.HandlerSecret)
	apiSrc := source(t, cp.Config, ns, qcerts.APISecret)
	addr := serve(t, handlerSrc)
	seen, err := handshake(addr, qcerts.ClientConfig(apiSrc, qcerts.HandlerName))
	if err != nil {
		t.Fatalf("qvirt-api → qvirt-handler handshake: %v", err)
	}
	if !seen.Equal(handler) {
		t.Errorf("the server presented %s, not the handler Secret's certificate", seen.Subject.CommonName)
	}

	// A client certificate of another CA is refused, even when the client trusts our CA.
	intruder := qcerts.Fixed(foreignMaterial(t, bundleOf(t, secs[qcerts.APISecret])))
	if _, err := handshake(addr, qcerts.ClientConfig(intruder, qcerts.HandlerName)); err == nil {
		t.Error("a client certificate from another CA was accepted")
	} else {
		t.Logf("foreign client refused: %v", err)
	}
	// The client refuses a server whose certificate does not name the wanted server.
	if _, err := handshake(addr, qcerts.ClientConfig(apiSrc, "someone-else")); err == nil {
		t.Error("the client accepted a server certificate not naming the wanted server")
	}
}

func TestLeavesRotateAndServerPicksThemUp(t *testing.T) {
	ns := namespace(t)
	// Renewal comes at 80% of the lifetime: 10 s leaves 2 s for the Secret write and the server's
	// reload before the old certificate expires, enough on a loaded machine (3 s left 0.6 s).
	const leafLife = 10 * time.Second
	startReconciler(t, ns, &certs.Reconciler{LeafValidity: leafLife})
	secs := waitSecrets(t, ns)
	handlerSrc := source(t, cp.Config, ns, qcerts.HandlerSecret)
	apiSrc := source(t, cp.Config, ns, qcerts.APISecret)
	addr := serve(t, handlerSrc)
	client := qcerts.ClientConfig(apiSrc, qcerts.HandlerName)

	first := leafOf(t, secs[qcerts.HandlerSecret])
	serials := []string{first.SerialNumber.Text(16)}
	for len(serials) < 3 {
		seen, err := handshake(addr, client)
		if err != nil {
			t.Fatalf("handshake after %d rotations: %v", len(serials)-1, err)
		}
		if s := seen.SerialNumber.Text(16); s != serials[len(serials)-1] {
			// A fresh certificate comes after 80% of the last one's lifetime, before it expires.
			if now := time.Now(); now.After(seen.NotAfter) || now.Before(seen.NotBefore) {
				t.Errorf("the server presented a certificate valid %s..%s at %s", seen.NotBefore, seen.NotAfter, now)
			}
			serials = append(serials, s)
			t.Logf("server certificate %s (valid %s)", s, seen.NotAfter.Sub(seen.NotBefore).Round(time.Millisecond))
		}
		if time.Since(first.NotBefore) > 5*leafLife {
			t.Fatalf("only %d certificates in %s with a lifetime of %s", len(serials), 5*leafLife, leafLife)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The api leaf rotates too, and the client's config (made once) presents the new one.
	if leafOf(t, getSecret(t, ns, qcerts.APISecret)).Equal(leafOf(t, secs[qcerts.APISecret])) {
		t.Error("the api certificate was not rotated")
	}
	waitEvent(t, ns, qcerts.HandlerSecret, certs.ReasonRotated, string(qcerts.Due))
}

func TestRecreatesDeletedLeafSecret(t *testing.T) {
	ns := namespace(t)
	startReconciler(t, ns, &certs.Reconciler{})
	old := waitSecrets(t, ns)[qcerts.HandlerSecret]
	if err := cp.Client.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	var now *corev1.Secret
	waitFor(t, "the handler Secret to be recreated", func() bool {
		now = getSecret(t, ns, qcerts.HandlerSecret)
		return now != nil && now.UID != old.UID
	})
	if leafOf(t, now).Equal(leafOf(t, old)) {
		t.Error("the recreated Secret holds the deleted certificate")
	}
	if err := qcerts.SignedBy(leafOf(t, now), leafOf(t, getSecret(t, ns, qcerts.CASecret))); err != nil {
		t.Error(err)
	}
	waitEvent(t, ns, qcerts.HandlerSecret, certs.ReasonCreated)
}

func TestRepairsCorruptCertificate(t *testing.T) {
	ns := namespace(t)
	startReconciler(t, ns, &certs.Reconciler{})
	waitSecrets(t, ns)
	handlerSrc := source(t, cp.Config, ns, qcerts.HandlerSecret)
	apiSrc := source(t, cp.Config, ns, qcerts.APISecret)
	addr := serve(t, handlerSrc)
	client := qcerts.ClientConfig(apiSrc, qcerts.HandlerName)
	before, err := handshake(addr, client)
	if err != nil {
		t.Fatal(err)
	}

	sec := getSecret(t, ns, qcerts.HandlerSecret)
	sec.Data[qcerts.KeyCert] = []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
	if err := cp.Client.Update(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, ns, qcerts.HandlerSecret, certs.ReasonRepaired, ns+"/"+qcerts.HandlerSecret, "key tls.crt")
	if ev.Type != corev1.EventTypeWarning {
		t.Errorf("repair Event of type %s", ev.Type)
	}
	t.Logf("event: %s", ev.Message)
	repaired := leafOf(t, getSecret(t, ns, qcerts.HandlerSecret))
	// The server keeps serving throughout, and moves to the repaired certificate.
	waitFor(t, "the server to present the repaired certificate", func() bool {
		seen, err := handshake(addr, client)
		if err != nil {
			t.Fatalf("handshake after the repair: %v", err)
		}
		return seen.Equal(repaired) && !seen.Equal(before)
	})
}

// secretLog records every version of the namespace's Secrets the API server sends, in order.
type secretLog struct {
	mu       sync.Mutex
	versions []secretVersion
}

type secretVersion struct {
	at  time.Time
	sec *corev1.Secret
}

func watchSecrets(t *testing.T, ns string) *secretLog {
	t.Helper()
	w, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Secrets(ns).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := &secretLog{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if sec, ok := ev.Object.(*corev1.Secret); ok && ev.Type != watch.Deleted {
				l.mu.Lock()
				l.versions = append(l.versions, secretVersion{time.Now(), sec})
				l.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return l
}

// first is when a version of Secret name first satisfied ok.
func (l *secretLog) first(name string, ok func(*corev1.Secret) bool) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, v := range l.versions {
		if v.sec.Name == name && ok(v.sec) {
			return v.at, true
		}
	}
	return time.Time{}, false
}

func trusts(ca *x509.Certificate) func(*corev1.Secret) bool {
	return func(sec *corev1.Secret) bool {
		b, err := qcerts.DecodeCerts(sec.Data[qcerts.KeyCA])
		return err == nil && slices.ContainsFunc(b, ca.Equal)
	}
}

func signedBy(ca *x509.Certificate) func(*corev1.Secret) bool {
	return func(sec *corev1.Secret) bool {
		c, err := qcerts.DecodeCerts(sec.Data[qcerts.KeyCert])
		return err == nil && qcerts.SignedBy(c[0], ca) == nil
	}
}

// TestCARotationKeepsOldChainWorking deletes qvirt-ca, which rotates the CA the graceful way
// (the old CA is recovered from the leaves' bundles): trust in the new CA is distributed first,
// leaves move to it a trust delay later, and a client still presenting its old-CA certificate
// keeps working for the overlap, which ends one leaf lifetime after the rotation.
func TestCARotationKeepsOldChainWorking(t *testing.T) {
	ns := namespace(t)
	const leafLife, trustDelay = 8 * time.Second, time.Second
	log := watchSecrets(t, ns)
	startReconciler(t, ns, &certs.Reconciler{LeafValidity: leafLife, TrustDelay: trustDelay})
	secs := waitSecrets(t, ns)
	ca1 := leafOf(t, secs[qcerts.CASecret])
	handlerSrc := source(t, cp.Config, ns, qcerts.HandlerSecret)
	addr := serve(t, handlerSrc)
	oldAPI, err := qcerts.ParseMaterial(secs[qcerts.APISecret].Data)
	if err != nil {
		t.Fatal(err)
	}

	if err := cp.Client.Delete(context.Background(), secs[qcerts.CASecret]); err != nil {
		t.Fatal(err)
	}
	var ca2 *x509.Certificate
	waitFor(t, "a new CA", func() bool {
		sec := getSecret(t, ns, qcerts.CASecret)
		if sec == nil || sec.UID == secs[qcerts.CASecret].UID {
			return false
		}
		ca2 = leafOf(t, sec)
		return true
	})
	if b := bundleOf(t, getSecret(t, ns, qcerts.CASecret)); len(b) != 2 || !b[0].Equal(ca2) || !b[1].Equal(ca1) {
		t.Fatalf("qvirt-ca bundle after rotation: %d CAs, want the new then the old", len(b))
	}
	apiSrc := source(t, cp.Config, ns, qcerts.APISecret)
	waitFor(t, "the server to present a certificate of the new CA", func() bool {
		seen, err := handshake(addr, qcerts.ClientConfig(apiSrc, qcerts.HandlerName))
		if err != nil {
			t.Fatalf("handshake with both peers on their Secrets during the rotation: %v", err)
		}
		return qcerts.SignedBy(seen, ca2) == nil
	})

	// Trust first, use later: both leaf Secrets trusted the new CA a trust delay before any
	// leaf signed by it appeared.
	for _, name := range []string{qcerts.HandlerSecret, qcerts.APISecret} {
		var trusted, used time.Time
		waitFor(t, "the watch to deliver Secret "+name+" signed by the new CA", func() bool {
			var ok1, ok2 bool
			trusted, ok1 = log.first(name, trusts(ca2))
			used, ok2 = log.first(name, signedBy(ca2))
			return ok1 && ok2
		})
		if gap := used.Sub(trusted); gap < trustDelay-200*time.Millisecond {
			t.Errorf("Secret %s: a leaf of the new CA %s after its bundle trusted it, want ≥ %s", name, gap, trustDelay)
		} else {
			t.Logf("Secret %s: new CA trusted, then used %s later", name, gap.Round(time.Millisecond))
		}
	}

	// An old-chain client (its certificate from the old CA, the current bundle) still gets in.
	bundle := bundleOf(t, getSecret(t, ns, qcerts.APISecret))
	oldChain := *oldAPI
	oldChain.CAs, oldChain.Pool = bundle, x509.NewCertPool()
	for _, c := range bundle {
		oldChain.Pool.AddCert(c)
	}
	seen, err := handshake(addr, qcerts.ClientConfig(qcerts.Fixed(&oldChain), qcerts.HandlerName))
	if err != nil {
		t.Fatalf("a client with the old CA's certificate during the overlap: %v", err)
	}
	if qcerts.SignedBy(seen, ca2) != nil {
		t.Errorf("the server presented %s, not a certificate of the new CA", seen.Subject.CommonName)
	}

	// The overlap ends one leaf lifetime after the rotation: the old CA leaves every bundle.
	waitFor(t, "the old CA to leave the bundles", func() bool {
		for _, name := range []string{qcerts.CASecret, qcerts.HandlerSecret, qcerts.APISecret} {
			if sec := getSecret(t, ns, name); sec == nil || len(bundleOf(t, sec)) != 1 {
				return false
			}
		}
		return true
	})
	if d := time.Since(ca2.NotBefore); d < leafLife {
		t.Errorf("the old CA was dropped %s after the rotation, before one leaf lifetime (%s)", d, leafLife)
	}
	if _, err := handshake(addr, qcerts.ClientConfig(qcerts.Fixed(&oldChain), qcerts.HandlerName)); err == nil {
		t.Error("the old CA's client certificate is still accepted after the overlap")
	}
	t.Logf("overlap ended %s after the rotation", time.Since(ca2.NotBefore).Round(time.Millisecond))
}
