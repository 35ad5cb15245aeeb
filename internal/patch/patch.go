// Package patch is the plumbing of the one reconcile skeleton every qvirt reconciler follows, the
// cluster controller's and the node agent's alike: ensure a finalizer, write the status a pass
// computed, set conditions that say which generation they describe, and one policy for a write that
// lost an optimistic-lock race. It lives outside controllers/ because the node agent (handler/)
// must not import controllers/.
//
// The skeleton (cluster-api's):
//
//	func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
//		obj := &v1alpha1.VirtualMachine{}
//		if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
//			return ctrl.Result{}, client.IgnoreNotFound(err)
//		}
//		if err := patch.AddFinalizer(ctx, r.Client, obj, Finalizer); err != nil {
//			return patch.Result(ctrl.Result{}, err)
//		}
//		status := patch.NewStatus(r.Client, obj)
//		defer func() { res, err = status.Finish(ctx, obj, res, err) }()
//		if !obj.DeletionTimestamp.IsZero() {
//			return r.reconcileDelete(ctx, obj)
//		}
//		return r.reconcileNormal(ctx, obj)
//	}
//
// The conflict policy: every write here carries an optimistic lock (the resourceVersion the pass
// read), so a pass that decided on a stale read cannot overwrite what others wrote since. Losing
// that race is not a failure, only a stale read: Result turns it into a quiet requeue after
// ConflictRequeue, with no error logged and no back-off. The requeue does not rely on a watch event
// of the newer version, which a predicate may filter out or which may belong to another object.
//
// A reconciler whose own status writes queue it again (its pass outruns its cache) may keep a
// Superseded: it takes its snapshots with Superseded.NewStatus and, right after the Get, stops a
// pass that Superseded.Read calls stale, which spares the write that would lose.
package patch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// ConflictRequeue is how soon a pass that lost an optimistic-lock race runs again: long enough for
// the cache to catch up with the newer version, short enough that nobody waits for it.
const ConflictRequeue = 100 * time.Millisecond

// Result applies the conflict policy to what a pass returns. An error made only of conflicts
// (however wrapped, joined or aggregated) becomes a requeue after at most ConflictRequeue and no
// error; any other error is returned as it is, with an empty result (controller-runtime ignores a
// result returned with an error, and warns about it).
func Result(res ctrl.Result, err error) (ctrl.Result, error) {
	if err == nil {
		return res, nil
	}
	if !onlyConflicts(err) {
		return ctrl.Result{}, err
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter > ConflictRequeue {
		res.RequeueAfter = ConflictRequeue
	}
	return res, nil
}

// onlyConflicts reports whether every error err is made of is an API conflict. A single conflict
// joined with another failure is a failure: the other error must be seen and backed off from.
func onlyConflicts(err error) bool {
	if _, ok := err.(apierrors.APIStatus); ok {
		return apierrors.IsConflict(err)
	}
	switch e := err.(type) {
	case interface{ Unwrap() []error }:
		return allConflicts(e.Unwrap())
	case kerrors.Aggregate:
		// apimachinery's aggregate does not unwrap for errors.As.
		return allConflicts(e.Errors())
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			return onlyConflicts(inner)
		}
	}
	return false
}

func allConflicts(errs []error) bool {
	n := 0
	for _, err := range errs {
		if err == nil {
			continue
		}
		if !onlyConflicts(err) {
			return false
		}
		n++
	}
	return n > 0
}

// AddFinalizer adds finalizer to obj unless obj has it already or is being deleted (the API server
// refuses new finalizers then). It sends a merge patch under obj's resourceVersion, not an update,
// so it touches nothing but the finalizer list, and refreshes obj from the answer: take the status
// snapshot (NewStatus) after it.
func AddFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) error {
	if !obj.GetDeletionTimestamp().IsZero() || controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	base := obj.DeepCopyObject().(client.Object)
	controllerutil.AddFinalizer(obj, finalizer)
	if err := c.Patch(ctx, obj, lockedMergeFrom(base)); err != nil {
		return fmt.Errorf("add finalizer %s to %s: %w", finalizer, key(obj), err)
	}
	return nil
}

