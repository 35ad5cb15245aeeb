package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qcerts "github.com/qvirt/qvirt/certs"
)

// caBundleGVKs are the kinds a CABundleTarget may name.
var caBundleGVKs = map[string]schema.GroupVersionKind{
	qcerts.KindValidatingWebhook: {Group: "admissionregistration.k8s.io", Version: "v1", Kind: qcerts.KindValidatingWebhook},
	qcerts.KindMutatingWebhook:   {Group: "admissionregistration.k8s.io", Version: "v1", Kind: qcerts.KindMutatingWebhook},
	qcerts.KindAPIService:        {Group: "apiregistration.k8s.io", Version: "v1", Kind: qcerts.KindAPIService},
}

func (r *Reconciler) caBundleTargets() []qcerts.CABundleTarget {
	if r.CABundleTargets != nil {
		return r.CABundleTargets
	}
	return qcerts.CABundleTargets
}

// caBundleWatches are metadata-only watches of the targets, for the reconciler's own cache:
// each kind selected by name when one object of it is a target (so RBAC can name it), and by no
// label (kubectl apply of config/ sets none). A target recreated without its caBundle is
// written again at once.
func (r *Reconciler) caBundleWatches() (map[client.Object]cache.ByObject, []*metav1.PartialObjectMetadata, error) {
	names := map[string][]string{}
	for _, t := range r.caBundleTargets() {
		if _, ok := caBundleGVKs[t.Kind]; !ok {
			return nil, nil, fmt.Errorf("CA bundle target %s %q: kind must be %s, %s or %s", t.Kind, t.Name, qcerts.KindValidatingWebhook, qcerts.KindMutatingWebhook, qcerts.KindAPIService)
		}
		names[t.Kind] = append(names[t.Kind], t.Name)
	}
	byObject := map[client.Object]cache.ByObject{}
	var objs []*metav1.PartialObjectMetadata
	for kind, ns := range names {
		o := &metav1.PartialObjectMetadata{}
		o.SetGroupVersionKind(caBundleGVKs[kind])
		by := cache.ByObject{Label: labels.Everything()}
		if len(ns) == 1 {
			by.Field = fields.OneTermEqualSelector("metadata.name", ns[0])
		}
		byObject[o] = by
		objs = append(objs, o)
	}
	return byObject, objs, nil
}

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,resourceNames=qvirt-validating-webhook,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,resourceNames=qvirt-mutating-webhook,verbs=get;list;watch;update
// +kubebuilder:rbac:groups=apiregistration.k8s.io,resources=apiservices,resourceNames=v1alpha1.subresources.qvirt.io,verbs=get;list;watch;update

// applyCABundles writes bundle into the caBundle of every target that exists and differs. An
// APIService that skips TLS verification is left alone: someone chose that on purpose.
func (r *Reconciler) applyCABundles(ctx context.Context, bundle []*x509.Certificate) error {
	want := qcerts.EncodeCerts(bundle...)
	for _, t := range r.caBundleTargets() {
		o := &unstructured.Unstructured{}
		o.SetGroupVersionKind(caBundleGVKs[t.Kind])
		err := r.Reader.Get(ctx, client.ObjectKey{Name: t.Name}, o)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s %s: %w", t.Kind, t.Name, err)
		}
		n, err := setCABundle(o, want)
		if err != nil {
			return fmt.Errorf("%s %s: %w", t.Kind, t.Name, err)
		}
		if n == 0 {
			continue
		}
		if err := r.Client.Update(ctx, o); err != nil {
			return fmt.Errorf("write caBundle of %s %s: %w", t.Kind, t.Name, err)
		}
		ctrl.LoggerFrom(ctx).Info("CA bundle written", "kind", t.Kind, "name", t.Name, "entries", n, "trustedCAs", len(bundle))
	}
	return nil
}

// setCABundle sets caBundle (PEM, base64 in JSON) in every webhook of a webhook configuration,
// or in an APIService's spec; it returns how many it changed.
func setCABundle(o *unstructured.Unstructured, pem []byte) (int, error) {
	enc := base64.StdEncoding.EncodeToString(pem)
	same := func(v string) bool {
		cur, err := base64.StdEncoding.DecodeString(v)
		return err == nil && bytes.Equal(cur, pem)
	}
	if o.GetKind() == qcerts.KindAPIService {
		if skip, _, _ := unstructured.NestedBool(o.Object, "spec", "insecureSkipTLSVerify"); skip {
			return 0, nil
		}
		if cur, _, _ := unstructured.NestedString(o.Object, "spec", "caBundle"); same(cur) {
			return 0, nil
		}
		return 1, unstructured.SetNestedField(o.Object, enc, "spec", "caBundle")
	}
	hooks, _, err := unstructured.NestedSlice(o.Object, "webhooks")
	if err != nil {
		return 0, err
	}
	changed := 0
	for i, h := range hooks {
		hook, ok := h.(map[string]any)
		if !ok {
			return 0, fmt.Errorf("webhooks[%d] is not an object", i)
		}
		if cur, _, _ := unstructured.NestedString(hook, "clientConfig", "caBundle"); same(cur) {
			continue
		}
		if err := unstructured.SetNestedField(hook, enc, "clientConfig", "caBundle"); err != nil {
			return 0, fmt.Errorf("webhooks[%d]: %w", i, err)
		}
		changed++
	}
	if changed == 0 {
		return 0, nil
	}
	return changed, unstructured.SetNestedSlice(o.Object, hooks, "webhooks")
}
