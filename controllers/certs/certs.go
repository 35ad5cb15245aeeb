// Package certs is qvirt-controller's certificate reconciler: it keeps, in qvirt's install
// namespace, the CA (Secret qvirt-ca), qvirt-api's client certificate (Secret qvirt-api-certs),
// the serving certificates of the webhook server (qvirt-webhook-cert) and of qvirt-api
// (qvirt-api-serving), and the trust bundle the node agents read (ConfigMap qvirt-ca-bundle),
// issuing, rotating and repairing them; it writes the same bundle into the caBundle of the
// webhook configurations and the APIService (cabundle.go); and it signs each node agent's own certificate, for its node only, from the
// agent's CertificateSigningRequest (signer qvirt.io/handler, signer.go). What each object holds,
// who reads which and the rotation timeline are in the package documentation of
// github.com/qvirt/qvirt/certs.
//
// The CA, the leaf and the bundle are reconciled together, as one request: a CA change must reach
// every bundle in the same pass. There is no polling: the request is queued when one of them
// changes or disappears, and requeued at the next deadline (a certificate at 80% of its lifetime,
// the end of a CA rotation's trust delay, the end of its overlap).
//
// The reconciler never lists or watches Secrets through the manager's cache, which would cache
// every Secret of the cluster: it watches metadata only, through a cache of its own limited to
// the install namespace and the label ManagedLabel, and reads its objects by name.
package certs

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/internal/patch"
)

const (
	// DefaultTrustDelay is how long a new CA is in every bundle before leaves signed by it are
	// issued: long enough for the kubelet to refresh a Secret volume (about a minute) and for
	// every Source to see the update.
	DefaultTrustDelay = 10 * time.Minute
	// DefaultBackdate is how far before now certificates start, for peers whose clock is behind.
	DefaultBackdate = time.Minute

	// ManagedLabel marks the Secrets and the ConfigMap this reconciler owns; its value is the
	// object's role (ca, api, webhook, api-serving, bundle). The reconciler's watch selects on it.
	ManagedLabel = "qvirt.io/certificates"

	// Event reasons, on the Secret concerned.
	ReasonCreated       = "CertificateCreated"
	ReasonRotated       = "CertificateRotated"
	ReasonRepaired      = "CertificateRepaired"
	ReasonBundleUpdated = "TrustBundleUpdated"
	ReasonFailed        = "CertificateFailed"
	// ReasonLegacyDeleted: the shared node agent Secret of earlier versions was deleted (on the
	// CA Secret, since the deleted one is gone).
	ReasonLegacyDeleted = "SharedHandlerCertificateDeleted"
)

