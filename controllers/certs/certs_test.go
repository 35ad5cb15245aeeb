package certs_test

import (
	"context"
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/controllers/certs"
)

func TestCreatesCertificatesAndMutualTLSWorks(t *testing.T) {
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
	api := leafOf(t, secs[qcerts.APISecret])
	if api.Subject.CommonName != qcerts.APIName || !slices.Equal(api.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("api certificate CN=%s usages %v", api.Subject.CommonName, api.ExtKeyUsage)
	}
	if err := qcerts.SignedBy(api, caCert); err != nil {
		t.Error(err)
	}
	if b := waitBundle(t, ns, func([]*x509.Certificate) bool { return true }); len(b) != 1 || !b[0].Equal(caCert) {
		t.Errorf("ConfigMap %s ca.crt is not the CA", qcerts.BundleConfigMap)
	}

	// Node A's agent, with its node-bound token and config/handler's RBAC, gets a certificate
	// naming node A, signed by the CA, for a key only it holds.
	agentIdentity(t, ns)
	nodeA, nodeB := node(t, "a"), node(t, "b")
	a := startAgent(t, agentClient(t, ns, boundTo(nodeA)), ns, nodeA.Name)
	leaf := a.waitCertificate(t)
	if got, err := qcerts.HandlerNodeOf(leaf); err != nil || got != nodeA.Name {
		t.Errorf("node A's certificate names node %q (%v)", got, err)
	}
	if leaf.Subject.CommonName != qcerts.HandlerName || !slices.Equal(leaf.DNSNames, []string{qcerts.HandlerName}) || len(leaf.IPAddresses) != 0 ||
		!slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
		t.Errorf("node certificate CN=%s DNS=%v IPs=%v usages %v", leaf.Subject.CommonName, leaf.DNSNames, leaf.IPAddresses, leaf.ExtKeyUsage)
	}
	if err := qcerts.SignedBy(leaf, caCert); err != nil {
		t.Error(err)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > qcerts.DefaultNodeCertValidity+2*time.Minute || life < qcerts.DefaultNodeCertValidity {
		t.Errorf("node certificate lifetime %s, want the %s asked for", life, qcerts.DefaultNodeCertValidity)
	}
	reqs := csrsOf(t, handlerUser(ns))
	if len(reqs) != 1 {
		t.Fatalf("%d requests of node A's agent, want 1", len(reqs))
	}
	if c := conditionOf(&reqs[0], certificatesv1.CertificateApproved); c == nil || c.Reason != certs.ReasonApproved || !strings.Contains(c.Message, nodeA.Name) {
		t.Errorf("request %s: Approved condition %+v", reqs[0].Name, c)
	}

	// qvirt-api (its Source reading only its Secret, by name) reaches node A's agent as node A's
	// and refuses it as node B's.
	apiSrc := source(t, restrictedUser(t, ns, qcerts.APISecret), ns, qcerts.APISecret)
	addr := serve(t, a.cert)
	seen, err := handshake(addr, qcerts.HandlerClientConfig(apiSrc, nodeA.Name))
	if err != nil {
		t.Fatalf("qvirt-api → node A's qvirt-handler handshake: %v", err)
	}
	if !seen.Equal(leaf) {
		t.Errorf("the server presented %s, not node A's certificate", seen.Subject.CommonName)
	}
	_, err = handshake(addr, qcerts.HandlerClientConfig(apiSrc, nodeB.Name))
	var wrong *qcerts.WrongNodeError
	if !errors.As(err, &wrong) || wrong.Got != nodeA.Name || wrong.Want != nodeB.Name {
		t.Errorf("qvirt-api dialling node B's agent and meeting node A's: %v, want a WrongNodeError", err)
	}

	// A client certificate of another CA is refused, even when the client trusts our CA.
	intruder := qcerts.Fixed(foreignMaterial(t, bundleOf(t, secs[qcerts.APISecret])))
	if _, err := handshake(addr, qcerts.HandlerClientConfig(intruder, nodeA.Name)); err == nil {
		t.Error("a client certificate from another CA was accepted")
	} else {
		t.Logf("foreign client refused: %v", err)
	}
	// The client refuses a server whose certificate does not name the wanted server.
	if _, err := handshake(addr, qcerts.ClientConfig(apiSrc, "someone-else")); err == nil {
		t.Error("the client accepted a server certificate not naming the wanted server")
	}
}

