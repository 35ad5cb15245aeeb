// Package vm is the VirtualMachine reconciler: it keeps a VirtualMachine's instance
// (VirtualMachineInstance) in the state the run strategy and the start/stop requests ask for, and
// reports the VM's status.
//
// Who owns what: this reconciler creates and deletes the VMI named like the VM and writes the VM's
// status, except status.stateChangeRequests, which the API (qvirtctl start/stop/restart) appends to
// and this reconciler consumes. The VMI's status belongs to the VMI reconciler and the node agent.
package vm

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/internal/patch"
)

// Finalizer holds a VirtualMachine until its instance is gone, so that deletion runs VM, then VMI,
// then launcher pod, with no reliance on the garbage collector.
const Finalizer = "qvirt.io/vm-cleanup"

// Event reasons (decision reasons are in vm_runstrategy.go).
const (
	EventSuccessfulCreate = "SuccessfulCreate"
	EventSuccessfulDelete = "SuccessfulDelete"
	EventFailedCreate     = "FailedCreate"
	EventFailedDelete     = "FailedDelete"
	// EventSocketsUpdated: the running instance was given the template's new sockets.
	EventSocketsUpdated = "SocketsUpdated"
	// EventMemoryUpdated: the running instance was given the template's new guest memory.
	EventMemoryUpdated = "MemoryUpdated"
)

// deletionRecheck is how often a VM being deleted looks again at its VMI, on top of the watch.
const deletionRecheck = 5 * time.Second

// expandRecheck is how often a VM whose instancetype or preference cannot be expanded looks again.
const expandRecheck = 10 * time.Second

// foreignRecheck is how often a VM blocked by a VMI of its name that it does not control looks again.
const foreignRecheck = 5 * time.Second

// Reconciler reconciles VirtualMachines. Safe for concurrent reconciles of different VMs.
type Reconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	Config   *config.Store
	// APIReader (mgr.GetAPIReader()), when set, is used to read the VM and its VMI at the start of
	// every pass instead of the cache. Deciding on the API server's current state costs two GETs
	// per pass and rules out acting on a stale view (consuming a Stop for a VMI the cache has not
	// seen yet, restarting a Once VM whose entry the cache does not show yet, removing the
	// finalizer while a VMI still exists); the optimistic lock on the status patch covers the
	// window between the read and the write. Without it the cache is used.
	APIReader client.Reader
	// BackoffBase and BackoffMax shape the crash-loop back-off: BackoffBase * 2^(n-1) after the n-th
	// failed start in a row, at most BackoffMax. Zero means DefaultBackoffBase and
	// DefaultBackoffMax; tests shorten them.
	BackoffBase, BackoffMax time.Duration
}

// SetupWithManager watches VirtualMachines and the instances they control, and their DataVolumes
// when CDI is installed (a watch of a kind the cluster does not serve would stop the manager; a VM
// waiting for DataVolumes looks at them again every dataVolumeRecheck anyway).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("virtualmachine").
		For(&v1alpha1.VirtualMachine{}).
		Owns(&v1alpha1.VirtualMachineInstance{})
	if cdiInstalled(mgr.GetRESTMapper()) {
		dv := &unstructured.Unstructured{}
		dv.SetGroupVersionKind(DataVolumeGVK)
		b = b.Owns(dv)
	}
	return b.Complete(r)
}

// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachines,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachines/finalizers,verbs=update
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstancetypes;virtualmachineclusterinstancetypes;virtualmachinepreferences;virtualmachineclusterpreferences,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=controllerrevisions,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datavolumes,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=cdi.kubevirt.io,resources=datasources,verbs=get
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings one VirtualMachine's instance in line with its run strategy and requests.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	reader := r.reader()
	vm := &v1alpha1.VirtualMachine{}
	if err := reader.Get(ctx, req.NamespacedName, vm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	if err := patch.AddFinalizer(ctx, r.Client, vm, Finalizer); err != nil {
		return patch.Result(ctrl.Result{}, err)
	}

	vmi, foreign, err := r.getVMI(ctx, reader, vm)
	if err != nil {
		return ctrl.Result{}, err
	}

	// The status patch's optimistic lock makes a request appended by the API since our read win:
	// the patch conflicts, and the requeued pass sees it. Every decision is idempotent, so redoing
	// it is safe.
	status := patch.NewStatus(r.Client, vm)
	defer func() { res, retErr = status.Finish(ctx, vm, res, retErr) }()

	if vm.DeletionTimestamp != nil {
		return r.reconcileDelete(ctx, vm, vmi)
	}
	return r.reconcileNormal(ctx, vm, vmi, foreign)
}