// Reconciler keeps the CA and leaf Secrets. Client, Recorder and Namespace are required.
type Reconciler struct {
	// Client writes the Secrets.
	Client client.Client
	// Reader reads them; the manager's API reader when nil (SetupWithManager). Never the
	// manager's cached client: a Get through it starts a cluster-wide Secret informer.
	Reader   client.Reader
	Recorder record.EventRecorder
	// Namespace is qvirt's install namespace, where the Secrets and the bundle live; node
	// agents are its ServiceAccount qvirt-handler.
	Namespace string
	// CAValidity and LeafValidity are the certificates' lifetimes (qcerts.DefaultCAValidity and
	// qcerts.DefaultLeafValidity when zero).
	CAValidity, LeafValidity time.Duration
	// TrustDelay is how long a rotated CA is trusted before leaves move to it
	// (DefaultTrustDelay, or a fifth of LeafValidity if shorter, when zero).
	TrustDelay time.Duration
	// Backdate is how far before now certificates start (DefaultBackdate, or a twentieth of
	// LeafValidity if shorter, when zero).
	Backdate time.Duration
	// CABundleTargets are the webhook configurations and APIServices whose caBundle is kept
	// equal to the trust bundle (qcerts.CABundleTargets when nil); one that does not exist is
	// skipped until it is created.
	CABundleTargets []qcerts.CABundleTarget
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// leafSecret is one of the leaves: its Secret name, the label value and what it certifies.
type leafSecret struct {
	name, role string
	spec       qcerts.LeafSpec
}

// leaves are the leaf Secrets of install namespace ns: qvirt-api's client certificate for the
// node agents, and the serving certificates of the webhook server and of qvirt-api, which
// kube-apiserver verifies against the bundle written into CABundleTargets.
func leaves(ns string) []leafSecret {
	return []leafSecret{
		{qcerts.APISecret, "api", qcerts.APISpec},
		{qcerts.WebhookSecret, "webhook", qcerts.ServingSpec(qcerts.WebhookService, ns)},
		{qcerts.APIServingSecret, "api-serving", qcerts.ServingSpec(qcerts.APIServiceName, ns)},
	}
}

// SecretNames are the Secrets the reconciler creates and keeps in the install namespace.
func SecretNames() []string {
	names := []string{qcerts.CASecret}
	for _, lf := range leaves("") {
		names = append(names, lf.name)
	}
	return names
}

// bundleRole is the bundle ConfigMap's ManagedLabel value.
const bundleRole = "bundle"

// Lifetimes are the effective lifetimes, defaults applied.
func (r *Reconciler) Lifetimes() Lifetimes {
	l := Lifetimes{CA: r.CAValidity, Leaf: r.LeafValidity, TrustDelay: r.TrustDelay, Backdate: r.Backdate}
	if l.CA == 0 {
		l.CA = qcerts.DefaultCAValidity
	}
	if l.Leaf == 0 {
		l.Leaf = qcerts.DefaultLeafValidity
	}
	if l.TrustDelay == 0 {
		l.TrustDelay = min(DefaultTrustDelay, l.Leaf/5, l.CA/25)
	}
	if l.Backdate == 0 {
		l.Backdate = min(DefaultBackdate, l.Leaf/20)
	}
	return l
}

// SetupWithManager registers the reconciler, with a metadata-only watch on the install
// namespace's Secrets and ConfigMaps labelled ManagedLabel and on the CA bundle targets (its own
// cache, added to mgr), queues
// one reconcile at start so missing objects are created, and registers the signer of the node
// agents' certificate signing requests.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Namespace == "" {
		return errors.New("certs: Reconciler.Namespace is required")
	}
	if err := r.Lifetimes().Validate(); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if r.Reader == nil {
		r.Reader = mgr.GetAPIReader()
	}
	sel, err := labels.Parse(ManagedLabel)
	if err != nil {
		return err
	}
	targets, targetObjs, err := r.caBundleWatches()
	if err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces:    map[string]cache.Config{r.Namespace: {}},
		DefaultLabelSelector: sel,
		ByObject:             targets,
	})
	if err != nil {
		return fmt.Errorf("certs: cache for Secrets in %s: %w", r.Namespace, err)
	}
	if err := mgr.Add(c); err != nil {
		return err
	}
	req := r.request()
	secretMeta := &metav1.PartialObjectMetadata{}
	secretMeta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	configMapMeta := &metav1.PartialObjectMetadata{}
	configMapMeta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	onObject := handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *metav1.PartialObjectMetadata) []reconcile.Request {
		return []reconcile.Request{req}
	})
	atStart := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(req)
		return nil
	})
	b := ctrl.NewControllerManagedBy(mgr).Named("certs").
		WatchesRawSource(source.Kind(c, secretMeta, onObject)).
		WatchesRawSource(source.Kind(c, configMapMeta, onObject)).
		WatchesRawSource(atStart)
	for _, o := range targetObjs {
		b = b.WatchesRawSource(source.Kind(c, o, onObject))
	}
	if err := b.Complete(r); err != nil {
		return err
	}
	return r.setupSigner(mgr)
}

// request is the one request all three Secrets map to.
func (r *Reconciler) request() reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: qcerts.CASecret}}
}

// +kubebuilder:rbac:groups="",namespace=qvirt-system,resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=qvirt-system,resources=secrets,resourceNames=qvirt-handler-certs,verbs=delete
// +kubebuilder:rbac:groups="",namespace=qvirt-system,resources=configmaps,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=qvirt-system,resources=events,verbs=create;patch

// Reconcile brings the CA, then the leaf and the bundle, to their wanted state and requeues at
// the earliest deadline. A write that lost to a newer version is requeued (patch.Result).
func (r *Reconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	return patch.Result(r.reconcile(ctx))
}

