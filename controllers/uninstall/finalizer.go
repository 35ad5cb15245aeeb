package uninstall

import (
	"context"
	"fmt"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Finalizer is what Reconciler keeps on Targets while workloads exist.
const Finalizer = "qvirt.io/uninstall-guard"

// Target is an installed object no webhook can guard.
type Target struct {
	GVK  schema.GroupVersionKind
	Name string
}

// Targets are the webhook configurations and admission policies config/default installs
// (test/manifests checks that these are all of them).
var Targets = []Target{
	{admissionregv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration"), "qvirt-validating-webhook"},
	{admissionregv1.SchemeGroupVersion.WithKind("MutatingWebhookConfiguration"), "qvirt-mutating-webhook"},
	{admissionregv1.SchemeGroupVersion.WithKind("ValidatingAdmissionPolicy"), "qvirt-handler-own-node"},
	{admissionregv1.SchemeGroupVersion.WithKind("ValidatingAdmissionPolicyBinding"), "qvirt-handler-own-node"},
}

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingwebhookconfigurations,resourceNames=qvirt-validating-webhook,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,resourceNames=qvirt-mutating-webhook,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=validatingadmissionpolicies;validatingadmissionpolicybindings,resourceNames=qvirt-handler-own-node,verbs=get;list;watch;patch

// Reconciler keeps Finalizer on each target that exists while any workload does, and takes it off
// once none is left, so that a deletion refused for the rest of the installation holds these too
// and one made after the last VM went is not held. It does not add the finalizer to a target
// already being deleted (the API forbids it): a target deleted between a workload's creation and
// this reconcile goes.
type Reconciler struct {
	// Client lists workloads from the manager's cache and patches targets.
	Client client.Client
	// Targets defaults to the package's Targets.
	Targets []Target

	targets cache.Cache
}

// the one request every event maps to: there is one decision, for all targets.
var request = reconcile.Request{NamespacedName: types.NamespacedName{Name: "uninstall-guard"}}

// SetupWithManager watches workloads' creations and deletions (in the manager's cache) and the
// targets' metadata (in a cache of its own, each selected by name so RBAC can name it).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Targets == nil {
		r.Targets = Targets
	}
	byObject := map[client.Object]cache.ByObject{}
	var metas []*metav1.PartialObjectMetadata
	for _, t := range r.Targets {
		o := &metav1.PartialObjectMetadata{}
		o.SetGroupVersionKind(t.GVK)
		byObject[o] = cache.ByObject{Field: fields.OneTermEqualSelector("metadata.name", t.Name)}
		metas = append(metas, o)
	}
	c, err := cache.New(mgr.GetConfig(), cache.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), ByObject: byObject})
	if err != nil {
		return fmt.Errorf("uninstall guard: cache of its targets: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return err
	}
	r.targets = c
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{request}
	})
	onMeta := handler.TypedEnqueueRequestsFromMapFunc(func(context.Context, *metav1.PartialObjectMetadata) []reconcile.Request {
		return []reconcile.Request{request}
	})
	// Status updates do not change whether a workload exists.
	createDelete := builder.WithPredicates(predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(event.UpdateEvent) bool { return false },
	})
	atStart := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(request)
		return nil
	})
	b := ctrl.NewControllerManagedBy(mgr).Named("uninstall").
		Watches(&v1alpha1.VirtualMachine{}, one, createDelete).
		Watches(&v1alpha1.VirtualMachineInstance{}, one, createDelete).
		Watches(&v1alpha1.VirtualMachineInstanceMigration{}, one, createDelete).
		WatchesRawSource(atStart)
	for _, o := range metas {
		b = b.WatchesRawSource(source.Kind(c, o, onMeta))
	}
	return b.Complete(r)
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (ctrl.Result, error) {
	inUse, err := Workloads(ctx, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	for _, t := range r.Targets {
		o := &metav1.PartialObjectMetadata{}
		o.SetGroupVersionKind(t.GVK)
		err := r.targets.Get(ctx, client.ObjectKey{Name: t.Name}, o)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("read %s %s: %w", t.GVK.Kind, t.Name, err)
		}
		if err := r.hold(ctx, o, inUse); err != nil {
			return ctrl.Result{}, fmt.Errorf("%s %s: %w", t.GVK.Kind, t.Name, err)
		}
	}
	return ctrl.Result{}, nil
}

// hold adds Finalizer to o when workloads exist (inUse names them) and removes it when none do.
func (r *Reconciler) hold(ctx context.Context, o *metav1.PartialObjectMetadata, inUse string) error {
	base := o.DeepCopy()
	has := controllerutil.ContainsFinalizer(o, Finalizer)
	switch {
	case inUse != "" && has:
		if o.DeletionTimestamp != nil {
			ctrl.LoggerFrom(ctx).Info("deletion held until no workload is left", "kind", o.Kind, "name", o.Name, "workloads", inUse)
		}
		return nil
	case inUse != "" && o.DeletionTimestamp == nil:
		controllerutil.AddFinalizer(o, Finalizer)
	case inUse == "" && has:
		controllerutil.RemoveFinalizer(o, Finalizer)
	default:
		return nil
	}
	// Locked on the version read: a merge patch replaces the whole finalizers list.
	return r.Client.Patch(ctx, o, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}
