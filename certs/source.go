package certs

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Source is a Provider backed by one Secret (tls.crt, tls.key, ca.crt), watched with an informer
// whose list and watch carry the field selector metadata.name=NAME in the Secret's namespace:
// the API server sends that Secret only, and RBAC may limit the reader to it (a Role rule with
// resourceNames: [NAME] and verbs get, list, watch).
//
// A Secret that does not parse, or is deleted, leaves the last good material in place (the
// controller repairs or recreates it); Err says what is wrong. Start runs the watch until its
// context ends; Source is a controller-runtime manager.Runnable that needs no leader election,
// or can be started standalone. Safe for concurrent use.
type Source struct {
	client          kubernetes.Interface
	namespace, name string
	held            *holder[*Material]
}

// NewSource watches the Secret namespace/name through c once Start runs.
func NewSource(c kubernetes.Interface, namespace, name string) *Source {
	return &Source{client: c, namespace: namespace, name: name,
		held: newHolder[*Material](&SecretError{Namespace: namespace, Name: name, Err: errors.New("not read yet")})}
}

// String names the Secret.
func (s *Source) String() string { return s.namespace + "/" + s.name }

// NeedLeaderElection is false: every replica needs its certificates.
func (s *Source) NeedLeaderElection() bool { return false }

// Start watches the Secret until ctx ends; it logs through the context's logr logger (which
// controller-runtime's manager provides).
func (s *Source) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("secret", s.String())
	secrets := s.client.CoreV1().Secrets(s.namespace)
	watchNamed(ctx, s.name, &corev1.Secret{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return secrets.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return secrets.Watch(ctx, o) },
		func(obj any) { s.observe(log, obj) },
		func() {
			log.Info("Secret deleted; keeping the certificates read last until it is recreated")
			s.held.fail(&SecretError{Namespace: s.namespace, Name: s.name, Err: errors.New("deleted")})
		})
	return nil
}

func (s *Source) observe(log logr.Logger, obj any) {
	sec, ok := obj.(*corev1.Secret)
	if !ok || sec.Name != s.name {
		return
	}
	m, err := ParseMaterial(sec.Data)
	if err != nil {
		err = &SecretError{Namespace: s.namespace, Name: s.name, Err: err}
		log.Error(err, "keeping the certificates read last", "resourceVersion", sec.ResourceVersion)
		s.held.fail(err)
		return
	}
	s.held.set(m)
	log.Info("loaded certificates", "resourceVersion", sec.ResourceVersion, "subject", m.Leaf().Subject.CommonName,
		"serial", fmt.Sprintf("%x", m.Leaf().SerialNumber), "notAfter", m.Leaf().NotAfter, "trustedCAs", len(m.CAs))
}

// Current is the last good material. Before any was read it returns an error naming the Secret.
func (s *Source) Current() (*Material, error) { return s.held.current() }

// Err is what is wrong with the Secret now (deleted, a key that does not parse), nil when its
// latest version was loaded. Current keeps returning the last good material meanwhile.
func (s *Source) Err() error { return s.held.problem() }

// Changed is closed when new material is loaded after the call; call it again for the next.
func (s *Source) Changed() <-chan struct{} { return s.held.changedCh() }

// WaitReady blocks until the first good material is loaded or ctx ends.
func (s *Source) WaitReady(ctx context.Context) error {
	if err := s.held.waitReady(ctx); err != nil {
		return fmt.Errorf("wait for Secret %s: %w", s, err)
	}
	return nil
}

// Bundle is a trust bundle: CAs, current first, and the same in a pool.
type Bundle struct {
	CAs  []*x509.Certificate
	Pool *x509.CertPool
}

// BundleSource is the trust bundle of a ConfigMap's key ca.crt (BundleConfigMap), watched as
// Source watches its Secret (field selector on the name; the last good bundle stays when the
// ConfigMap is deleted or does not parse). Safe for concurrent use; a manager.Runnable.
type BundleSource struct {
	client          kubernetes.Interface
	namespace, name string
	held            *holder[*Bundle]
}

