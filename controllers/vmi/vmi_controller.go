// Package vmi is the VirtualMachineInstance reconciler: it gives each instance one launcher pod,
// follows that pod through scheduling, ends the instance when the pod fails or vanishes, and on
// deletion removes the pod (the launcher shuts the guest down gracefully on SIGTERM) before letting
// the instance go.
package vmi

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/internal/patch"
)

// PodVMIUIDIndex indexes cached pods by their VMI UID label, so finding an instance's pods does not
// scan every pod of the namespace.
const PodVMIUIDIndex = "vmi.qvirt.io/pod-vmi-uid"

// Reconciler reconciles VirtualMachineInstances and their launcher pods.
type Reconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	Config   *config.Store
	// APIReader (mgr.GetAPIReader()) looks up cloud-init Secrets uncached, so the reconciler keeps
	// no cache of the cluster's Secrets; Client when nil.
	APIReader client.Reader
	// Expectations track launcher pod creations not yet seen by the cache; SetupWithManager
	// creates them when nil.
	Expectations *Expectations
	// Now is the clock for phase transition timestamps; time.Now when nil.
	Now func() time.Time
	// MaxConcurrentReconciles is how many instances are reconciled at once; DefaultWorkers when 0.
	// Safe because the work queue never hands one instance to two workers.
	MaxConcurrentReconciles int

	// superseded spares the conflict of a pass that read a version its own last write replaced
	// (its own pod's event queues the instance while that write is on its way to the cache).
	superseded patch.Superseded
}

// DefaultWorkers is the default number of concurrent reconciles, as KubeVirt's VMI controller.
const DefaultWorkers = 10

// LauncherPodSelector selects launcher pods (target pods included). A manager running this
// reconciler can limit its pod cache to it (cache.Options.ByObject) to hold no other pods.
func LauncherPodSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1alpha1.AppLabel: v1alpha1.LauncherApp})
}

// SetupWithManager registers the reconciler: it watches instances and the pods they own.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Expectations == nil {
		r.Expectations = NewExpectations(DefaultExpectationTTL)
	}
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.Pod{}, PodVMIUIDIndex, func(o client.Object) []string {
		if uid := o.GetLabels()[v1alpha1.VMIUIDLabel]; uid != "" {
			return []string{uid}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index pods by %s: %w", v1alpha1.VMIUIDLabel, err)
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.VirtualMachineInstance{}, PodClaimIndex, claimNames); err != nil {
		return fmt.Errorf("index instances by their claims: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).Named("vmi").
		For(&v1alpha1.VirtualMachineInstance{}).
		Owns(&corev1.Pod{}, builder.WithPredicates(podChanged())).
		Watches(&corev1.PersistentVolumeClaim{}, handler.EnqueueRequestsFromMapFunc(r.instancesOfClaim)).
		WithOptions(controller.Options{MaxConcurrentReconciles: cmp.Or(r.MaxConcurrentReconciles, DefaultWorkers)}).
		Complete(r)
}

// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes,verbs=get

// Reconcile brings one instance's launcher pod and status in line.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	err := r.Client.Get(ctx, req.NamespacedName, vmi)
	if r.superseded.Read(req.NamespacedName, vmi, err) {
		return patch.StaleResult(), nil
	}
	if err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if err := patch.AddFinalizer(ctx, r.Client, vmi, v1alpha1.GracefulShutdownFinalizer); err != nil {
		return patch.Result(ctrl.Result{}, err)
	}

	// The status patch's optimistic lock keeps a stale cache from overwriting what others wrote
	// since: the node agent's phases, or a migration's new node (whose source pod is then gone
	// from a fresher pod cache, which must not read as "pod deleted").
	status := r.superseded.NewStatus(r.Client, vmi)
	var change outcome
	defer func() {
		patched, err := status.Patch(ctx, vmi)
		res, retErr = patch.Result(res, errors.Join(retErr, client.IgnoreNotFound(err)))
		// Phase changes are told only once they are recorded, so a stale read tells no story.
		if patched && change.EventReason != "" {
			r.Recorder.Event(vmi, change.EventType, change.EventReason, change.EventMessage)
			ctrl.LoggerFrom(ctx).Info("instance phase changed", "phase", change.Phase, "reason", change.EventReason, "message", change.EventMessage)
		}
	}()

	if !vmi.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, vmi)
	}
	res, change, err = r.reconcileNormal(ctx, vmi)
	return res, err
}

