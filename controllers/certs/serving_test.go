package certs_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"net"
	"slices"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/controllers/certs"
)

// The webhook's and qvirt-api's serving certificates are issued into their Secrets, and the
// trust bundle reaches every webhook of the webhook configurations and the APIService: a client
// that trusts exactly that caBundle and checks the Service name kube-apiserver checks
// (NAME.NAMESPACE.svc) completes a handshake with a server on each Secret. A configuration
// created later, or re-applied without its caBundle, gets it again.
func TestServingCertificatesAndCABundles(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()
	vwc, mwc := "vwc-"+ns, "mwc-"+ns
	apisvc := "v1alpha1." + ns + ".qvirt.io"
	targets := []qcerts.CABundleTarget{
		{Kind: qcerts.KindValidatingWebhook, Name: vwc},
		{Kind: qcerts.KindMutatingWebhook, Name: mwc},
		{Kind: qcerts.KindAPIService, Name: apisvc},
	}
	createWebhooks(t, vwc, mwc, ns)
	startReconciler(t, ns, &certs.Reconciler{CABundleTargets: targets})
	secs := waitSecrets(t, ns)
	caCert := leafOf(t, secs[qcerts.CASecret])

	for _, tc := range []struct{ secret, service string }{
		{qcerts.WebhookSecret, qcerts.WebhookService},
		{qcerts.APIServingSecret, qcerts.APIServiceName},
	} {
		var sec = getSecret(t, ns, tc.secret)
		waitFor(t, "Secret "+tc.secret, func() bool { sec = getSecret(t, ns, tc.secret); return sec != nil })
		leaf := leafOf(t, sec)
		svc := tc.service + "." + ns + ".svc"
		if leaf.Subject.CommonName != svc || !slices.Equal(leaf.DNSNames, []string{svc, svc + ".cluster.local"}) ||
			!slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
			t.Errorf("Secret %s: CN=%s DNS=%v usages %v, want a server certificate for %s", tc.secret, leaf.Subject.CommonName, leaf.DNSNames, leaf.ExtKeyUsage, svc)
		}
		if err := qcerts.SignedBy(leaf, caCert); err != nil {
			t.Error(err)
		}
	}
	bundle := waitBundle(t, ns, func([]*x509.Certificate) bool { return true })
	want := qcerts.EncodeCerts(bundle...)
	waitCABundles(t, targets, want)

	// As kube-apiserver dials: trust only the caBundle found in the configuration, verify the
	// Service name.
	hook := &admissionregistrationv1.ValidatingWebhookConfiguration{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Name: vwc}, hook); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(hook.Webhooks[0].ClientConfig.CABundle) {
		t.Fatal("the webhook's caBundle holds no certificate")
	}
	src := source(t, cp.Config, ns, qcerts.WebhookSecret)
	// As every qvirt-controller replica serves the webhooks.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: qcerts.GetCertificate(src)})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	dial := func(name string) error {
		c, err := tls.DialWithDialer(&net.Dialer{}, "tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: name})
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(qcerts.WebhookService + "." + ns + ".svc"); err != nil {
		t.Errorf("kube-apiserver's handshake with the webhook server: %v", err)
	}
	if err := dial(qcerts.APIName); err == nil {
		t.Error("the webhook's certificate is accepted for the name qvirt-api")
	}

	// Re-created without a caBundle (kubectl delete and apply): written again.
	if err := cp.Client.Delete(ctx, hook); err != nil {
		t.Fatal(err)
	}
	createWebhooks(t, vwc, "", ns)
	waitCABundles(t, targets, want)
}

// createWebhooks creates a validating (and, when mwc is set, a mutating) webhook configuration
// with two webhooks each, without caBundle, and an APIService in group ns.qvirt.io without one.
func createWebhooks(t *testing.T, vwc, mwc, ns string) {
	t.Helper()
	ctx := context.Background()
	fail, none := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone
	hook := func(name string) admissionregistrationv1.ValidatingWebhook {
		path := "/" + name
		return admissionregistrationv1.ValidatingWebhook{Name: name + ".qvirt.io", FailurePolicy: &fail, SideEffects: &none,
			AdmissionReviewVersions: []string{"v1"},
			ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{
				Namespace: ns, Name: qcerts.WebhookService, Path: &path}},
			// Nothing real: these configurations must not get in the way of other tests.
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{"example.invalid"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"}}}},
		}
	}
	v := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: vwc},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{hook("a"), hook("b")}}
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), v) })
	if mwc == "" {
		return
	}
	m := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: mwc}}
	for _, h := range []admissionregistrationv1.ValidatingWebhook{hook("c"), hook("d")} {
		m.Webhooks = append(m.Webhooks, admissionregistrationv1.MutatingWebhook{Name: h.Name, FailurePolicy: h.FailurePolicy,
			SideEffects: h.SideEffects, AdmissionReviewVersions: h.AdmissionReviewVersions, ClientConfig: h.ClientConfig, Rules: h.Rules})
	}
	if err := cp.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), m) })
	a := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": "v1alpha1." + ns + ".qvirt.io"},
		"spec": map[string]any{"group": ns + ".qvirt.io", "version": "v1alpha1", "groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"name": qcerts.APIServiceName, "namespace": ns, "port": int64(443)}}}}
	if err := cp.Client.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), a) })
}

// waitCABundles waits until every webhook of every target and the APIService hold want.
func waitCABundles(t *testing.T, targets []qcerts.CABundleTarget, want []byte) {
	t.Helper()
	waitFor(t, "the trust bundle in every caBundle", func() bool {
		for _, tg := range targets {
			o := &unstructured.Unstructured{}
			o.SetAPIVersion("admissionregistration.k8s.io/v1")
			if tg.Kind == qcerts.KindAPIService {
				o.SetAPIVersion("apiregistration.k8s.io/v1")
			}
			o.SetKind(tg.Kind)
			if err := cp.Client.Get(context.Background(), client.ObjectKey{Name: tg.Name}, o); err != nil {
				return false
			}
			var encs []string
			if tg.Kind == qcerts.KindAPIService {
				s, _, _ := unstructured.NestedString(o.Object, "spec", "caBundle")
				encs = append(encs, s)
			} else {
				hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
				for _, h := range hooks {
					s, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "caBundle")
					encs = append(encs, s)
				}
			}
			for _, e := range encs {
				got, _ := base64.StdEncoding.DecodeString(e)
				if !bytes.Equal(got, want) {
					return false
				}
			}
		}
		return true
	})
}
