package patch_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/patch"
	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

const (
	testFinalizer = "test.qvirt.io/hold"
	condStamped   = "Stamped"
)

// newNamespace creates a namespace for one test and removes it afterwards.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "patch-"}}
	if err := cp.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// newMigration creates a migration object: the smallest qvirt kind with a status subresource.
func newMigration(t *testing.T, ns, name string) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	m := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vmi"},
	}
	if err := cp.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

// annotate is someone else's write: it moves the resourceVersion and nothing else.
func annotate(ctx context.Context, c client.Client, m *v1alpha1.VirtualMachineInstanceMigration, value string) error {
	fresh := &v1alpha1.VirtualMachineInstanceMigration{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), fresh); err != nil {
		return err
	}
	base := fresh.DeepCopy()
	fresh.Annotations = map[string]string{"test.qvirt.io/touched": value}
	return c.Patch(ctx, fresh, client.MergeFrom(base))
}

func stamp(m *v1alpha1.VirtualMachineInstanceMigration) {
	patch.SetCondition(&m.Status.Conditions, m, metav1.Condition{Type: condStamped, Status: metav1.ConditionTrue, Reason: "Stamped"})
}

// TestStaleStatusPatch: a status patch from a stale read loses with a conflict, overwrites nothing,
// and Finish turns it into a quiet requeue; the next pass, from a fresh read, writes.
func TestStaleStatusPatch(t *testing.T) {
	ctx := context.Background()
	c := cp.Client
	m := newMigration(t, newNamespace(t), "m")

	stale := m.DeepCopy()
	if err := annotate(ctx, c, m, "1"); err != nil {
		t.Fatal(err)
	}
	status := patch.NewStatus(c, stale)
	stamp(stale)
	res, err := status.Finish(ctx, stale, ctrl.Result{}, nil)
	if err != nil || res.RequeueAfter != patch.ConflictRequeue {
		t.Fatalf("stale pass: result %+v error %v, want a requeue after %s and no error", res, err, patch.ConflictRequeue)
	}
	if _, err := patch.NewStatus(c, m).Patch(ctx, stale); !apierrors.IsConflict(err) {
		t.Errorf("Patch from the stale read: %v, want a conflict", err)
	}

	fresh := &v1alpha1.VirtualMachineInstanceMigration{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), fresh); err != nil {
		t.Fatal(err)
	}
	if meta.FindStatusCondition(fresh.Status.Conditions, condStamped) != nil {
		t.Fatal("the stale pass wrote its status")
	}
	status = patch.NewStatus(c, fresh)
	stamp(fresh)
	patched, err := status.Patch(ctx, fresh)
	if err != nil || !patched {
		t.Fatalf("fresh pass: patched %v error %v", patched, err)
	}
	if patched, err := patch.NewStatus(c, fresh).Patch(ctx, fresh); err != nil || patched {
		t.Errorf("unchanged status: patched %v error %v, want no write", patched, err)
	}
	c0 := meta.FindStatusCondition(fresh.Status.Conditions, condStamped)
	if c0 == nil || c0.ObservedGeneration != fresh.Generation || fresh.Generation == 0 {
		t.Errorf("condition %+v after the patch, want observedGeneration %d", c0, fresh.Generation)
	}
}

// TestSupersededReadStops: after a status write, a read of the version it replaced (a cache that has
// not seen the write) is stale, and its pass would have lost with a conflict; a read of a newer
// version is not, and ends the record. Another reconciler's record is its own.
func TestSupersededReadStops(t *testing.T) {
	ctx := context.Background()
	c := cp.Client
	m := newMigration(t, newNamespace(t), "m")
	var written, other patch.Superseded
	cached := m.DeepCopy() // what a cache still holds after the write below
	if written.Read(client.ObjectKeyFromObject(cached), cached, nil) {
		t.Fatal("nothing written yet, and the read is stale")
	}

	status := written.NewStatus(c, m)
	stamp(m)
	if patched, err := status.Patch(ctx, m); err != nil || !patched {
		t.Fatalf("write: patched %v error %v", patched, err)
	}
	if !written.Read(client.ObjectKeyFromObject(cached), cached, nil) {
		t.Error("the version the write replaced is not stale")
	}
	if _, err := patch.NewStatus(c, cached).Patch(ctx, withStamp(cached)); !apierrors.IsConflict(err) {
		t.Errorf("a write from that version: %v, want the conflict Stale spares", err)
	}
	if other.Read(client.ObjectKeyFromObject(cached), cached, nil) {
		t.Error("another reconciler's record says stale")
	}
	if written.Read(client.ObjectKeyFromObject(m), m, nil) {
		t.Fatalf("the written version %s is stale", m.ResourceVersion)
	}
	if written.Read(client.ObjectKeyFromObject(cached), cached, nil) {
		t.Error("stale still after a newer version was read: the record outlived the cache's catching up")
	}
}

func withStamp(m *v1alpha1.VirtualMachineInstanceMigration) *v1alpha1.VirtualMachineInstanceMigration {
	m = m.DeepCopy()
	stamp(m)
	return m
}

