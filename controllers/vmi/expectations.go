package vmi

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// DefaultExpectationTTL is how long a launcher pod creation may stay unseen by the informer before
// the reconciler stops waiting for it (the create may have been lost with a watch, or the pod may
// have been deleted before the cache ever saw it).
const DefaultExpectationTTL = 30 * time.Second

// Expectations records launcher pod creations the informer has not shown yet, keyed by VMI UID, as
// KubeVirt and the ReplicaSet controller do. Without it a reconcile that runs between Create and the
// informer's add event (the VMI's own status update triggers one) would read "no pod" from the cache
// and create a second pod. The reconciler records an expectation before Create, drops it when Create
// fails or when its cache holds a pod with the VMI's UID label, and does nothing while one is in
// flight. It lives in memory: a new controller process starts with none, and its informers have
// synced before any reconcile, so it sees every pod created before it started.
//
// Safe for concurrent use.
type Expectations struct {
	ttl     time.Duration
	now     func() time.Time
	mu      sync.Mutex
	pending map[types.UID]time.Time
}

// NewExpectations returns empty expectations that expire after ttl.
func NewExpectations(ttl time.Duration) *Expectations {
	return &Expectations{ttl: ttl, now: time.Now, pending: map[types.UID]time.Time{}}
}

// ExpectCreate records that a launcher pod for the VMI is about to be created.
func (e *Expectations) ExpectCreate(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pending[uid] = e.now()
}

// Observed drops the VMI's expectation: its pod has been seen, or the create failed, or the VMI is
// gone.
func (e *Expectations) Observed(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.pending, uid)
}

// Satisfied reports whether no creation is in flight for the VMI; when one is, wait is how long
// until it expires. An expired expectation is dropped.
func (e *Expectations) Satisfied(uid types.UID) (ok bool, wait time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	at, found := e.pending[uid]
	if !found {
		return true, 0
	}
	if left := e.ttl - e.now().Sub(at); left > 0 {
		return false, left
	}
	delete(e.pending, uid)
	return true, 0
}

// Len is the number of creations in flight.
func (e *Expectations) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.pending)
}
