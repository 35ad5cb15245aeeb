package patch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

var (
	gr       = schema.GroupResource{Group: "qvirt.io", Resource: "virtualmachines"}
	conflict = apierrors.NewConflict(gr, "vm1", errors.New("the object has been modified"))
	notFound = apierrors.NewNotFound(gr, "vm1")
	errPlain = errors.New("connection refused")
)

func TestResult(t *testing.T) {
	requeue := ctrl.Result{RequeueAfter: ConflictRequeue}
	for name, tc := range map[string]struct {
		res     ctrl.Result
		err     error
		want    ctrl.Result
		wantErr error
	}{
		"success keeps the result":   {res: ctrl.Result{RequeueAfter: 5 * time.Second}, want: ctrl.Result{RequeueAfter: 5 * time.Second}},
		"success without requeue":    {},
		"a conflict requeues":        {err: conflict, want: requeue},
		"a wrapped conflict":         {err: fmt.Errorf("patch status of ns/vm1: %w", conflict), want: requeue},
		"joined conflicts":           {err: errors.Join(conflict, fmt.Errorf("add finalizer: %w", conflict)), want: requeue},
		"aggregated conflicts":       {err: kerrors.NewAggregate([]error{conflict, fmt.Errorf("x: %w", conflict)}), want: requeue},
		"a wrapped aggregate":        {err: fmt.Errorf("fail instances: %w", kerrors.NewAggregate([]error{conflict})), want: requeue},
		"a sooner requeue is kept":   {res: ctrl.Result{RequeueAfter: 20 * time.Millisecond}, err: conflict, want: ctrl.Result{RequeueAfter: 20 * time.Millisecond}},
		"a later requeue is brought": {res: ctrl.Result{RequeueAfter: time.Minute}, err: conflict, want: requeue},
		"another error is returned":  {res: ctrl.Result{RequeueAfter: time.Second}, err: errPlain, wantErr: errPlain},
		"not found is an error":      {err: notFound, wantErr: notFound},
		"a conflict and a failure":   {err: errors.Join(conflict, errPlain), wantErr: errors.Join(conflict, errPlain)},
		"a failure and a conflict":   {err: kerrors.NewAggregate([]error{errPlain, conflict}), wantErr: kerrors.NewAggregate([]error{errPlain, conflict})},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Result(tc.res, tc.err)
			if got != tc.want {
				t.Errorf("result %+v, want %+v", got, tc.want)
			}
			if (err == nil) != (tc.wantErr == nil) || (err != nil && err.Error() != tc.wantErr.Error()) {
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestStatusChanged(t *testing.T) {
	base := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1", ResourceVersion: "7"}}
	base.Status.Phase = v1alpha1.Running
	base.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{
		{Phase: v1alpha1.Running, PhaseTransitionTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC))},
	}
	for name, tc := range map[string]struct {
		change func(v *v1alpha1.VirtualMachineInstance)
		want   bool
	}{
		"nothing":              {change: func(*v1alpha1.VirtualMachineInstance) {}, want: false},
		"the phase":            {change: func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = v1alpha1.Failed }, want: true},
		"a condition":          {change: func(v *v1alpha1.VirtualMachineInstance) { setReady(v, metav1.ConditionTrue) }, want: true},
		"metadata only":        {change: func(v *v1alpha1.VirtualMachineInstance) { v.Finalizers = []string{"x"}; v.ResourceVersion = "8" }, want: false},
		"the spec only":        {change: func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Hostname = "h" }, want: false},
		"nil vs empty list":    {change: func(v *v1alpha1.VirtualMachineInstance) { v.Status.Conditions = []metav1.Condition{} }, want: false},
		"a time, same second":  {change: func(v *v1alpha1.VirtualMachineInstance) { shiftTransition(v, 300*time.Millisecond) }, want: false},
		"a time, next second":  {change: func(v *v1alpha1.VirtualMachineInstance) { shiftTransition(v, time.Second) }, want: true},
		"a status map entry":   {change: func(v *v1alpha1.VirtualMachineInstance) { v.Status.ActivePods = map[types.UID]string{"uid": "n1"} }, want: true},
		"a cleared status key": {change: func(v *v1alpha1.VirtualMachineInstance) { v.Status.Phase = "" }, want: true},
	} {
		t.Run(name, func(t *testing.T) {
			s := NewStatus(nil, base)
			obj := base.DeepCopy()
			tc.change(obj)
			got, err := s.Changed(obj)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("changed %v, want %v", got, tc.want)
			}
			// The patch made from the statuses alone is the whole object's patch's status.
			fast, err := s.diff(obj)
			if err != nil {
				t.Fatal(err)
			}
			whole, err := s.wholeDiff(obj)
			if err != nil {
				t.Fatal(err)
			}
			if string(fast) != string(whole) {
				t.Errorf("status patch %s, the whole object's patch has status %s", fast, whole)
			}
		})
	}
}