// reconcileNormal follows the launcher pod, creating it when the instance has none yet. It returns
// the phase change it made, for the Event.
func (r *Reconciler) reconcileNormal(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (ctrl.Result, outcome, error) {
	claims, missing, err := r.claims(ctx, vmi)
	if err != nil {
		return ctrl.Result{}, outcome{}, err
	}
	setLiveMigratable(vmi, claims, r.Config.Get().UseEmulation)

	pods, err := r.pods(ctx, vmi)
	if err != nil {
		return ctrl.Result{}, outcome{}, err
	}
	if len(pods) > 0 {
		r.Expectations.Observed(vmi.UID)
	} else if ok, wait := r.Expectations.Satisfied(vmi.UID); !ok {
		// A pod was created and the cache has not shown it yet: "no pod" would be a lie.
		return ctrl.Result{RequeueAfter: wait}, outcome{}, nil
	}

	pod := launcherPod(vmi, pods)
	o := podOutcome(vmi.Status.Phase, pod)
	applyOutcome(&vmi.Status, o, r.now())
	setImagePullCondition(vmi, pod)
	setPodScheduledCondition(vmi, pod)
	RecordImages(&vmi.Status, pod)
	recheck, err := r.checkCloudInitSecrets(ctx, vmi)
	if err != nil {
		return ctrl.Result{}, o, err
	}
	res := ctrl.Result{RequeueAfter: recheck}
	if vmi.Status.Phase != v1alpha1.Pending || len(pods) > 0 {
		return res, o, nil
	}
	// A missing claim waits with a condition saying so (the claim watch brings the instance
	// back), rather than a pod the scheduler holds Pending without the instance telling why.
	setClaimMissing(vmi, missing)
	if missing != nil {
		return res, o, nil
	}
	if slices.ContainsFunc(vmi.Spec.Volumes, func(v v1alpha1.Volume) bool { return v.DataVolume != nil }) {
		waiting, err := r.waitingDataVolumes(ctx, vmi)
		if err != nil {
			return res, o, err
		}
		setDataVolumesReady(vmi, waiting)
		if len(waiting) > 0 {
			return ctrl.Result{RequeueAfter: dataVolumeRecheck}, o, nil
		}
	}
	return res, o, r.createPod(ctx, vmi, claims)
}

// createPod creates the instance's launcher pod and moves it to Scheduling.
func (r *Reconciler) createPod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, claims Claims) error {
	pod, err := RenderLauncherPod(vmi, r.Config.Get(), claims)
	if err != nil {
		r.Recorder.Eventf(vmi, corev1.EventTypeWarning, EventFailedCreate, "Cannot render launcher pod: %v", err)
		// No retry: the spec is immutable, so the same spec would fail the same way. The instance
		// stays Pending with this Warning telling why.
		ctrl.LoggerFrom(ctx).Error(err, "render launcher pod")
		return nil
	}
	// After the render, so a spec the pod cannot be made from leaves no claim behind.
	if ready, err := r.ensureBackendStorage(ctx, vmi, claims); !ready || err != nil {
		return err
	}
	if err := controllerutil.SetControllerReference(vmi, pod, r.Scheme); err != nil {
		return fmt.Errorf("owner reference on launcher pod: %w", err)
	}
	r.Expectations.ExpectCreate(vmi.UID)
	if err := r.Client.Create(ctx, pod); err != nil {
		r.Expectations.Observed(vmi.UID)
		r.Recorder.Eventf(vmi, corev1.EventTypeWarning, EventFailedCreate, "Error creating launcher pod: %v", err)
		return fmt.Errorf("create launcher pod: %w", err)
	}
	r.Recorder.Eventf(vmi, corev1.EventTypeNormal, EventSuccessfulCreate, "Created launcher pod %s", pod.Name)
	ctrl.LoggerFrom(ctx).Info("created launcher pod", "pod", pod.Name)
	vmi.Status.SetPhase(v1alpha1.Scheduling, r.now())
	return nil
}

// reconcileDelete deletes every pod of the instance (deleting the launcher pod is the graceful
// shutdown: the launcher powers the guest off via ACPI within the pod's grace period) and releases
// the instance once none is left.
func (r *Reconciler) reconcileDelete(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(vmi, v1alpha1.GracefulShutdownFinalizer) {
		return ctrl.Result{}, nil
	}
	pods, err := r.pods(ctx, vmi)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(pods) > 0 {
		r.Expectations.Observed(vmi.UID)
	} else if ok, wait := r.Expectations.Satisfied(vmi.UID); !ok {
		// A pod being created now would outlive the instance.
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	var errs []error
	for i := range pods {
		pod := &pods[i]
		if !pod.DeletionTimestamp.IsZero() {
			continue
		}
		err := r.Client.Delete(ctx, pod, client.Preconditions{UID: &pod.UID})
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		case err != nil:
			r.Recorder.Eventf(vmi, corev1.EventTypeWarning, EventFailedDelete, "Error deleting launcher pod %s: %v", pod.Name, err)
			errs = append(errs, fmt.Errorf("delete launcher pod %s: %w", pod.Name, err))
		default:
			r.Recorder.Eventf(vmi, corev1.EventTypeNormal, EventSuccessfulDelete, "Deleted launcher pod %s", pod.Name)
		}
	}
	if len(errs) > 0 || len(pods) > 0 {
		// The pod watch brings the instance back once the pods are gone.
		return ctrl.Result{}, kerrors.NewAggregate(errs)
	}
	if err := patch.RemoveFinalizer(ctx, r.Client, vmi, v1alpha1.GracefulShutdownFinalizer); err != nil {
		return ctrl.Result{}, err
	}
	r.Expectations.Observed(vmi.UID)
	return ctrl.Result{}, nil
}

// pods lists the cached pods carrying the instance's UID label, migration targets included.
func (r *Reconciler) pods(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := r.Client.List(ctx, &list, client.InNamespace(vmi.Namespace), client.MatchingFields{PodVMIUIDIndex: string(vmi.UID)}); err != nil {
		return nil, fmt.Errorf("list launcher pods: %w", err)
	}
	return list.Items, nil
}

func (r *Reconciler) now() metav1.Time {
	if r.Now != nil {
		return metav1.NewTime(r.Now())
	}
	return metav1.Now()
}