// RemoveFinalizer removes finalizer from obj, with the same patch and lock as AddFinalizer. An
// object already gone is no error: letting it go is what the removal was for. Remove a finalizer
// after the status patch, whose lock is the snapshot's resourceVersion.
func RemoveFinalizer(ctx context.Context, c client.Client, obj client.Object, finalizer string) error {
	if !controllerutil.ContainsFinalizer(obj, finalizer) {
		return nil
	}
	base := obj.DeepCopyObject().(client.Object)
	controllerutil.RemoveFinalizer(obj, finalizer)
	if err := c.Patch(ctx, obj, lockedMergeFrom(base)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("remove finalizer %s from %s: %w", finalizer, key(obj), err)
	}
	return nil
}

// Status is an object as a pass read it, the base of the status patch written at the pass's end.
// It is not safe for concurrent use; a pass owns its own.
type Status struct {
	c    client.Client
	base client.Object
	// baseStatus is base's status as JSON, made at the first diff.
	baseStatus []byte
	// superseded, when set, records each version this status's writes replace.
	superseded *Superseded
}

// Superseded remembers, per object, the resourceVersion that a reconciler's last status write
// replaced. A pass that reads that version again reads a cache that has not seen the write yet:
// whatever it decided, its own write would lose with a conflict, a wasted request and a wasted
// pass. Such a pass stops at once instead (Stale); the write's watch event, or the requeue, brings
// the object back. The zero value is ready; safe for concurrent use.
type Superseded struct {
	mu       sync.Mutex
	replaced map[types.NamespacedName]string
}

// NewStatus is NewStatus whose writes are recorded here.
func (s *Superseded) NewStatus(c client.Client, obj client.Object) *Status {
	st := NewStatus(c, obj)
	st.superseded = s
	return st
}

// Read takes what the pass's Get of key into obj returned, and reports whether obj is stale: a
// version that a status write recorded here replaced, in which case the pass returns StaleResult.
// An object gone, or read at any other version, ends the record.
func (s *Superseded) Read(key types.NamespacedName, obj client.Object, getErr error) (stale bool) {
	if apierrors.IsNotFound(getErr) {
		s.forget(key)
	}
	return getErr == nil && s.stale(obj)
}

func (s *Superseded) stale(obj client.Object) bool {
	key := client.ObjectKeyFromObject(obj)
	s.mu.Lock()
	defer s.mu.Unlock()
	rv, ok := s.replaced[key]
	if ok && rv == obj.GetResourceVersion() {
		return true
	}
	delete(s.replaced, key)
	return false
}

func (s *Superseded) forget(key types.NamespacedName) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.replaced, key)
}

func (s *Superseded) wrote(key types.NamespacedName, replaced string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.replaced == nil {
		s.replaced = map[types.NamespacedName]string{}
	}
	s.replaced[key] = replaced
}

// StaleResult is what a pass returns when it read a superseded version: it runs again once the
// cache has caught up, as after a conflict, without relying on a watch event.
func StaleResult() ctrl.Result { return ctrl.Result{RequeueAfter: ConflictRequeue} }

// NewStatus snapshots obj. Take it before the pass changes obj's status, and after any patch of
// obj's metadata (AddFinalizer): the status patch is locked on the snapshot's resourceVersion.
func NewStatus(c client.Client, obj client.Object) *Status {
	return &Status{c: c, base: obj.DeepCopyObject().(client.Object)}
}

// Changed reports whether obj's status differs from the snapshot as the API server would store it:
// the two are compared in their JSON form, so a nil and an empty list, or two times within the
// same second, are the same status.
func (s *Status) Changed(obj client.Object) (bool, error) {
	diff, err := s.diff(obj)
	return diff != nil, err
}

// diff is the merge patch of obj's status against the snapshot's; nil when they are the same. It
// is the "status" member of the whole object's merge patch (client.MergeFrom), made from the two
// statuses alone: marshalling and diffing whole objects, their specs and metadata too, was most of
// the CPU a status write cost (BenchmarkStatusDiff).
func (s *Status) diff(obj client.Object) (json.RawMessage, error) {
	cur, ok, err := statusJSON(obj)
	if err != nil {
		return nil, fmt.Errorf("diff status of %s: %w", key(obj), err)
	}
	if s.baseStatus == nil && ok {
		if s.baseStatus, ok, err = statusJSON(s.base); err != nil {
			return nil, fmt.Errorf("diff status of %s: %w", key(obj), err)
		}
	}
	if !ok {
		return s.wholeDiff(obj)
	}
	data, err := jsonpatch.CreateMergePatch(s.baseStatus, cur)
	if err != nil {
		return nil, fmt.Errorf("diff status of %s: %w", key(obj), err)
	}
	if string(data) == "{}" {
		return nil, nil
	}
	return data, nil
}