func setReady(v *v1alpha1.VirtualMachineInstance, s metav1.ConditionStatus) {
	SetCondition(&v.Status.Conditions, v, metav1.Condition{Type: v1alpha1.VirtualMachineInstanceReady, Status: s, Reason: "R"})
}

func shiftTransition(v *v1alpha1.VirtualMachineInstance, d time.Duration) {
	ts := &v.Status.PhaseTransitionTimestamps[0].PhaseTransitionTimestamp
	*ts = metav1.NewTime(ts.Add(d))
}

func TestSetCondition(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	old := metav1.Condition{Type: "Synchronized", Status: metav1.ConditionTrue, Reason: "Synchronized", ObservedGeneration: 1, LastTransitionTime: t0}
	for name, tc := range map[string]struct {
		existing    []metav1.Condition
		generation  int64
		set         metav1.Condition
		wantChanged bool
		want        metav1.Condition
	}{
		"a new condition carries the generation": {
			generation: 3, set: metav1.Condition{Type: "Synchronized", Status: metav1.ConditionTrue, Reason: "Synchronized", LastTransitionTime: t1},
			wantChanged: true, want: metav1.Condition{Type: "Synchronized", Status: metav1.ConditionTrue, Reason: "Synchronized", ObservedGeneration: 3, LastTransitionTime: t1},
		},
		"the same status for a newer generation keeps the transition time": {
			existing: []metav1.Condition{old}, generation: 2,
			set:         metav1.Condition{Type: "Synchronized", Status: metav1.ConditionTrue, Reason: "Synchronized", LastTransitionTime: t1},
			wantChanged: true, want: metav1.Condition{Type: "Synchronized", Status: metav1.ConditionTrue, Reason: "Synchronized", ObservedGeneration: 2, LastTransitionTime: t0},
		},
		"a new status moves the transition time": {
			existing: []metav1.Condition{old}, generation: 2,
			set:         metav1.Condition{Type: "Synchronized", Status: metav1.ConditionFalse, Reason: "SyncFailed", Message: "boom", LastTransitionTime: t1},
			wantChanged: true, want: metav1.Condition{Type: "Synchronized", Status: metav1.ConditionFalse, Reason: "SyncFailed", Message: "boom", ObservedGeneration: 2, LastTransitionTime: t1},
		},
		"nothing new is no change": {
			existing: []metav1.Condition{old}, generation: 1,
			set:         metav1.Condition{Type: "Synchronized", Status: metav1.ConditionTrue, Reason: "Synchronized", ObservedGeneration: 9, LastTransitionTime: t1},
			wantChanged: false, want: old,
		},
	} {
		t.Run(name, func(t *testing.T) {
			v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Generation: tc.generation}}
			v.Status.Conditions = append([]metav1.Condition(nil), tc.existing...)
			changed := SetCondition(&v.Status.Conditions, v, tc.set)
			got := meta.FindStatusCondition(v.Status.Conditions, tc.set.Type)
			if changed != tc.wantChanged || got == nil || *got != tc.want {
				t.Errorf("changed %v, condition %+v; want %v, %+v", changed, got, tc.wantChanged, tc.want)
			}
		})
	}
}