// Node certificates are renewed before they expire, and a server on the agent's certificate
// presents each new one from the next handshake. The api leaf rotates likewise.
func TestLeavesRotateAndServerPicksThemUp(t *testing.T) {
	ns := namespace(t)
	// Renewal comes at 70-90% of the lifetime: 10 s leaves at least 1 s for the request, its
	// signature and the server's next handshake before the old certificate expires.
	const leafLife = 10 * time.Second
	startReconciler(t, ns, &certs.Reconciler{LeafValidity: leafLife})
	secs := waitSecrets(t, ns)
	agentIdentity(t, ns)
	nodeA := node(t, "a")
	a := startAgent(t, agentClient(t, ns, boundTo(nodeA)), ns, nodeA.Name)
	first := a.waitCertificate(t)
	apiSrc := source(t, cp.Config, ns, qcerts.APISecret)
	addr := serve(t, a.cert)
	client := qcerts.HandlerClientConfig(apiSrc, nodeA.Name)

	if life := first.NotAfter.Sub(first.NotBefore); life > leafLife+2*time.Second {
		t.Errorf("node certificate lifetime %s: the signer does not cut it to its leaf lifetime %s", life, leafLife)
	}
	serials := []string{first.SerialNumber.Text(16)}
	for len(serials) < 3 {
		seen, err := handshake(addr, client)
		if err != nil {
			t.Fatalf("handshake after %d renewals: %v", len(serials)-1, err)
		}
		if s := seen.SerialNumber.Text(16); s != serials[len(serials)-1] {
			// A fresh certificate comes before the last one expires.
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
	waitEvent(t, ns, qcerts.APISecret, certs.ReasonRotated, string(qcerts.Due))
}

func TestRecreatesDeletedObjects(t *testing.T) {
	ns := namespace(t)
	// The Secret all node agents shared in earlier versions, as that version left it.
	legacy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: qcerts.LegacyHandlerSecret,
		Labels: map[string]string{certs.ManagedLabel: "handler"}}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: []byte("old"), corev1.TLSPrivateKeyKey: []byte("shared key")}}
	if err := cp.Client.Create(context.Background(), legacy); err != nil {
		t.Fatal(err)
	}
	startReconciler(t, ns, &certs.Reconciler{})
	old := waitSecrets(t, ns)[qcerts.APISecret]
	waitFor(t, "the shared node agent Secret to be deleted", func() bool { return getSecret(t, ns, qcerts.LegacyHandlerSecret) == nil })
	waitEvent(t, ns, qcerts.CASecret, certs.ReasonLegacyDeleted, qcerts.LegacyHandlerSecret)

	if err := cp.Client.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	var now *corev1.Secret
	waitFor(t, "the api Secret to be recreated", func() bool {
		now = getSecret(t, ns, qcerts.APISecret)
		return now != nil && now.UID != old.UID
	})
	if leafOf(t, now).Equal(leafOf(t, old)) {
		t.Error("the recreated Secret holds the deleted certificate")
	}
	if err := qcerts.SignedBy(leafOf(t, now), leafOf(t, getSecret(t, ns, qcerts.CASecret))); err != nil {
		t.Error(err)
	}
	waitEvent(t, ns, qcerts.APISecret, certs.ReasonCreated)

	cm := &corev1.ConfigMap{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: qcerts.BundleConfigMap}, cm); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bundle ConfigMap to be recreated", func() bool {
		again := &corev1.ConfigMap{}
		err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: qcerts.BundleConfigMap}, again)
		return err == nil && again.UID != cm.UID && again.Data[qcerts.KeyCA] == cm.Data[qcerts.KeyCA]
	})
}