// getVMI returns the VM's instance, or nil; foreign is set when an instance of that name exists but
// another owner controls it (it is left alone and reported).
func (r *Reconciler) getVMI(ctx context.Context, c client.Reader, vm *v1alpha1.VirtualMachine) (vmi *v1alpha1.VirtualMachineInstance, foreign bool, err error) {
	vmi = &v1alpha1.VirtualMachineInstance{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(vm), vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("get VMI %s: %w", vm.Name, err)
	}
	if !controlledBy(vmi, vm) {
		return nil, true, nil
	}
	return vmi, false, nil
}

func (r *Reconciler) reader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

func (r *Reconciler) backoff() backoff {
	b := backoff{Base: r.BackoffBase, Max: r.BackoffMax}
	if b.Base <= 0 {
		b.Base = DefaultBackoffBase
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoffMax
	}
	return b
}

// reconcileNormal decides what the run strategy and the requests ask for, does it and computes the
// status.
func (r *Reconciler) reconcileNormal(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, foreign bool) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	now := time.Now()

	sf, counted, recheck := nextStartFailure(vm.Status.StartFailure, vmi, now, r.backoff())
	if counted {
		r.Recorder.Eventf(vm, corev1.EventTypeWarning, ReasonCrashLoopBackOff,
			"VMI %s failed to start (%d in a row; reason %q); next start not before %s",
			vmi.Name, sf.ConsecutiveFailCount, vmi.Status.Reason, sf.RetryAfterTimestamp.UTC().Format(time.RFC3339))
	}

	if counted {
		// Record the failed start before acting on it: once the failed VMI is deleted nothing else
		// remembers it, and a status patch that loses a conflict after the delete would drop the
		// failure from the crash-loop count. The status change brings the VM back at once.
		vm.Status.StartFailure = sf
		return ctrl.Result{}, nil
	}

	next, expandFailure, err := r.expand(ctx, vm)
	if err != nil {
		return ctrl.Result{}, err
	}

	in := decisionInput{
		Strategy: vm.EffectiveRunStrategy(), Entered: vm.Status.RunStrategy, Held: held(vm),
		Requests: vm.Status.StateChangeRequests, VMI: vmi, StartFailure: sf, Now: now,
	}
	d := decide(in)
	if d.Action != ActionNone || d.BackingOff {
		log.V(1).Info("run strategy decision", "strategy", in.Strategy, "action", d.Action, "reason", d.Reason, "message", d.Message)
	}

	var failure *Failure
	var actionErr error
	var dvs *dataVolumesState
	after := vmi
	retry, blocked, provisioning := false, false, false
	switch d.Action {
	case ActionCreate:
		if expandFailure != nil {
			// Nothing watches instancetypes and preferences: look again now and then for one
			// created or fixed since.
			failure, blocked = expandFailure, true
			break
		}
		if foreign {
			failure = &Failure{Reason: ReasonVMIConflict,
				Message: fmt.Sprintf("a VMI named %s exists and is not controlled by this VM; delete it to start the VM", vm.Name)}
			retry = true
			break
		}
		dvs, actionErr = r.ensureDataVolumes(ctx, vm, &next.Spec)
		if actionErr != nil {
			actionErr = fmt.Errorf("DataVolumes: %w", actionErr)
			break
		}
		if dvs != nil && !dvs.Ready {
			// KubeVirt's startVMI: the instance waits for its DataVolumes.
			failure, provisioning = dvs.Failure, true
			break
		}
		created := newVMIFrom(vm, next)
		if d.StartPaused {
			paused := v1alpha1.StartStrategyPaused
			created.Spec.StartStrategy = &paused
		}
		err := r.Client.Create(ctx, created)
		switch {
		case apierrors.IsAlreadyExists(err):
			// The cache has not caught up with an instance created or deleted a moment ago: look
			// again shortly rather than assume which one it is.
			retry = true
		case err != nil:
			actionErr = fmt.Errorf("create VMI %s: %w", created.Name, err)
			failure = &Failure{Reason: ReasonFailedCreate, Message: actionErr.Error()}
			r.Recorder.Eventf(vm, corev1.EventTypeWarning, EventFailedCreate, "%v", actionErr)
		default:
			after = created
			r.Recorder.Eventf(vm, corev1.EventTypeNormal, EventSuccessfulCreate, "created VMI %s (%s): %s", created.Name, created.UID, d.Message)
		}
	case ActionDelete:
		uid := vmi.UID
		err := r.markStopGracePeriod(ctx, vmi, d.GracePeriodSeconds)
		if err == nil {
			err = r.Client.Delete(ctx, vmi, client.Preconditions{UID: &uid})
		}
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err): // gone, or replaced meanwhile
			after = nil
		case err != nil:
			actionErr = fmt.Errorf("delete VMI %s: %w", vmi.Name, err)
			failure = &Failure{Reason: ReasonFailedDelete, Message: actionErr.Error()}
			r.Recorder.Eventf(vm, corev1.EventTypeWarning, EventFailedDelete, "%v", actionErr)
		default:
			after = vmi.DeepCopy()
			if after.DeletionTimestamp == nil {
				after.DeletionTimestamp = &metav1.Time{Time: now}
			}
			r.Recorder.Eventf(vm, corev1.EventTypeNormal, EventSuccessfulDelete, "deleted VMI %s (%s): %s", vmi.Name, uid, d.Message)
		}
	}
	if d.Action == ActionNone && next != nil && actionErr == nil {
		after, actionErr = r.liveUpdateSockets(ctx, vm, &next.Spec, after)
		if actionErr == nil {
			after, actionErr = r.liveUpdateMemory(ctx, vm, &next.Spec, after)
		}
	}
	if actionErr != nil || retry || blocked || provisioning {
		// The decision assumed the action succeeded: keep the requests, the hold and the entered
		// strategy as they were so that the next pass decides again.
		d.Requests, d.Held, d.RunStrategy = vm.Status.StateChangeRequests, in.Held, vm.Status.RunStrategy
	} else {
		for _, n := range d.Notes {
			r.Recorder.Event(vm, n.Type, n.Reason, n.Message)
		}
	}
	if failure == nil {
		failure = expandFailure
	}
	if failure == nil && foreign {
		failure = &Failure{Reason: ReasonVMIConflict,
			Message: fmt.Sprintf("a VMI named %s exists and is not controlled by this VM", vm.Name)}
	}

	var desired *v1alpha1.VirtualMachineInstanceSpec
	if next != nil {
		desired = &next.Spec
	} else if after != nil {
		desired = &after.Spec // unknown while expansion fails: the Failure condition says why
	}
	vm.Status = computeStatus(statusInput{VM: vm, VMI: after, Decision: d, StartFailure: sf, Failure: failure, Desired: desired,
		DataVolumes: dvs, Now: now})

	var res ctrl.Result
	switch {
	case blocked:
		res.RequeueAfter = expandRecheck
	case provisioning && failure != nil:
		// CDI missing, a failed or foreign DataVolume: fixed by people, not soon.
		res.RequeueAfter = expandRecheck
	case provisioning:
		res.RequeueAfter = dataVolumeRecheck
	case retry && foreign:
		// A foreign VMI has no owner reference to this VM, so its deletion does not bring the VM
		// back through the watch.
		res.RequeueAfter = foreignRecheck
	case retry:
		res.RequeueAfter = time.Second
	case d.RequeueAfter > 0:
		res.RequeueAfter = d.RequeueAfter
	}
	if recheck > 0 && (res.RequeueAfter == 0 || recheck < res.RequeueAfter) {
		res.RequeueAfter = recheck
	}
	return res, actionErr
}