// NewBundleSource watches the ConfigMap namespace/name through c once Start runs.
func NewBundleSource(c kubernetes.Interface, namespace, name string) *BundleSource {
	return &BundleSource{client: c, namespace: namespace, name: name,
		held: newHolder[*Bundle](fmt.Errorf("ConfigMap %s/%s: not read yet", namespace, name))}
}

// String names the ConfigMap.
func (b *BundleSource) String() string { return b.namespace + "/" + b.name }

// NeedLeaderElection is false: every replica needs the bundle.
func (b *BundleSource) NeedLeaderElection() bool { return false }

// Start watches the ConfigMap until ctx ends.
func (b *BundleSource) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("configMap", b.String())
	cms := b.client.CoreV1().ConfigMaps(b.namespace)
	watchNamed(ctx, b.name, &corev1.ConfigMap{},
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return cms.List(ctx, o) },
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return cms.Watch(ctx, o) },
		func(obj any) { b.observe(log, obj) },
		func() {
			log.Info("ConfigMap deleted; keeping the trust bundle read last until it is recreated")
			b.held.fail(fmt.Errorf("ConfigMap %s: deleted", b))
		})
	return nil
}

func (b *BundleSource) observe(log logr.Logger, obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok || cm.Name != b.name {
		return
	}
	cas, err := DecodeCerts([]byte(cm.Data[KeyCA]))
	if err != nil {
		err = fmt.Errorf("ConfigMap %s key %s: %w", b, KeyCA, err)
		log.Error(err, "keeping the trust bundle read last", "resourceVersion", cm.ResourceVersion)
		b.held.fail(err)
		return
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	b.held.set(&Bundle{CAs: cas, Pool: pool})
	log.Info("loaded the trust bundle", "resourceVersion", cm.ResourceVersion, "trustedCAs", len(cas))
}

// Current is the last good bundle; before any was read, an error naming the ConfigMap.
func (b *BundleSource) Current() (*Bundle, error) { return b.held.current() }

// Changed is closed when a new bundle is loaded after the call.
func (b *BundleSource) Changed() <-chan struct{} { return b.held.changedCh() }

// WaitReady blocks until the first good bundle is loaded or ctx ends.
func (b *BundleSource) WaitReady(ctx context.Context) error {
	if err := b.held.waitReady(ctx); err != nil {
		return fmt.Errorf("wait for ConfigMap %s: %w", b, err)
	}
	return nil
}

// watchNamed runs an informer on the one object called name that list and watch reach (both get
// the field selector metadata.name=name) until ctx ends.
func watchNamed(ctx context.Context, name string, objType runtime.Object,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
	onObject func(any), onDelete func()) {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return watchFn(ctx, o)
		},
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    objType,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    onObject,
			UpdateFunc: func(_, obj any) { onObject(obj) },
			DeleteFunc: func(any) { onDelete() },
		},
	})
	ctrl.RunWithContext(ctx)
}

// holder keeps the last good value read from a watched object and what is wrong with it now.
// Safe for concurrent use.
type holder[T any] struct {
	ready     chan struct{}
	readyOnce sync.Once

	mu      sync.RWMutex
	value   T
	has     bool
	err     error
	changed chan struct{} // closed and replaced on every new value
}

func newHolder[T any](notYet error) *holder[T] {
	return &holder[T]{ready: make(chan struct{}), changed: make(chan struct{}), err: notYet}
}

func (h *holder[T]) set(v T) {
	h.mu.Lock()
	h.value, h.has, h.err = v, true, nil
	close(h.changed)
	h.changed = make(chan struct{})
	h.mu.Unlock()
	h.readyOnce.Do(func() { close(h.ready) })
}

func (h *holder[T]) fail(err error) {
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

func (h *holder[T]) current() (T, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if !h.has {
		var zero T
		return zero, h.err
	}
	return h.value, nil
}

func (h *holder[T]) problem() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.err
}

func (h *holder[T]) changedCh() <-chan struct{} {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h.changed
}

func (h *holder[T]) waitReady(ctx context.Context) error {
	select {
	case <-h.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w (last problem: %v)", ctx.Err(), h.problem())
	}
}