// statusJSON is obj's status as JSON: its own Status struct field, marshalled under the JSON key
// "status". ok is false for any other object (a ConfigMap, an Unstructured), which the whole
// object's diff handles.
func statusJSON(obj client.Object) (data []byte, ok bool, err error) {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return nil, false, nil
	}
	sf, found := v.Elem().Type().FieldByName("Status")
	if !found || len(sf.Index) != 1 || sf.Type.Kind() != reflect.Struct {
		return nil, false, nil
	}
	if name, _, _ := strings.Cut(sf.Tag.Get("json"), ","); name != "status" {
		return nil, false, nil
	}
	// Through its address, so a MarshalJSON on a pointer receiver runs as in the whole object.
	data, err = json.Marshal(v.Elem().Field(sf.Index[0]).Addr().Interface())
	return data, err == nil, err
}

// wholeDiff is diff for an object without a Status struct: the "status" member of the whole
// object's merge patch.
func (s *Status) wholeDiff(obj client.Object) (json.RawMessage, error) {
	data, err := client.MergeFrom(s.base).Data(obj)
	if err != nil {
		return nil, fmt.Errorf("diff status of %s: %w", key(obj), err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, fmt.Errorf("diff status of %s: %w", key(obj), err)
	}
	return fields["status"], nil
}

// Patch writes obj's status to the status subresource when it changed since the snapshot: a merge
// patch locked on the snapshot's resourceVersion, so a pass that decided on a stale read loses
// with a conflict (see Result) instead of overwriting a newer status. It refreshes obj from the
// answer and reports whether it wrote. Errors, NotFound included, are returned wrapped.
func (s *Status) Patch(ctx context.Context, obj client.Object) (patched bool, err error) {
	diff, err := s.diff(obj)
	if err != nil || diff == nil {
		return false, err
	}
	// The diff made above is the patch, locked as MergeFromWithOptimisticLock locks (diffing the
	// whole object a second time doubled the cost of a status write).
	data, err := json.Marshal(lockedStatusPatch{Metadata: lock{ResourceVersion: s.base.GetResourceVersion()}, Status: diff})
	if err != nil {
		return false, fmt.Errorf("patch status of %s: %w", key(obj), err)
	}
	if err := s.c.Status().Patch(ctx, obj, client.RawPatch(types.MergePatchType, data)); err != nil {
		return false, fmt.Errorf("patch status of %s: %w", key(obj), err)
	}
	// A write the API server stored as no change (a field its schema prunes, say) keeps the
	// version and sends no event: recording it would stop every later pass for good.
	if s.superseded != nil && obj.GetResourceVersion() != s.base.GetResourceVersion() {
		s.superseded.wrote(client.ObjectKeyFromObject(s.base), s.base.GetResourceVersion())
	}
	return true, nil
}

// Finish ends a pass, deferred from Reconcile: it patches obj's status (an object gone meanwhile
// has nothing left to record), joins a failure to the pass's error and applies Result.
func (s *Status) Finish(ctx context.Context, obj client.Object, res ctrl.Result, err error) (ctrl.Result, error) {
	_, perr := s.Patch(ctx, obj)
	return Result(res, errors.Join(err, client.IgnoreNotFound(perr)))
}

// SetCondition sets c in conditions with ObservedGeneration set to obj's generation, so that a
// reader can tell a condition about the current spec from one about an older spec.
// meta.SetStatusCondition merges: LastTransitionTime (c's, or now when c's is zero) changes only
// with the status. It reports whether the conditions changed.
func SetCondition(conditions *[]metav1.Condition, obj metav1.Object, c metav1.Condition) bool {
	c.ObservedGeneration = obj.GetGeneration()
	return meta.SetStatusCondition(conditions, c)
}

// lockedStatusPatch is a merge patch of the status that the API server applies only to the
// resourceVersion it names (a conflict otherwise).
type lockedStatusPatch struct {
	Metadata lock            `json:"metadata"`
	Status   json.RawMessage `json:"status"`
}

type lock struct {
	ResourceVersion string `json:"resourceVersion"`
}

func lockedMergeFrom(base client.Object) client.Patch {
	return client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})
}

// key names obj in errors: namespace/name, or the name of a cluster-scoped object.
func key(obj client.Object) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}