// liveUpdateSockets gives a running instance the sockets its VM's template now has, when CPU
// hotplug allows it: KubeVirt's LiveUpdate of cpu.sockets. The template and the instance have the
// same maxSockets and the template more sockets, at most that many; the node agent then plugs the
// vCPUs. Anything else about the CPU waits for a restart (RestartRequired, coldSpec). It returns
// the instance as patched.
func (r *Reconciler) liveUpdateSockets(ctx context.Context, vm *v1alpha1.VirtualMachine, desired *v1alpha1.VirtualMachineInstanceSpec, vmi *v1alpha1.VirtualMachineInstance) (*v1alpha1.VirtualMachineInstance, error) {
	if !vmiActive(vmi) || vmi.DeletionTimestamp != nil || migrating(vmi) {
		// A migration's end brings the VMI, and so the VM, back.
		return vmi, nil
	}
	want, have := desired.Domain.CPU, vmi.Spec.Domain.CPU
	if want == nil || have == nil || have.MaxSockets == 0 || want.MaxSockets != have.MaxSockets ||
		want.Sockets <= max(have.Sockets, 1) || want.Sockets > have.MaxSockets {
		return vmi, nil
	}
	patched := vmi.DeepCopy()
	patched.Spec.Domain.CPU.Sockets = want.Sockets
	if err := r.Client.Patch(ctx, patched, client.MergeFrom(vmi)); err != nil {
		return vmi, fmt.Errorf("raise VMI %s to %d sockets: %w", vmi.Name, want.Sockets, err)
	}
	r.Recorder.Eventf(vm, corev1.EventTypeNormal, EventSocketsUpdated, "VMI %s: sockets %d -> %d (CPU hotplug)", vmi.Name, max(have.Sockets, 1), want.Sockets)
	return patched, nil
}

