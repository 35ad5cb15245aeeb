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
// a target not being deleted once none is left. A target being deleted keeps it: it was deleted by
// an uninstall that was refused, it stays in force (Terminating) while qvirt runs, and Guard
// releases it when an uninstall goes through. Were it released with the last workload, qvirt would
// lose its admission (VM validation, the node agent's own-node policy) while still installed.
// The API forbids adding a finalizer to an object being deleted: a target deleted between a
// workload's creation and this reconcile goes.
type Reconciler struct {
	// Client lists workloads from the manager's cache and patches targets.
	Client client.Client

	targets cache.Cache
}

// the one request every event maps to: there is one decision, for all targets.
var request = reconcile.Request{NamespacedName: types.NamespacedName{Name: "uninstall-guard"}}

// SetupWithManager watches workloads' creations and deletions (in the manager's cache) and the
// targets' metadata (in a cache of its own, each selected by name so RBAC can name it).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	byObject := map[client.Object]cache.ByObject{}
	var metas []*metav1.PartialObjectMetadata
	for _, t := range Targets {
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
	// Status updates do not change whether a VM or VMI exists; a migration stops counting when it
	// finishes.
	createDelete := builder.WithPredicates(predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(event.UpdateEvent) bool { return false },
	})
	migrationEnds := builder.WithPredicates(predicate.Funcs{
		CreateFunc: func(event.CreateEvent) bool { return true },
		DeleteFunc: func(event.DeleteEvent) bool { return true },
		UpdateFunc: func(e event.UpdateEvent) bool { return counts(e.ObjectOld) != counts(e.ObjectNew) },
	})
	atStart := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(request)
		return nil
	})
	b := ctrl.NewControllerManagedBy(mgr).Named("uninstall").
		Watches(&v1alpha1.VirtualMachine{}, one, createDelete).
		Watches(&v1alpha1.VirtualMachineInstance{}, one, createDelete).
		Watches(&v1alpha1.VirtualMachineInstanceMigration{}, one, migrationEnds).
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
	for _, t := range Targets {
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

// hold adds Finalizer to o when workloads exist (inUse names them) and removes it when none do,
// unless o is being deleted.
func (r *Reconciler) hold(ctx context.Context, o *metav1.PartialObjectMetadata, inUse string) error {
	base := o.DeepCopy()
	has := controllerutil.ContainsFinalizer(o, Finalizer)
	switch {
	case o.DeletionTimestamp != nil:
		if has {
			ctrl.LoggerFrom(ctx).Info("held in force until qvirt is uninstalled", "kind", o.Kind, "name", o.Name, "workloads", inUse)
		}
		return nil
	case inUse != "" && !has:
		controllerutil.AddFinalizer(o, Finalizer)
	case inUse == "" && has:
		controllerutil.RemoveFinalizer(o, Finalizer)
	default:
		return nil
	}
	return patchFinalizers(ctx, r.Client, base, o)
}

// Release takes Finalizer off every target that exists, read from kube-apiserver.
func Release(ctx context.Context, r client.Reader, c client.Client) error {
	for _, t := range Targets {
		o := &metav1.PartialObjectMetadata{}
		o.SetGroupVersionKind(t.GVK)
		if err := r.Get(ctx, client.ObjectKey{Name: t.Name}, o); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("read %s %s: %w", t.GVK.Kind, t.Name, err)
		}
		base := o.DeepCopy()
		if !controllerutil.RemoveFinalizer(o, Finalizer) {
			continue
		}
		if err := patchFinalizers(ctx, c, base, o); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("%s %s: %w", t.GVK.Kind, t.Name, err)
		}
	}
	return nil
}

// patchFinalizers writes o's finalizers, locked on the version base was read at: a merge patch
// replaces the whole list.
func patchFinalizers(ctx context.Context, c client.Client, base, o *metav1.PartialObjectMetadata) error {
	return c.Patch(ctx, o, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}
