package certs

import (
	"context"
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

	ready     chan struct{}
	readyOnce sync.Once

	mu      sync.RWMutex
	current *Material
	err     error
	changed chan struct{} // closed and replaced on every new material
}

// NewSource watches the Secret namespace/name through c once Start runs.
func NewSource(c kubernetes.Interface, namespace, name string) *Source {
	return &Source{
		client: c, namespace: namespace, name: name,
		ready: make(chan struct{}), changed: make(chan struct{}),
		err: &SecretError{Namespace: namespace, Name: name, Err: errors.New("not read yet")},
	}
}

// String names the Secret.
func (s *Source) String() string { return s.namespace + "/" + s.name }

// NeedLeaderElection is false: every replica needs its certificates.
func (s *Source) NeedLeaderElection() bool { return false }

// Start watches the Secret until ctx ends; it logs through the context's logr logger (which
// controller-runtime's manager provides).
func (s *Source) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("secret", s.String())
	sel := fields.OneTermEqualSelector("metadata.name", s.name).String()
	secrets := s.client.CoreV1().Secrets(s.namespace)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return secrets.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return secrets.Watch(ctx, o)
		},
	}
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Secret{},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { s.observe(log, obj) },
			UpdateFunc: func(_, obj any) { s.observe(log, obj) },
			DeleteFunc: func(any) {
				log.Info("Secret deleted; keeping the certificates read last until it is recreated")
				s.fail(&SecretError{Namespace: s.namespace, Name: s.name, Err: errors.New("deleted")})
			},
		},
	})
	ctrl.RunWithContext(ctx)
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
		s.fail(err)
		return
	}
	s.mu.Lock()
	s.current, s.err = m, nil
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
	s.readyOnce.Do(func() { close(s.ready) })
	log.Info("loaded certificates", "resourceVersion", sec.ResourceVersion, "subject", m.Leaf().Subject.CommonName,
		"serial", fmt.Sprintf("%x", m.Leaf().SerialNumber), "notAfter", m.Leaf().NotAfter, "trustedCAs", len(m.CAs))
}

func (s *Source) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// Current is the last good material. Before any was read it returns an error naming the Secret.
func (s *Source) Current() (*Material, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.current == nil {
		return nil, s.err
	}
	return s.current, nil
}

// Err is what is wrong with the Secret now (deleted, a key that does not parse), nil when its
// latest version was loaded. Current keeps returning the last good material meanwhile.
func (s *Source) Err() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.err
}

// Changed is closed when new material is loaded after the call; call it again for the next.
func (s *Source) Changed() <-chan struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.changed
}

// WaitReady blocks until the first good material is loaded or ctx ends.
func (s *Source) WaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for Secret %s: %w (last problem: %v)", s, ctx.Err(), s.Err())
	}
}
