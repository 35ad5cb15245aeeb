package certs_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/controllers/certs"
	"github.com/qvirt/qvirt/test/envtest"
)

// These tests run the reconciler against a real kube-apiserver, read its Secrets with
// certs.Source (as qvirt-handler and qvirt-api do) and complete real TLS handshakes over TCP.

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

const waitTimeout = 30 * time.Second

// startReconciler runs r (Client, Recorder and Namespace filled in) on its own manager in
// namespace ns until the test ends.
func startReconciler(t *testing.T, ns string, r *certs.Reconciler) {
	t.Helper()
	mgr, err := ctrl.NewManager(cp.Config, cp.ManagerOptions())
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 the reconcilers record with the core/v1 Events API (see controllers.recorder)
	r.Recorder = mgr.GetEventRecorderFor("qvirt-certs")
	r.Client, r.Namespace = mgr.GetClient(), ns
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.New(t)))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "certs-"}}
	if err := cp.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// source runs a certs.Source for Secret ns/name with cfg's credentials until the test ends, and
// waits for its first material.
func source(t *testing.T, cfg *rest.Config, ns, name string) *qcerts.Source {
	t.Helper()
	src := qcerts.NewSource(kubernetes.NewForConfigOrDie(cfg), ns, name)
	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.New(t).WithName(name)))
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wctx, wcancel := context.WithTimeout(context.Background(), waitTimeout)
	defer wcancel()
	if err := src.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return src
}

// restrictedUser is a user allowed only get, list and watch on the one Secret name in ns, as
// qvirt-handler's Role allows: a Source running as it proves the watch is by name.
func restrictedUser(t *testing.T, ns, secret string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	name := "reader-" + secret
	user, err := cp.Env.ControlPlane.AddUser(crenvtest.User{Name: ns + "-" + name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{secret}, Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: ns + "-" + name}},
	}
	for _, o := range []client.Object{role, binding} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := user.Config()
	// The user may not list the namespace's Secrets: only the field-selected one.
	cs := kubernetes.NewForConfigOrDie(cfg)
	waitFor(t, "the Role to take effect", func() bool {
		_, err := cs.CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
		return err == nil || apierrors.IsNotFound(err)
	})
	if _, err := cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the restricted user lists all Secrets: %v", err)
	}
	return cfg
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", waitTimeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func getSecret(t *testing.T, ns, name string) *corev1.Secret {
	t.Helper()
	sec := &corev1.Secret{}
	if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return sec
}

// waitSecrets waits for the CA and api Secrets and returns them by name.
func waitSecrets(t *testing.T, ns string) map[string]*corev1.Secret {
	t.Helper()
	out := map[string]*corev1.Secret{}
	waitFor(t, "the CA and api Secrets", func() bool {
		for _, n := range []string{qcerts.CASecret, qcerts.APISecret} {
			if out[n] = getSecret(t, ns, n); out[n] == nil {
				return false
			}
		}
		return true
	})
	return out
}

// waitBundle waits for the bundle ConfigMap to hold a bundle ok accepts, and returns it.
func waitBundle(t *testing.T, ns string, ok func([]*x509.Certificate) bool) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	waitFor(t, "ConfigMap "+qcerts.BundleConfigMap, func() bool {
		cm := &corev1.ConfigMap{}
		if err := cp.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: qcerts.BundleConfigMap}, cm); err != nil {
			return false
		}
		if cm.Labels[certs.ManagedLabel] != "bundle" {
			t.Errorf("ConfigMap %s labels %v", cm.Name, cm.Labels)
		}
		b, err := qcerts.DecodeCerts([]byte(cm.Data[qcerts.KeyCA]))
		if err != nil {
			t.Fatalf("ConfigMap %s ca.crt: %v", cm.Name, err)
		}
		out = b
		return ok(b)
	})
	return out
}

func leafOf(t *testing.T, sec *corev1.Secret) *x509.Certificate {
	t.Helper()
	certs, err := qcerts.DecodeCerts(sec.Data[qcerts.KeyCert])
	if err != nil {
		t.Fatalf("Secret %s tls.crt: %v", sec.Name, err)
	}
	return certs[0]
}

func bundleOf(t *testing.T, sec *corev1.Secret) []*x509.Certificate {
	t.Helper()
	certs, err := qcerts.DecodeCerts(sec.Data[qcerts.KeyCA])
	if err != nil {
		t.Fatalf("Secret %s ca.crt: %v", sec.Name, err)
	}
	return certs
}

// serve is a TLS server on 127.0.0.1 configured like the handler's stream server
// (certs.ServerConfig from p, only qvirt-api allowed); each connection completes the handshake
// and reads "ok".
func serve(t *testing.T, p qcerts.Provider) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", qcerts.ServerConfig(p, []string{qcerts.APIName}))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if c.(*tls.Conn).Handshake() == nil {
					_, _ = c.Write([]byte("ok"))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake dials addr (an IP, as qvirt-api dials a node) with cfg; it returns the server
// certificate it saw.
func handshake(addr string, cfg *tls.Config) (*x509.Certificate, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil {
		// TLS 1.3: the server refuses the client certificate after the client's handshake ends.
		return nil, fmt.Errorf("read after handshake: %w", err)
	}
	return c.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}

// events are the Events recorded in ns on Secret name.
func events(t *testing.T, ns, name string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	if err := cp.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Secret" && e.InvolvedObject.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits for an Event of reason on Secret ns/name whose message contains every want.
func waitEvent(t *testing.T, ns, name, reason string, want ...string) corev1.Event {
	t.Helper()
	var found corev1.Event
	waitFor(t, fmt.Sprintf("a %s Event on Secret %s mentioning %q", reason, name, want), func() bool {
		for _, e := range events(t, ns, name) {
			if e.Reason != reason {
				continue
			}
			all := true
			for _, w := range want {
				all = all && strings.Contains(e.Message, w)
			}
			if all {
				found = e
				return true
			}
		}
		return false
	})
	return found
}

// foreignMaterial is an api-like client certificate from a CA the controller never made.
func foreignMaterial(t *testing.T, trust []*x509.Certificate) *qcerts.Material {
	t.Helper()
	now := time.Now()
	ca, err := qcerts.NewCA("intruder-ca", now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue(qcerts.APISpec, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	data, err := qcerts.MaterialData(leaf, trust)
	if err != nil {
		t.Fatal(err)
	}
	m, err := qcerts.ParseMaterial(data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