// TestFinalizers: added and removed by patch under the read's resourceVersion; a stale read
// conflicts; removal from a gone object is no error.
func TestFinalizers(t *testing.T) {
	ctx := context.Background()
	c := cp.Client
	m := newMigration(t, newNamespace(t), "m")

	stale := m.DeepCopy()
	if err := annotate(ctx, c, m, "1"); err != nil {
		t.Fatal(err)
	}
	err := patch.AddFinalizer(ctx, c, stale, testFinalizer)
	if !apierrors.IsConflict(err) {
		t.Fatalf("AddFinalizer from a stale read: %v, want a conflict", err)
	}
	if res, err := patch.Result(ctrl.Result{}, err); err != nil || res.RequeueAfter == 0 {
		t.Errorf("Result of the conflict: %+v %v, want a requeue", res, err)
	}

	if err := c.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatal(err)
	}
	if err := patch.AddFinalizer(ctx, c, m, testFinalizer); err != nil {
		t.Fatal(err)
	}
	rv := m.ResourceVersion
	if err := patch.AddFinalizer(ctx, c, m, testFinalizer); err != nil || m.ResourceVersion != rv {
		t.Errorf("second AddFinalizer: %v, resourceVersion %s → %s; want no write", err, rv, m.ResourceVersion)
	}
	if err := c.Delete(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), m); err != nil {
		t.Fatalf("the finalizer did not hold the object: %v", err)
	}
	gone := m.DeepCopy()
	if err := patch.RemoveFinalizer(ctx, c, m, testFinalizer); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), &v1alpha1.VirtualMachineInstanceMigration{}); !apierrors.IsNotFound(err) {
		t.Errorf("after RemoveFinalizer: %v, want the object gone", err)
	}
	if err := patch.RemoveFinalizer(ctx, c, gone, testFinalizer); err != nil {
		t.Errorf("RemoveFinalizer of a gone object: %v, want nil", err)
	}
}

// stamper is a reconciler on the skeleton. On its first pass someone else writes the object
// between the read and the status patch, so the patch conflicts. That write (an annotation) is
// filtered out by the controller's predicate, as are the finalizer and the status writes: no
// watch event brings the object back, only the result of the pass can.
type stamper struct {
	client client.Client
	// policy turns a pass's outcome into what Reconcile returns: patch.Result, or a stand-in.
	policy    func(ctrl.Result, error) (ctrl.Result, error)
	interfere atomic.Bool
	passes    atomic.Int32
	errors    atomic.Int32
}

func (r *stamper) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	r.passes.Add(1)
	defer func() {
		if err != nil {
			r.errors.Add(1)
		}
	}()
	m := &v1alpha1.VirtualMachineInstanceMigration{}
	if err := r.client.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if err := patch.AddFinalizer(ctx, r.client, m, testFinalizer); err != nil {
		return r.policy(ctrl.Result{}, err)
	}
	status := patch.NewStatus(r.client, m)
	defer func() {
		_, perr := status.Patch(ctx, m)
		res, err = r.policy(res, perr)
	}()
	if r.interfere.CompareAndSwap(true, false) {
		if err := annotate(ctx, cp.Client, m, "racing writer"); err != nil {
			return ctrl.Result{}, fmt.Errorf("interfere: %w", err)
		}
	}
	stamp(m)
	return ctrl.Result{}, nil
}

// TestConflictRequeues runs the skeleton in a manager: the pass that loses the race returns no
// error and is requeued, and the next pass writes the status. A policy that drops the conflict
// (as some reconcilers did) leaves the status unwritten for good.
func TestConflictRequeues(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	ns := newNamespace(t)
	dropConflicts := func(res ctrl.Result, err error) (ctrl.Result, error) {
		if apierrors.IsConflict(err) {
			return ctrl.Result{}, nil
		}
		return res, err
	}
	for _, tc := range []struct {
		name        string
		policy      func(ctrl.Result, error) (ctrl.Result, error)
		wantStamped bool
	}{
		{"requeue", patch.Result, true},
		{"drop", dropConflicts, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &stamper{policy: tc.policy}
			r.interfere.Store(true)
			stop := startManager(t, ns, tc.name, r)
			defer stop()

			m := newMigration(t, ns, tc.name)
			stamped := waitStamped(t, m, 3*time.Second)
			if stamped != tc.wantStamped {
				t.Errorf("stamped %v after %d passes, want %v", stamped, r.passes.Load(), tc.wantStamped)
			}
			if r.interfere.Load() {
				t.Error("the racing write never happened")
			}
			if n := r.errors.Load(); n != 0 {
				t.Errorf("%d passes returned an error, want none", n)
			}
			if tc.wantStamped && r.passes.Load() < 2 {
				t.Errorf("%d passes, want the conflicting one and a requeued one", r.passes.Load())
			}
		})
	}
}

// startManager runs r for the migrations named name in ns, with a predicate that passes creations
// and spec changes only.
func startManager(t *testing.T, ns, name string, r *stamper) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(cp.Config, cp.ManagerOptions())
	if err != nil {
		t.Fatal(err)
	}
	r.client = mgr.GetClient()
	only := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetNamespace() == ns && o.GetName() == name })
	err = ctrl.NewControllerManagedBy(mgr).Named("stamper-"+name).
		For(&v1alpha1.VirtualMachineInstanceMigration{}, builder.WithPredicates(only, predicate.GenerationChangedPredicate{})).
		Complete(r)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
}

// waitStamped reports whether m gets the Stamped condition within d.
func waitStamped(t *testing.T, m *v1alpha1.VirtualMachineInstanceMigration, d time.Duration) bool {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		got := &v1alpha1.VirtualMachineInstanceMigration{}
		if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(m), got); err != nil {
			t.Fatal(err)
		}
		if meta.IsStatusConditionTrue(got.Status.Conditions, condStamped) {
			return true
		}
	}
	return false
}