func (r *Reconciler) reconcile(ctx context.Context) (ctrl.Result, error) {
	now := r.now()
	l := r.Lifetimes()
	caSec, err := r.get(ctx, qcerts.CASecret)
	if err != nil {
		return ctrl.Result{}, err
	}
	leaves := leaves(r.Namespace)
	leafSecs := make([]*corev1.Secret, len(leaves))
	var salvage []*x509.Certificate
	for i, lf := range leaves {
		if leafSecs[i], err = r.get(ctx, lf.name); err != nil {
			return ctrl.Result{}, err
		}
		if bundle, err := qcerts.DecodeCerts(dataOf(leafSecs[i])[qcerts.KeyCA]); err == nil {
			salvage = append(salvage, bundle...)
		}
	}
	bundleCM, err := r.getBundle(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	if bundleCM != nil {
		if bundle, err := qcerts.DecodeCerts([]byte(bundleCM.Data[qcerts.KeyCA])); err == nil {
			salvage = append(salvage, bundle...)
		}
	}
	ca, u, err := planCA(caSec, salvage, l, now)
	if err != nil {
		return ctrl.Result{}, r.failed(ctx, caSec, qcerts.CASecret, err)
	}
	if err := r.apply(ctx, caSec, qcerts.CASecret, "ca", u); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applyBundle(ctx, bundleCM, ca.bundle); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.applyCABundles(ctx, ca.bundle); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.deleteLegacy(ctx); err != nil {
		return ctrl.Result{}, err
	}
	next := ca.next
	for i, lf := range leaves {
		u, at, err := planLeaf(leafSecs[i], lf.spec, ca, l, now)
		if err != nil {
			return ctrl.Result{}, r.failed(ctx, leafSecs[i], lf.name, err)
		}
		if err := r.apply(ctx, leafSecs[i], lf.name, lf.role, u); err != nil {
			return ctrl.Result{}, err
		}
		next = earliest(next, at)
	}
	// A little past the deadline, so the next pass sees the certificate due rather than a hair
	// before it.
	return ctrl.Result{RequeueAfter: max(next.Sub(r.now()), 0) + 50*time.Millisecond}, nil
}

// get reads a Secret by name; nil when it does not exist.
func (r *Reconciler) get(ctx context.Context, name string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, sec)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read Secret %s/%s: %w", r.Namespace, name, err)
	}
	return sec, nil
}

// getBundle reads the bundle ConfigMap; nil when it does not exist.
func (r *Reconciler) getBundle(ctx context.Context) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{}
	err := r.Reader.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: qcerts.BundleConfigMap}, cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", r.Namespace, qcerts.BundleConfigMap, err)
	}
	return cm, nil
}

// applyBundle creates or updates the node agents' bundle ConfigMap when its ca.crt or label
// differ from bundle. Its changes follow the CA Secret's, whose Events tell of them.
func (r *Reconciler) applyBundle(ctx context.Context, cm *corev1.ConfigMap, bundle []*x509.Certificate) error {
	want := string(qcerts.EncodeCerts(bundle...))
	if cm != nil && cm.Data[qcerts.KeyCA] == want && cm.Labels[ManagedLabel] == bundleRole {
		return nil
	}
	created := cm == nil
	if created {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: qcerts.BundleConfigMap}}
	}
	cm.Labels = maps.Clone(cm.Labels)
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels[ManagedLabel] = bundleRole
	cm.Data = map[string]string{qcerts.KeyCA: want}
	var err error
	if created {
		err = r.Client.Create(ctx, cm)
	} else {
		err = r.Client.Update(ctx, cm)
	}
	if err != nil {
		return fmt.Errorf("write ConfigMap %s/%s: %w", r.Namespace, qcerts.BundleConfigMap, err)
	}
	ctrl.LoggerFrom(ctx).Info("trust bundle for the node agents written", "configMap", r.Namespace+"/"+qcerts.BundleConfigMap, "trustedCAs", len(bundle), "created", created)
	return nil
}

