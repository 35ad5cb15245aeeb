// Package certs is qvirt-controller's certificate reconciler: it keeps, in qvirt's install
// namespace, the CA (Secret qvirt-ca) and the two leaves of the qvirt-api → qvirt-handler mutual
// TLS link (Secrets qvirt-handler-certs and qvirt-api-certs), issuing, rotating and repairing
// them. What the Secrets hold, who reads which and the rotation timeline are in the package
// documentation of github.com/qvirt/qvirt/certs.
//
// The three Secrets are reconciled together, as one request: a CA change must reach both leaves
// in the same pass. There is no polling: the request is queued when one of the Secrets changes
// or disappears, and requeued at the next deadline (a certificate at 80% of its lifetime, the end
// of a CA rotation's trust delay, the end of its overlap).
//
// The reconciler never lists or watches Secrets through the manager's cache, which would cache
// every Secret of the cluster: it watches metadata only, through a cache of its own limited to
// the install namespace and the label ManagedLabel, and reads the three Secrets by name.
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

	// ManagedLabel marks the Secrets this reconciler owns; its value is the Secret's role (ca,
	// handler, api). The reconciler's watch selects on it.
	ManagedLabel = "qvirt.io/certificates"

	// Event reasons, on the Secret concerned.
	ReasonCreated       = "CertificateCreated"
	ReasonRotated       = "CertificateRotated"
	ReasonRepaired      = "CertificateRepaired"
	ReasonBundleUpdated = "TrustBundleUpdated"
	ReasonFailed        = "CertificateFailed"
)

// Reconciler keeps the CA and leaf Secrets. Client, Recorder and Namespace are required.
type Reconciler struct {
	// Client writes the Secrets.
	Client client.Client
	// Reader reads them; the manager's API reader when nil (SetupWithManager). Never the
	// manager's cached client: a Get through it starts a cluster-wide Secret informer.
	Reader   client.Reader
	Recorder record.EventRecorder
	// Namespace is qvirt's install namespace, where the three Secrets live.
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
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// leafSecret is one of the leaves: its Secret name, the label value and what it certifies.
type leafSecret struct {
	name, role string
	spec       qcerts.LeafSpec
}

var leaves = []leafSecret{
	{qcerts.HandlerSecret, "handler", qcerts.HandlerSpec},
	{qcerts.APISecret, "api", qcerts.APISpec},
}

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
// namespace's Secrets labelled ManagedLabel (its own cache, added to mgr), and queues one
// reconcile at start so missing Secrets are created.
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
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		DefaultNamespaces:    map[string]cache.Config{r.Namespace: {}},
		DefaultLabelSelector: sel,
	})
	if err != nil {
		return fmt.Errorf("certs: cache for Secrets in %s: %w", r.Namespace, err)
	}
	if err := mgr.Add(c); err != nil {
		return err
	}
	req := r.request()
	meta := &metav1.PartialObjectMetadata{}
	meta.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	onSecret := handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *metav1.PartialObjectMetadata) []reconcile.Request {
		return []reconcile.Request{req}
	})
	atStart := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(req)
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).Named("certs").
		WatchesRawSource(source.Kind(c, meta, onSecret)).
		WatchesRawSource(atStart).
		Complete(r)
}

// request is the one request all three Secrets map to.
func (r *Reconciler) request() reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: qcerts.CASecret}}
}

// +kubebuilder:rbac:groups="",namespace=qvirt-system,resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=qvirt-system,resources=events,verbs=create;patch

// Reconcile brings the CA, then both leaves, to their wanted state and requeues at the earliest
// deadline. A Secret write that lost to a newer version is requeued (patch.Result).
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
	ca, u, err := planCA(caSec, salvage, l, now)
	if err != nil {
		return ctrl.Result{}, r.failed(ctx, caSec, qcerts.CASecret, err)
	}
	if err := r.apply(ctx, caSec, qcerts.CASecret, "ca", u); err != nil {
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