// An object without a Status struct has its status diffed from the whole object: an Unstructured's
// status is seen, a ConfigMap (no status at all) never has one.
func TestStatusChangedWithoutStatusStruct(t *testing.T) {
	base := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "qvirt.io/v1alpha1", "kind": "VirtualMachine",
		"metadata": map[string]any{"namespace": "ns", "name": "vm1"}, "spec": map[string]any{"running": true},
		"status": map[string]any{"ready": false}}}
	for name, tc := range map[string]struct {
		change func(u *unstructured.Unstructured)
		want   bool
	}{
		"the status": {change: func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"ready": true} }, want: true},
		"the spec":   {change: func(u *unstructured.Unstructured) { u.Object["spec"] = map[string]any{"running": false} }, want: false},
	} {
		obj := base.DeepCopy()
		tc.change(obj)
		changed, err := NewStatus(nil, base).Changed(obj)
		if err != nil || changed != tc.want {
			t.Errorf("%s: changed %v (%v), want %v", name, changed, err, tc.want)
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}, Data: map[string]string{"a": "1"}}
	other := cm.DeepCopy()
	other.Data["a"] = "2"
	if changed, err := NewStatus(nil, cm).Changed(other); err != nil || changed {
		t.Errorf("ConfigMap: changed %v (%v), want false: it has no status", changed, err)
	}
}

// BenchmarkStatusDiff is the diff behind every status write, for an instance as the node agent
// writes it once its guest runs: from the statuses alone, and from the whole objects as
// client.MergeFrom makes it.
func BenchmarkStatusDiff(b *testing.B) {
	base := benchInstance()
	obj := base.DeepCopy()
	obj.Status.Phase = v1alpha1.Running
	obj.Status.Interfaces = []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "default", IP: "10.0.0.7", MAC: "52:54:00:00:00:07"}}
	setReady(obj, metav1.ConditionTrue)
	for name, diff := range map[string]func(*Status) (any, error){
		"status":       func(s *Status) (any, error) { return s.diff(obj) },
		"whole-object": func(s *Status) (any, error) { return s.wholeDiff(obj) },
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := diff(NewStatus(nil, base)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchInstance is a Scheduled instance with a spec of the size a small VM's has.
func benchInstance() *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm1", ResourceVersion: "7",
		Labels: map[string]string{"app": "web", "kubevirt.io/domain": "vm1"}, Finalizers: []string{v1alpha1.GracefulShutdownFinalizer}}}
	for i := range 3 {
		name := fmt.Sprintf("disk%d", i)
		v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: name,
			Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: name,
			VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
	}
	v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")}
	v.Status.Phase = v1alpha1.Scheduled
	v.Status.NodeName = "node-1"
	v.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{
		{Phase: v1alpha1.Scheduled, PhaseTransitionTimestamp: metav1.NewTime(time.Date(2026, 12, 1, 17, 0, 0, 0, time.UTC))},
	}
	return v
}

// A status write the API server stores as no change keeps the object's version and sends no watch
// event: recording that version as replaced would call every later read of it stale, and stop the
// object's passes for good.
func TestSupersededIgnoresAWriteThatKeptTheVersion(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m", ResourceVersion: "7"}}
	storedAsIs := interceptor.Funcs{SubResourcePatch: func(context.Context, client.Client, string, client.Object, client.Patch, ...client.SubResourcePatchOption) error {
		return nil // the reply: the object as it was
	}}
	c := fake.NewClientBuilder().WithScheme(s).WithInterceptorFuncs(storedAsIs).Build()
	var sup Superseded
	read := m.DeepCopy()
	st := sup.NewStatus(c, m)
	m.Status.Phase = v1alpha1.MigrationRunning
	m.ResourceVersion = "7"
	if patched, err := st.Patch(context.Background(), m); err != nil || !patched {
		t.Fatalf("write: patched %v error %v", patched, err)
	}
	if sup.Read(client.ObjectKeyFromObject(read), read, nil) {
		t.Error("a read of the version the write kept is stale: nothing would ever run again")
	}
}
