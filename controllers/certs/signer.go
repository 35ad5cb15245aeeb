package certs

import (
	"context"
	"crypto/x509"
	"fmt"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	qcerts "github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/internal/patch"
)

// Event reasons on a node agent's CertificateSigningRequest (cluster-scoped: its Events are in
// namespace default).
const (
	ReasonCSRApproved = "NodeCertificateApproved"
	ReasonCSRDenied   = "NodeCertificateDenied"
	ReasonCSRIssued   = "NodeCertificateIssued"
)

// signer approves, denies and signs the CertificateSigningRequests of signer
// qcerts.HandlerSignerName: a node agent's certificate for its own node. The rule
// (checkHandlerCSR) is checked before approving and again before signing, so a request approved
// by hand against it gets a Failed condition, never a certificate. Leaves are signed with the
// current CA for min(spec.expirationSeconds, LeafValidity); after a CA rotation, only once the
// trust delay has passed (the same rule as the leaf Secrets: peers trust a CA before it is used).
type signer struct {
	r     *Reconciler
	cache cache.Cache
}

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=qvirt.io/handler,verbs=approve;sign
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// setupSigner registers the signer with a cache of its own holding only the requests of its
// signer name (a field selector the API server applies).
func (r *Reconciler) setupSigner(mgr ctrl.Manager) error {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&certificatesv1.CertificateSigningRequest{}: {Field: fields.OneTermEqualSelector("spec.signerName", qcerts.HandlerSignerName)},
		},
	})
	if err != nil {
		return fmt.Errorf("certs: cache for CertificateSigningRequests of %s: %w", qcerts.HandlerSignerName, err)
	}
	if err := mgr.Add(c); err != nil {
		return err
	}
	s := &signer{r: r, cache: c}
	return ctrl.NewControllerManagedBy(mgr).Named("certs-signer").
		WatchesRawSource(source.Kind(c, &certificatesv1.CertificateSigningRequest{}, &handler.TypedEnqueueRequestForObject[*certificatesv1.CertificateSigningRequest]{})).
		Complete(s)
}

// Reconcile takes one request as far as it goes: approve or deny, then sign.
func (s *signer) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := s.cache.Get(ctx, req.NamespacedName, csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != qcerts.HandlerSignerName || len(csr.Status.Certificate) > 0 ||
		hasCondition(csr, certificatesv1.CertificateDenied) || hasCondition(csr, certificatesv1.CertificateFailed) {
		return ctrl.Result{}, nil
	}
	ctx = ctrl.LoggerInto(ctx, ctrl.LoggerFrom(ctx).WithValues("csr", csr.Name, "requester", csr.Spec.Username))
	node, parsed, no := checkHandlerCSR(csr, s.r.Namespace)
	switch {
	case no != nil && !hasCondition(csr, certificatesv1.CertificateApproved):
		return patch.Result(ctrl.Result{}, s.decide(ctx, csr, certificatesv1.CertificateDenied, no.reason, no.message))
	case no != nil:
		// Approved by someone else, against the rule: never signed.
		return patch.Result(ctrl.Result{}, s.fail(ctx, csr, no.reason, "approved, but not signed: "+no.message))
	case !hasCondition(csr, certificatesv1.CertificateApproved):
		msg := fmt.Sprintf("the node agent of node %s asks for a certificate for its node", node)
		if err := s.decide(ctx, csr, certificatesv1.CertificateApproved, ReasonApproved, msg); err != nil {
			return patch.Result(ctrl.Result{}, err)
		}
	}
	return patch.Result(s.sign(ctx, csr, node, parsed))
}