func TestRepairsCorruptCertificate(t *testing.T) {
	ns := namespace(t)
	startReconciler(t, ns, &certs.Reconciler{})
	waitSecrets(t, ns)
	apiSrc := source(t, cp.Config, ns, qcerts.APISecret)
	before, err := apiSrc.Current()
	if err != nil {
		t.Fatal(err)
	}

	sec := getSecret(t, ns, qcerts.APISecret)
	sec.Data[qcerts.KeyCert] = []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
	if err := cp.Client.Update(context.Background(), sec); err != nil {
		t.Fatal(err)
	}
	ev := waitEvent(t, ns, qcerts.APISecret, certs.ReasonRepaired, ns+"/"+qcerts.APISecret, "key tls.crt")
	if ev.Type != corev1.EventTypeWarning {
		t.Errorf("repair Event of type %s", ev.Type)
	}
	t.Logf("event: %s", ev.Message)
	repaired := leafOf(t, getSecret(t, ns, qcerts.APISecret))
	// The Source kept the good certificate through the corrupt version and moves to the repaired
	// one.
	waitFor(t, "qvirt-api's Source to load the repaired certificate", func() bool {
		m, err := apiSrc.Current()
		if err != nil {
			t.Fatal(err)
		}
		return m.Leaf().Equal(repaired) && !m.Leaf().Equal(before.Leaf())
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
// (the old CA is recovered from the bundles): trust in the new CA is distributed first, leaves
// and node certificates move to it a trust delay later, and a client still presenting its old-CA
// certificate keeps working for the overlap, which ends one leaf lifetime after the rotation.
func TestCARotationKeepsOldChainWorking(t *testing.T) {
	ns := namespace(t)
	const leafLife, trustDelay = 8 * time.Second, time.Second
	log := watchSecrets(t, ns)
	startReconciler(t, ns, &certs.Reconciler{LeafValidity: leafLife, TrustDelay: trustDelay})
	secs := waitSecrets(t, ns)
	ca1 := leafOf(t, secs[qcerts.CASecret])
	agentIdentity(t, ns)
	nodeA := node(t, "a")
	a := startAgent(t, agentClient(t, ns, boundTo(nodeA)), ns, nodeA.Name)
	a.waitCertificate(t)
	addr := serve(t, a.cert)
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
	var agentTrusts time.Time
	waitFor(t, "the node agent to present a certificate of the new CA", func() bool {
		if b, err := a.bundle.Current(); agentTrusts.IsZero() && err == nil && slices.ContainsFunc(b.CAs, ca2.Equal) {
			agentTrusts = time.Now()
		}
		seen, err := handshake(addr, qcerts.HandlerClientConfig(apiSrc, nodeA.Name))
		if err != nil {
			t.Fatalf("handshake with both peers on their certificates during the rotation: %v", err)
		}
		return qcerts.SignedBy(seen, ca2) == nil
	})
	// Trust first, use later: the node agent trusted the new CA a trust delay before it held a
	// certificate of it...
	if gap := time.Since(agentTrusts); agentTrusts.IsZero() || gap < trustDelay-200*time.Millisecond {
		t.Errorf("the node agent held a certificate of the new CA %s after its bundle trusted it, want ≥ %s", gap, trustDelay)
	} else {
		t.Logf("node agent: new CA trusted, then used %s later", gap.Round(time.Millisecond))
	}
	// ... and so did the api leaf Secret.
	var trusted, used time.Time
	waitFor(t, "the watch to deliver Secret "+qcerts.APISecret+" signed by the new CA", func() bool {
		var ok1, ok2 bool
		trusted, ok1 = log.first(qcerts.APISecret, trusts(ca2))
		used, ok2 = log.first(qcerts.APISecret, signedBy(ca2))
		return ok1 && ok2
	})
	if gap := used.Sub(trusted); gap < trustDelay-200*time.Millisecond {
		t.Errorf("Secret %s: a leaf of the new CA %s after its bundle trusted it, want ≥ %s", qcerts.APISecret, gap, trustDelay)
	}

	// An old-chain client (its certificate from the old CA, the current bundle) still gets in.
	bundle := bundleOf(t, getSecret(t, ns, qcerts.APISecret))
	oldChain := *oldAPI
	oldChain.CAs, oldChain.Pool = bundle, x509.NewCertPool()
	for _, c := range bundle {
		oldChain.Pool.AddCert(c)
	}
	seen, err := handshake(addr, qcerts.HandlerClientConfig(qcerts.Fixed(&oldChain), nodeA.Name))
	if err != nil {
		t.Fatalf("a client with the old CA's certificate during the overlap: %v", err)
	}
	if qcerts.SignedBy(seen, ca2) != nil {
		t.Errorf("the server presented %s, not a certificate of the new CA", seen.Subject.CommonName)
	}

	// The overlap ends one leaf lifetime after the rotation: the old CA leaves every bundle.
	waitFor(t, "the old CA to leave the bundles", func() bool {
		for _, name := range []string{qcerts.CASecret, qcerts.APISecret} {
			if sec := getSecret(t, ns, name); sec == nil || len(bundleOf(t, sec)) != 1 {
				return false
			}
		}
		b, err := a.bundle.Current()
		return err == nil && len(b.CAs) == 1
	})
	if d := time.Since(ca2.NotBefore); d < leafLife {
		t.Errorf("the old CA was dropped %s after the rotation, before one leaf lifetime (%s)", d, leafLife)
	}
	if _, err := handshake(addr, qcerts.HandlerClientConfig(qcerts.Fixed(&oldChain), nodeA.Name)); err == nil {
		t.Error("the old CA's client certificate is still accepted after the overlap")
	}
	t.Logf("overlap ended %s after the rotation", time.Since(ca2.NotBefore).Round(time.Millisecond))
}
