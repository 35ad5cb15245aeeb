package streams_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/handler/streams"
)

// secretPKI is a CA with a handler and an api leaf, as the certificate controller makes them.
type secretPKI struct {
	ca *certs.Pair
}

func (p secretPKI) data(t *testing.T, spec certs.LeafSpec) map[string][]byte {
	t.Helper()
	now := time.Now()
	leaf, err := p.ca.Issue(spec, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	data, err := certs.MaterialData(leaf, []*x509.Certificate{p.ca.Cert})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestServerTakesCertificatesFromSecret runs the stream server on a certs.Provider that changes
// (a certs.Source watching a Secret): qvirt-api's client (certs.HandlerClientConfig) reaches it
// by IP, and a certificate written to the Secret is served from the next handshake, without a
// restart.
func TestServerTakesCertificatesFromSecret(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	ca, err := certs.NewCA("test-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	p := secretPKI{ca: ca}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "handler-test-certs"},
		Type:       corev1.SecretTypeTLS,
		Data:       p.data(t, certs.HandlerNodeSpec(nodeName)),
	}
	if err := cp.Client.Create(ctx, sec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), sec) })

	src := certs.NewSource(kubernetes.NewForConfigOrDie(cp.Config), sec.Namespace, sec.Name)
	srcCtx, stop := context.WithCancel(logr.NewContext(ctx, testr.New(t)))
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Start(srcCtx) }()
	t.Cleanup(func() { stop(); <-done })
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := src.WaitReady(waitCtx); err != nil {
		t.Fatal(err)
	}

	if _, err := streams.New(streams.Options{Reader: cp.Client, NodeName: nodeName, PodsDir: "/nonexistent", Addr: "127.0.0.1:0",
		Certs: src, CertFile: "/etc/tls.crt", Log: testr.New(t)}); err == nil {
		t.Error("Options.Certs with Options.CertFile: no error")
	}

	s, err := streams.New(streams.Options{Reader: cp.Client, NodeName: nodeName, PodsDir: t.TempDir(), Addr: "127.0.0.1:0",
		Certs: src, AllowedClientNames: []string{certs.APIName}, Log: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	srvCtx, stopSrv := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- s.Start(srvCtx) }()
	t.Cleanup(func() {
		stopSrv()
		if err := <-served; err != nil {
			t.Errorf("Start returned %v", err)
		}
	})
	waitFor(t, 5*time.Second, "the server to listen", func() bool { return s.Addr() != nil })
	base := "https://" + s.Addr().String()
	api, err := certs.ParseMaterial(p.data(t, certs.APISpec))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: certs.HandlerClientConfig(certs.Fixed(api), nodeName), DisableKeepAlives: true,
	}}
	// A request for a VMI the node does not have: the TLS handshake and the handler both worked
	// when the answer is the handler's 404 Status.
	get := func() *x509.Certificate {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, base+streams.Path("default", "no-such-vmi", "pause"), nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = alice.header()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("PUT pause through the Secret's certificates: %v", err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		var st metav1.Status
		if resp.StatusCode != http.StatusNotFound || json.Unmarshal(data, &st) != nil || st.Reason != metav1.StatusReasonNotFound {
			t.Fatalf("PUT pause for a missing VMI: %d %s", resp.StatusCode, data)
		}
		return resp.TLS.PeerCertificates[0]
	}
	first := get()
	if first.Subject.CommonName != certs.HandlerName {
		t.Fatalf("served %s", first.Subject.CommonName)
	}

	sec.Data = p.data(t, certs.HandlerNodeSpec(nodeName))
	if err := cp.Client.Update(ctx, sec); err != nil {
		t.Fatal(err)
	}
	want, err := certs.ParseMaterial(sec.Data)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the server to present the Secret's new certificate", func() bool {
		return get().Equal(want.Leaf())
	})

	// A client of another CA is refused at the TLS layer.
	other, err := certs.NewCA("other-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := certs.ParseMaterial(secretPKI{ca: other}.data(t, certs.APISpec))
	if err != nil {
		t.Fatal(err)
	}
	foreign.CAs, foreign.Pool = api.CAs, api.Pool
	bad := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: certs.ClientConfig(certs.Fixed(foreign), certs.HandlerName)}}
	if resp, err := bad.Get(base + streams.Path("default", "x", "console")); err == nil {
		resp.Body.Close()
		t.Errorf("a client certificate of another CA got HTTP %d", resp.StatusCode)
	}
}