// deleteLegacy deletes the serving certificate and key every node agent shared before each got
// its own, where an earlier version left it (only if this reconciler made it: it carries
// ManagedLabel). No peer accepts it any more (it names no node), but its key must not linger.
func (r *Reconciler) deleteLegacy(ctx context.Context) error {
	sec, err := r.get(ctx, qcerts.LegacyHandlerSecret)
	if err != nil || sec == nil || sec.Labels[ManagedLabel] == "" {
		return err
	}
	if err := r.Client.Delete(ctx, sec, client.Preconditions{UID: &sec.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the shared node agent Secret %s/%s: %w", r.Namespace, sec.Name, err)
	}
	msg := fmt.Sprintf("deleted Secret %s/%s, the serving key all node agents shared before each got a certificate for its own node", r.Namespace, sec.Name)
	ctrl.LoggerFrom(ctx).Info(msg)
	if ca, err := r.get(ctx, qcerts.CASecret); err == nil && ca != nil {
		r.Recorder.Event(ca, corev1.EventTypeNormal, ReasonLegacyDeleted, msg)
	}
	return nil
}

// apply creates or updates the Secret when its data, type or label differ, and says so in an
// Event on it and in the log.
func (r *Reconciler) apply(ctx context.Context, sec *corev1.Secret, name, role string, u *update) error {
	log := ctrl.LoggerFrom(ctx).WithValues("secret", r.Namespace+"/"+name)
	if sec != nil && sec.Type != corev1.SecretTypeTLS {
		// The type is immutable: only its owner can delete the Secret for it to be recreated.
		return r.failed(ctx, sec, name, fmt.Errorf("type is %q, want %q; delete the Secret and it is recreated", sec.Type, corev1.SecretTypeTLS))
	}
	if !u.changed(sec) && sec.Labels[ManagedLabel] == role {
		return nil
	}
	created := sec == nil
	if created {
		sec = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name}, Type: corev1.SecretTypeTLS}
	}
	sec.Labels = maps.Clone(sec.Labels)
	if sec.Labels == nil {
		sec.Labels = map[string]string{}
	}
	sec.Labels[ManagedLabel] = role
	sec.Data = u.data
	var err error
	if created {
		err = r.Client.Create(ctx, sec)
	} else {
		err = r.Client.Update(ctx, sec)
	}
	if err != nil {
		// A conflict or an AlreadyExists means someone wrote first: the requeue (quiet for a
		// conflict, backed off for the rest) reads it again.
		return fmt.Errorf("write Secret %s/%s: %w", r.Namespace, name, err)
	}
	evType, reason, msg := describeUpdate(r.Namespace, name, created, u)
	if evType == corev1.EventTypeWarning {
		log.Error(u.problem, msg)
	} else {
		log.Info(msg)
	}
	r.Recorder.Event(sec, evType, reason, msg)
	return nil
}

// describeUpdate is the Event for a write: created, repaired (with the key at fault), rotated,
// or only the trust bundle changed.
func describeUpdate(ns, name string, created bool, u *update) (evType, reason, msg string) {
	subject := fmt.Sprintf("Secret %s/%s", ns, name)
	issued := ""
	if u.pair != nil {
		issued = fmt.Sprintf("CN=%s serial %x valid until %s", u.pair.Cert.Subject.CommonName, u.pair.Cert.SerialNumber, u.pair.Cert.NotAfter.UTC().Format(time.RFC3339))
	}
	switch {
	case created:
		return corev1.EventTypeNormal, ReasonCreated, fmt.Sprintf("%s created with a new certificate %s", subject, issued)
	case !u.reissued:
		return corev1.EventTypeNormal, ReasonBundleUpdated, fmt.Sprintf("%s: trust bundle %s updated (%d CAs)", subject, qcerts.KeyCA, bundleLen(u.data))
	case u.reason == qcerts.Missing || u.reason == qcerts.Corrupt:
		return corev1.EventTypeWarning, ReasonRepaired, fmt.Sprintf("%s key %v; replaced with a new certificate %s", subject, u.problem, issued)
	}
	return corev1.EventTypeNormal, ReasonRotated, fmt.Sprintf("%s rotated (%s: %v); new certificate %s", subject, u.reason, u.problem, issued)
}

func bundleLen(data map[string][]byte) int {
	certs, _ := qcerts.DecodeCerts(data[qcerts.KeyCA])
	return len(certs)
}

// failed records an Event (on the Secret when it exists) and returns err naming the Secret.
func (r *Reconciler) failed(ctx context.Context, sec *corev1.Secret, name string, err error) error {
	err = &qcerts.SecretError{Namespace: r.Namespace, Name: name, Err: err}
	ctrl.LoggerFrom(ctx).Error(err, "certificate reconcile failed")
	if sec != nil {
		r.Recorder.Event(sec, corev1.EventTypeWarning, ReasonFailed, err.Error())
	}
	return err
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