// decide adds the Approved or Denied condition through the approval subresource.
func (s *signer) decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType, reason, msg string) error {
	now := metav1.NewTime(s.r.now())
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastUpdateTime: now, LastTransitionTime: now})
	if err := s.r.Client.SubResource("approval").Update(ctx, csr); err != nil {
		return fmt.Errorf("set %s on CertificateSigningRequest %s: %w", typ, csr.Name, err)
	}
	log := ctrl.LoggerFrom(ctx)
	if typ == certificatesv1.CertificateDenied {
		log.Info("denied a node agent's certificate request", "reason", reason, "message", msg)
		s.r.Recorder.Event(csr, corev1.EventTypeWarning, ReasonCSRDenied, msg)
		return nil
	}
	log.Info("approved a node agent's certificate request", "message", msg)
	s.r.Recorder.Event(csr, corev1.EventTypeNormal, ReasonCSRApproved, msg)
	return nil
}

// fail adds the Failed condition through the status subresource.
func (s *signer) fail(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, reason, msg string) error {
	now := metav1.NewTime(s.r.now())
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastUpdateTime: now, LastTransitionTime: now})
	if err := s.r.Client.Status().Update(ctx, csr); err != nil {
		return fmt.Errorf("set Failed on CertificateSigningRequest %s: %w", csr.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("refused to sign a node agent's certificate request", "reason", reason, "message", msg)
	s.r.Recorder.Event(csr, corev1.EventTypeWarning, ReasonCSRDenied, msg)
	return nil
}

// sign certifies the request's key for node with the current CA, once that CA is trusted by
// every peer.
func (s *signer) sign(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, node string, req *x509.CertificateRequest) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	now := s.r.now()
	l := s.r.Lifetimes()
	ca, bundle, err := s.currentCA(ctx, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	if ca == nil {
		log.Info("no usable CA yet; the certificate reconciler makes one")
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if len(bundle) > 1 {
		if trustedAt := caIssuedAt(ca.Cert, l).Add(l.TrustDelay); now.Before(trustedAt) {
			log.Info("holding the request until the new CA is trusted everywhere", "until", trustedAt)
			return ctrl.Result{RequeueAfter: trustedAt.Sub(now) + 50*time.Millisecond}, nil
		}
	}
	life := l.Leaf
	if e := csr.Spec.ExpirationSeconds; e != nil {
		life = min(life, time.Duration(*e)*time.Second)
	}
	cert, err := ca.Sign(qcerts.HandlerNodeSpec(node), req.PublicKey, now.Add(-l.Backdate), now.Add(life))
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("sign CertificateSigningRequest %s: %w", csr.Name, err)
	}
	csr.Status.Certificate = qcerts.EncodeCerts(cert)
	if err := s.r.Client.Status().Update(ctx, csr); err != nil {
		return ctrl.Result{}, fmt.Errorf("write the certificate of CertificateSigningRequest %s: %w", csr.Name, err)
	}
	msg := fmt.Sprintf("signed a certificate for node %s: serial %x, valid until %s, CA %s", node, cert.SerialNumber, cert.NotAfter.UTC().Format(time.RFC3339), ca.Cert.Subject.CommonName)
	log.Info(msg)
	s.r.Recorder.Event(csr, corev1.EventTypeNormal, ReasonCSRIssued, msg)
	return ctrl.Result{}, nil
}

// currentCA is the CA in Secret qvirt-ca and its trust bundle; nil when there is none usable
// (missing or corrupt: the certificate reconciler repairs it and the request is looked at again).
func (s *signer) currentCA(ctx context.Context, now time.Time) (*qcerts.Pair, []*x509.Certificate, error) {
	sec, err := s.r.get(ctx, qcerts.CASecret)
	if err != nil || sec == nil {
		return nil, nil, err
	}
	v := qcerts.CheckCA(sec.Data[qcerts.KeyCert], sec.Data[qcerts.KeyPrivate], now)
	if v.Pair == nil || v.Reason == qcerts.Corrupt || !now.Before(v.Pair.Cert.NotAfter) {
		return nil, nil, nil
	}
	bundle, err := qcerts.DecodeCerts(sec.Data[qcerts.KeyCA])
	if err != nil {
		return nil, nil, nil
	}
	return v.Pair, bundle, nil
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, typ certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == typ && c.Status != corev1.ConditionFalse {
			return true
		}
	}
	return false
}