// liveUpdateMemory gives a running instance the guest memory its VM's template now has, when
// memory hotplug allows it: KubeVirt's LiveUpdate of memory.guest. The template and the instance
// have the same maxGuest and the template more memory, at most that much; the node agent then has
// the launcher plug it. Less memory waits for a restart (RestartRequired, lessMemory). It returns
// the instance as patched.
func (r *Reconciler) liveUpdateMemory(ctx context.Context, vm *v1alpha1.VirtualMachine, desired *v1alpha1.VirtualMachineInstanceSpec, vmi *v1alpha1.VirtualMachineInstance) (*v1alpha1.VirtualMachineInstance, error) {
	if !vmiActive(vmi) || vmi.DeletionTimestamp != nil || migrating(vmi) {
		return vmi, nil
	}
	// Only memory.guest goes live: a template sizing the guest by resources.requests.memory
	// changes the pod too, which takes a restart (coldSpec keeps the resources).
	want, have := desiredGuest(desired), v1alpha1.GuestMemory(&vmi.Spec.Domain)
	room := maxGuest(vmi.Spec.Domain.Memory)
	if want == nil || have == nil || room == nil || !equality.Semantic.DeepEqual(maxGuest(desired.Domain.Memory), room) ||
		want.Cmp(*have) <= 0 || want.Cmp(*room) > 0 {
		return vmi, nil
	}
	patched := vmi.DeepCopy()
	g := want.DeepCopy()
	patched.Spec.Domain.Memory.Guest = &g
	if err := r.Client.Patch(ctx, patched, client.MergeFrom(vmi)); err != nil {
		return vmi, fmt.Errorf("raise VMI %s to %s of memory: %w", vmi.Name, g.String(), err)
	}
	r.Recorder.Eventf(vm, corev1.EventTypeNormal, EventMemoryUpdated, "VMI %s: memory %s -> %s (memory hotplug)", vmi.Name, have.String(), g.String())
	return patched, nil
}

// desiredGuest is the template's memory.guest, nil when unset.
func desiredGuest(s *v1alpha1.VirtualMachineInstanceSpec) *resource.Quantity {
	if s.Domain.Memory == nil {
		return nil
	}
	return s.Domain.Memory.Guest
}

// maxGuest is memory.maxGuest, nil when unset.
func maxGuest(m *v1alpha1.Memory) *resource.Quantity {
	if m == nil {
		return nil
	}
	return m.MaxGuest
}

// reconcileDelete deletes the VM's instance and removes the finalizer once the instance is gone
// (the VMI's own finalizer holds it until its launcher pod is gone). Removing the finalizer leaves
// the status as read, so the deferred status patch does not run on a VM that may be gone.
func (r *Reconciler) reconcileDelete(ctx context.Context, vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(vm, Finalizer) {
		return ctrl.Result{}, nil
	}
	now := time.Now()
	d := Decision{Action: ActionNone, Requests: vm.Status.StateChangeRequests, Held: held(vm), RunStrategy: vm.Status.RunStrategy}
	if vmi == nil {
		return ctrl.Result{}, patch.RemoveFinalizer(ctx, r.Client, vm, Finalizer)
	}
	var failure *Failure
	var err error
	if vmi.DeletionTimestamp == nil {
		uid := vmi.UID
		err = r.Client.Delete(ctx, vmi, client.Preconditions{UID: &uid})
		switch {
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			err = nil
		case err != nil:
			err = fmt.Errorf("delete VMI %s: %w", vmi.Name, err)
			failure = &Failure{Reason: ReasonFailedDelete, Message: err.Error()}
			r.Recorder.Eventf(vm, corev1.EventTypeWarning, EventFailedDelete, "%v", err)
		default:
			vmi = vmi.DeepCopy()
			vmi.DeletionTimestamp = &metav1.Time{Time: now}
			r.Recorder.Eventf(vm, corev1.EventTypeNormal, EventSuccessfulDelete, "deleted VMI %s (%s): the VM is being deleted", vmi.Name, uid)
		}
	}
	vm.Status = computeStatus(statusInput{VM: vm, VMI: vmi, Decision: d, StartFailure: vm.Status.StartFailure, Failure: failure, Now: now})
	// The Owns watch brings the VM back when the VMI goes; the recheck covers a missed event.
	return ctrl.Result{RequeueAfter: deletionRecheck}, err
}

// markStopGracePeriod records a stop's grace period override on the instance before it is deleted,
// for the node agent (custom resources have no graceful deletion of their own).
func (r *Reconciler) markStopGracePeriod(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, grace *int64) error {
	if grace == nil {
		return nil
	}
	base := client.MergeFrom(vmi.DeepCopy())
	marked := vmi.DeepCopy()
	if marked.Annotations == nil {
		marked.Annotations = map[string]string{}
	}
	marked.Annotations[v1alpha1.StopGracePeriodAnnotation] = strconv.FormatInt(*grace, 10)
	if err := r.Client.Patch(ctx, marked, base); err != nil {
		return fmt.Errorf("mark VMI %s with the stop's grace period: %w", vmi.Name, err)
	}
	return nil
}
