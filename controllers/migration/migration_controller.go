// Package migration is the VirtualMachineInstanceMigration reconciler: it live-migrates a running
// instance to another node by creating a target launcher pod, handing the node agents the
// instance's status.migrationState, and moving the instance to the target once the node agent
// reports the migration completed.
//
// Who writes what: this reconciler owns the migration's status, creates and deletes target pods,
// writes migrationState's identity fields (migrationUid, source and target node and pod) and
// abortRequested, and on success status.nodeName and status.activePods of the instance. The node
// agents own the rest of migrationState (targetReady, startTimestamp, completed, failed, ...).
package migration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/qvirt/qvirt/api/v1alpha1"
	vmictrl "github.com/qvirt/qvirt/controllers/vmi"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/internal/patch"
)

// Field indexes on migrations in the manager's cache.
const (
	// VMINameField indexes migrations by spec.vmiName.
	VMINameField = ".spec.vmiName"
	// UIDField indexes migrations by metadata.uid, to map a target pod's label back.
	UIDField = ".metadata.uid"
)

// Defaults of the Reconciler's tunables.
const (
	DefaultPendingRequeue = 5 * time.Second
	DefaultAbortGrace     = 2 * time.Minute
)

// Reconciler drives VirtualMachineInstanceMigrations. One migration per instance runs at a time,
// within the parallel limits of the configuration in force.
type Reconciler struct {
	Client   client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	Config   *config.Store
	// APIReader reads around the cache where a stale read would break a parallel limit or create a
	// second target pod. SetupWithManager sets the manager's when nil.
	APIReader client.Reader
	// PendingRequeue is how often a migration held back by the limits looks again;
	// DefaultPendingRequeue when zero.
	PendingRequeue time.Duration
	// AbortGrace is how long the node agent has to confirm an abort before the target pod is removed
	// anyway; DefaultAbortGrace when zero.
	AbortGrace time.Duration
}

// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstancemigrations,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstancemigrations/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstancemigrations/finalizers,verbs=update
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch

// Reconcile moves one migration a step: get → finalizer → deferred status patch → reconcileDelete or
// reconcileNormal.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	vmim := &v1alpha1.VirtualMachineInstanceMigration{}
	if err := r.Client.Get(ctx, req.NamespacedName, vmim); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	log := ctrl.LoggerFrom(ctx).WithValues("vmi", vmim.Spec.VMIName, "phase", vmim.Status.Phase)
	ctx = ctrl.LoggerInto(ctx, log)

	// A finished migration needs no cleanup (finishing it did that), so it gets no finalizer and
	// loses the one it had once its final status is recorded: otherwise only this reconciler
	// could delete it, and an uninstall would leave it, and its CRD, Terminating.
	if !isTerminal(vmim.Status.Phase) {
		if err := patch.AddFinalizer(ctx, r.Client, vmim, v1alpha1.MigrationFinalizer); err != nil {
			return patch.Result(ctrl.Result{}, err)
		}
	}

	status := patch.NewStatus(r.Client, vmim)
	release := false
	defer func() {
		// The finalizer goes only once the final status is recorded: a lost status write must not
		// let the migration go.
		_, err := status.Patch(ctx, vmim)
		err = errors.Join(retErr, client.IgnoreNotFound(err))
		if (release || isTerminal(vmim.Status.Phase)) && err == nil {
			err = patch.RemoveFinalizer(ctx, r.Client, vmim, v1alpha1.MigrationFinalizer)
		}
		res, retErr = patch.Result(res, err)
	}()

	if !vmim.DeletionTimestamp.IsZero() {
		var err error
		release, res, err = r.reconcileDelete(ctx, vmim)
		return res, err
	}
	return r.reconcileNormal(ctx, vmim)
}

func (r *Reconciler) pendingRequeue() time.Duration {
	if r.PendingRequeue > 0 {
		return r.PendingRequeue
	}
	return DefaultPendingRequeue
}

func (r *Reconciler) abortGrace() time.Duration {
	if r.AbortGrace > 0 {
		return r.AbortGrace
	}
	return DefaultAbortGrace
}

func (r *Reconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// getVMI returns the migration's instance from the cache, or nil when it does not exist.
func (r *Reconciler) getVMI(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration) (*v1alpha1.VirtualMachineInstance, error) {
	return r.getVMIFrom(ctx, r.Client, vmim)
}

func (r *Reconciler) getVMIFrom(ctx context.Context, c client.Reader, vmim *v1alpha1.VirtualMachineInstanceMigration) (*v1alpha1.VirtualMachineInstance, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	err := c.Get(ctx, types.NamespacedName{Namespace: vmim.Namespace, Name: vmim.Spec.VMIName}, vmi)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get instance %s: %w", vmim.Spec.VMIName, err)
	}
	return vmi, nil
}

func (r *Reconciler) reconcileNormal(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration) (ctrl.Result, error) {
	if vmim.Status.Phase == "" {
		r.setPhase(vmim, v1alpha1.MigrationPending, "", "migration of "+vmim.Spec.VMIName+" accepted")
	}
	if isTerminal(vmim.Status.Phase) {
		return ctrl.Result{}, nil
	}
	cfg := r.Config.Get()
	now := time.Now()
	// A Pending migration reads its instance around the cache: a refusal (not found, not Running)
	// is final, so it must not come from a cache that lags.
	reader := client.Reader(r.Client)
	if vmim.Status.Phase == v1alpha1.MigrationPending {
		reader = r.apiReader()
	}
	vmi, err := r.getVMIFrom(ctx, reader, vmim)
	if err != nil {
		return ctrl.Result{}, err
	}
	targets, err := listTargetPods(ctx, r.Client, vmim)
	if err != nil {
		return ctrl.Result{}, err
	}
	in := phaseInput{
		Phase: vmim.Status.Phase, UID: vmim.UID, VMI: vmi, TargetPod: currentTargetPod(targets),
		Now: now, AbortGrace: r.abortGrace(), AbortRequestedAt: conditionSince(vmim, ConditionAbortRequested),
		PhaseSince: phaseSince(vmim),
	}
	if vmi != nil {
		perGiB := cfg.Migrations.CompletionTimeoutPerGiB
		if ms := ownState(vmi, vmim.UID); ms != nil && ms.MigrationConfiguration != nil && ms.MigrationConfiguration.CompletionTimeoutPerGiB != nil {
			perGiB = *ms.MigrationConfiguration.CompletionTimeoutPerGiB // the policy's, fixed at the start
		}
		in.CompletionTimeout = completionDeadline(ownState(vmi, vmim.UID), v1alpha1.CompletionTimeout(&vmi.Spec, perGiB))
	}
	if in.TargetPod == nil && vmi != nil && !isTerminal(vmim.Status.Phase) {
		// No target pod fails a migration past Pending, which is final, and lets a Pending one
		// create a second: confirm it around the cache, which lags behind the pod created a
		// moment ago.
		if targets, err = listTargetPods(ctx, r.apiReader(), vmim); err != nil {
			return ctrl.Result{}, err
		}
		in.TargetPod = currentTargetPod(targets)
	}
	if in.TargetPod != nil && vmi != nil {
		in.ImageMismatches = vmictrl.ImageMismatches(in.TargetPod, &vmi.Status)
	}
	if vmim.Status.Phase == v1alpha1.MigrationPending && vmi != nil {
		// Limits and the one-migration-per-instance rule read around the cache, so a migration
		// that just left Pending counts even before its watch event arrives.
		var all v1alpha1.VirtualMachineInstanceMigrationList
		if err := r.apiReader().List(ctx, &all); err != nil {
			return ctrl.Result{}, fmt.Errorf("list migrations: %w", err)
		}
		in.InProgress = migrationAhead(vmim, vmi, all.Items)
		in.Limit = checkLimits(vmim, vmi.Status.NodeName, all.Items, cfg.Migrations)
	}
	return r.apply(ctx, vmim, vmi, in.TargetPod, decidePhase(in))
}

// apply carries out a decision and records the phase it leads to.
func (r *Reconciler) apply(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance,
	tp *corev1.Pod, d decision) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	if tp != nil && vmi != nil {
		r.recordIdentity(ctx, vmim, vmi, tp)
	}
	switch d.Action {
	case actNone:
		if d.Phase == v1alpha1.MigrationPending {
			r.setCondition(vmim, ConditionAdmitted, metav1.ConditionFalse, d.Reason, d.Message, true)
			return ctrl.Result{RequeueAfter: r.pendingRequeue()}, nil
		}
		r.setPhase(vmim, d.Phase, d.Reason, d.Message)
		copyState(vmim, vmi)
		return ctrl.Result{RequeueAfter: d.RequeueAfter}, nil

	case actCreateTargetPod:
		// The target copies the source pod's whole spec, which the cache does not keep
		// (vmictrl.CacheTransform): read it from the API server, once per target pod.
		if r.APIReader == nil {
			return ctrl.Result{}, errors.New("no API reader to read the source pod with: set up the reconciler with SetupWithManager")
		}
		source, err := findSourcePod(ctx, r.APIReader, vmi)
		if err != nil {
			return ctrl.Result{}, err
		}
		if source == nil {
			r.fail(vmim, ReasonSourcePodNotFound, fmt.Sprintf("no launcher pod of %s runs on node %s", vmi.Name, vmi.Status.NodeName))
			return ctrl.Result{}, nil
		}
		pod, unpinned := renderTargetPod(vmim, vmi, source, r.Config.Get().LauncherImage)
		if err := r.Client.Create(ctx, pod); err != nil {
			r.event(vmim, corev1.EventTypeWarning, ReasonFailedCreateTargetPod, "create target pod: %v", err)
			return ctrl.Result{}, fmt.Errorf("create target pod for migration %s: %w", vmim.Name, err)
		}
		log.Info("created target pod", "pod", pod.Name, "sourceNode", source.Spec.NodeName)
		if len(unpinned) > 0 {
			msg := fmt.Sprintf("target pod %s pulls %s by tag: the instance's status records no digest for it, so the target may get other bytes than the source runs",
				pod.Name, strings.Join(unpinned, ", "))
			r.event(vmim, corev1.EventTypeWarning, ReasonImagesNotPinned, "%s", msg)
			log.Info("target pod images not pinned to a digest", "pod", pod.Name, "images", unpinned)
		}
		r.setCondition(vmim, ConditionAdmitted, metav1.ConditionTrue, ReasonAdmitted, "within the parallel migration limits", false)
		vmim.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{
			MigrationUID: vmim.UID, SourceNode: source.Spec.NodeName, SourcePod: source.Name, TargetPod: pod.Name,
		}
		r.setPhase(vmim, v1alpha1.MigrationScheduling, ReasonTargetPodCreated,
			fmt.Sprintf("created target pod %s; it must not run on node %s", pod.Name, source.Spec.NodeName))
		return ctrl.Result{}, nil

	case actStartMigration:
		policy, mcfg, tie, err := r.chooseConfiguration(ctx, vmi)
		if err != nil {
			return ctrl.Result{}, err
		}
		if tie != "" {
			r.event(vmim, corev1.EventTypeWarning, ReasonPolicyTie,
				"migration policies %s and %s match instance %s equally; %s applies, the first by name", policy, tie, vmi.Name, policy)
		}
		if why, err := r.noPostCopy(ctx, vmi, mcfg, tp.Spec.NodeName); err != nil {
			return ctrl.Result{}, err
		} else if why != "" {
			no := false
			mcfg.AllowPostCopy = &no
			msg := fmt.Sprintf("allowPostCopy is not used for this migration: %s; it stays pre-copy", why)
			r.setCondition(vmim, ConditionPostCopyUnavailable, metav1.ConditionTrue, ReasonPostCopyUnavailable, msg, false)
			r.event(vmim, corev1.EventTypeWarning, ReasonPostCopyUnavailable, "%s", msg)
		}
		r.setPhase(vmim, v1alpha1.MigrationScheduled, string(v1alpha1.MigrationScheduled), d.Message)
		ms := &v1alpha1.VirtualMachineInstanceMigrationState{
			MigrationUID: vmim.UID, SourceNode: vmi.Status.NodeName, TargetNode: tp.Spec.NodeName, TargetPod: tp.Name,
			MigrationPolicyName: policy, MigrationConfiguration: mcfg,
		}
		if own := vmim.Status.MigrationState; own != nil {
			ms.SourcePod = own.SourcePod
			if own.SourceNode != "" {
				ms.SourceNode = own.SourceNode
			}
		}
		base := vmi.DeepCopy()
		vmi.Status.MigrationState = ms
		if err := r.patchVMIStatus(ctx, base, vmi); err != nil {
			return ctrl.Result{}, err
		}
		copyState(vmim, vmi)
		r.setPhase(vmim, v1alpha1.MigrationPreparingTarget, string(v1alpha1.MigrationPreparingTarget),
			fmt.Sprintf("asked node %s to prepare the target", ms.TargetNode))
		return ctrl.Result{}, nil

	case actAbort:
		r.setPhase(vmim, d.Phase, d.Reason, d.Message)
		if err := r.requestAbort(ctx, vmim, vmi, d.Reason, d.Message); err != nil {
			return ctrl.Result{}, err
		}
		copyState(vmim, vmi)
		return ctrl.Result{RequeueAfter: d.RequeueAfter}, nil

	case actSucceed:
		if err := r.finishSucceeded(ctx, vmim, vmi, tp); err != nil {
			return ctrl.Result{}, err
		}
		copyState(vmim, vmi)
		r.setPhase(vmim, v1alpha1.MigrationSucceeded, d.Reason, d.Message)
		return ctrl.Result{}, nil

	case actFail:
		if err := r.finishFailed(ctx, vmim, vmi, d.Message); err != nil {
			return ctrl.Result{}, err
		}
		copyState(vmim, vmi)
		r.fail(vmim, d.Reason, d.Message)
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, fmt.Errorf("unknown action %d", d.Action)
}

// recordIdentity fills the migration's own record of source and target when a lost status write
// left it empty, so the per-node limit still counts the migration against its source node.
func (r *Reconciler) recordIdentity(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration,
	vmi *v1alpha1.VirtualMachineInstance, tp *corev1.Pod) {
	if vmim.Status.MigrationState != nil {
		return
	}
	ms := &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: vmim.UID, SourceNode: vmi.Status.NodeName, TargetPod: tp.Name}
	if src, err := findSourcePod(ctx, r.Client, vmi); err == nil && src != nil {
		ms.SourcePod = src.Name
	}
	vmim.Status.MigrationState = ms
}

// copyState mirrors the instance's migration state into the migration while it is this migration's.
func copyState(vmim *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance) {
	if ms := ownState(vmi, vmim.UID); ms != nil {
		vmim.Status.MigrationState = ms.DeepCopy()
	}
}

// patchVMIStatus writes the instance's status changed since base, under base's resourceVersion: the
// node agents write migrationState too, and a conflict (requeued, see patch.Result) makes this
// reconciler decide again on what they wrote. An instance gone meanwhile is an error here.
func (r *Reconciler) patchVMIStatus(ctx context.Context, base, vmi *v1alpha1.VirtualMachineInstance) error {
	_, err := patch.NewStatus(r.Client, base).Patch(ctx, vmi)
	return err
}

// requestAbort sets migrationState.abortRequested on the instance and records when.
func (r *Reconciler) requestAbort(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration,
	vmi *v1alpha1.VirtualMachineInstance, reason, message string) error {
	ms := ownState(vmi, vmim.UID)
	if ms == nil || ms.AbortRequested {
		return nil
	}
	base := vmi.DeepCopy()
	vmi.Status.MigrationState.AbortRequested = true
	if err := r.patchVMIStatus(ctx, base, vmi); err != nil {
		return err
	}
	r.setCondition(vmim, ConditionAbortRequested, metav1.ConditionTrue, reason, message, false)
	r.event(vmim, corev1.EventTypeWarning, reason, "asked the node agent to abort the migration: %s", message)
	return nil
}

// finishSucceeded moves the instance to the target node and pod first, then deletes the source pod,
// so the instance's status never names a node without its launcher.
func (r *Reconciler) finishSucceeded(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration,
	vmi *v1alpha1.VirtualMachineInstance, tp *corev1.Pod) error {
	ms := ownState(vmi, vmim.UID)
	if ms == nil {
		return nil
	}
	base := vmi.DeepCopy()
	vmi.Status.NodeName = ms.TargetNode
	if vmi.Status.EvacuationNodeName != "" && vmi.Status.EvacuationNodeName != ms.TargetNode {
		// The instance left the node it was evacuated from (KubeVirt clears the mark likewise).
		vmi.Status.EvacuationNodeName = ""
	}
	if tp != nil && tp.Name == ms.TargetPod {
		vmi.Status.ActivePods = map[types.UID]string{tp.UID: ms.TargetNode}
	}
	if err := r.patchVMIStatus(ctx, base, vmi); err != nil {
		return err
	}
	if ms.SourcePod != "" && ms.SourcePod != ms.TargetPod {
		if err := r.deletePod(ctx, vmi.Namespace, ms.SourcePod, vmi.UID); err != nil {
			return fmt.Errorf("delete source pod after migration %s: %w", vmim.Name, err)
		}
	}
	if base.Status.NodeName != vmi.Status.NodeName && r.Recorder != nil {
		r.Recorder.Eventf(vmi, corev1.EventTypeNormal, ReasonMigrationSucceeded, "migrated from node %s to node %s by %s",
			ms.SourceNode, ms.TargetNode, vmim.Name)
	}
	return nil
}

// finishFailed closes the instance's migration state when it is still this migration's and open,
// then deletes the target pods: the instance keeps running on the source.
func (r *Reconciler) finishFailed(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration,
	vmi *v1alpha1.VirtualMachineInstance, message string) error {
	if ms := ownState(vmi, vmim.UID); openState(ms) {
		base := vmi.DeepCopy()
		vmi.Status.MigrationState.Failed = true
		vmi.Status.MigrationState.FailureReason = message
		vmi.Status.MigrationState.EndTimestamp = ptrNow()
		if err := r.patchVMIStatus(ctx, base, vmi); err != nil {
			return err
		}
	}
	return r.deleteTargetPods(ctx, vmim)
}

func ptrNow() *metav1.Time {
	now := metav1.Now()
	return &now
}

func (r *Reconciler) deleteTargetPods(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration) error {
	pods, err := listTargetPods(ctx, r.apiReader(), vmim)
	if err != nil {
		return err
	}
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("delete target pod %s: %w", p.Name, err)
		}
		ctrl.LoggerFrom(ctx).Info("deleted target pod", "pod", p.Name)
	}
	return nil
}

// deletePod deletes a launcher pod of the instance by name, checking it is one.
func (r *Reconciler) deletePod(ctx context.Context, namespace, name string, vmiUID types.UID) error {
	p := &corev1.Pod{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, p); err != nil {
		return client.IgnoreNotFound(err)
	}
	if p.DeletionTimestamp != nil || p.Labels[v1alpha1.VMIUIDLabel] != string(vmiUID) {
		return nil
	}
	if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("deleted source pod", "pod", name)
	return nil
}

// reconcileDelete cancels a migration that is deleted while in flight. It reports whether the
// finalizer may go.
func (r *Reconciler) reconcileDelete(ctx context.Context, vmim *v1alpha1.VirtualMachineInstanceMigration) (bool, ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(vmim, v1alpha1.MigrationFinalizer) {
		return false, ctrl.Result{}, nil
	}
	if vmim.Status.Phase == v1alpha1.MigrationSucceeded {
		return true, ctrl.Result{}, nil
	}
	vmi, err := r.getVMI(ctx, vmim)
	if err != nil {
		return false, ctrl.Result{}, err
	}
	const abortMsg = "the migration was deleted"
	ms := ownState(vmi, vmim.UID)
	now := time.Now()
	switch {
	case ms != nil && ms.Completed && !ms.Failed:
		// Too late to cancel: the guest runs on the target.
		var tp *corev1.Pod
		if pods, err := listTargetPods(ctx, r.apiReader(), vmim); err != nil {
			return false, ctrl.Result{}, err
		} else {
			tp = currentTargetPod(pods)
		}
		if err := r.finishSucceeded(ctx, vmim, vmi, tp); err != nil {
			return false, ctrl.Result{}, err
		}
		copyState(vmim, vmi)
		r.setPhase(vmim, v1alpha1.MigrationSucceeded, ReasonMigrationSucceeded, "the migration completed before it could be aborted")
		return true, ctrl.Result{}, nil

	case openState(ms) && tooLateToAbort(ms):
		// Too late to abort: the target's node agent decides who runs the guest, or the guest
		// already runs on the target (post-copy). Only a target pod that is gone or has ended
		// fails it (decidePhase).
		pods, err := listTargetPods(ctx, r.apiReader(), vmim)
		if err != nil {
			return false, ctrl.Result{}, err
		}
		if tp := currentTargetPod(pods); tp != nil && !podEnded(tp) {
			return false, ctrl.Result{RequeueAfter: time.Second}, nil
		}
		if err := r.finishFailed(ctx, vmim, vmi, "the target pod ended after the source handed the guest over"); err != nil {
			return false, ctrl.Result{}, err
		}
		copyState(vmim, vmi)
		r.fail(vmim, ReasonAborted, abortMsg)
		return true, ctrl.Result{}, nil

	case ms == nil && phaseOrder[vmim.Status.Phase] >= phaseOrder[v1alpha1.MigrationPreparingTarget] &&
		!isTerminal(vmim.Status.Phase) && vmi != nil && now.Before(vmim.DeletionTimestamp.Add(r.abortGrace())):
		// The instance's status in the cache predates the migration state this reconciler wrote.
		return false, ctrl.Result{RequeueAfter: time.Second}, nil

	case ms != nil && !ms.Failed && ms.StartTimestamp != nil:
		// Under way: the source node agent must cancel it before the target goes.
		if !ms.AbortRequested {
			if err := r.requestAbort(ctx, vmim, vmi, ReasonAborted, abortMsg); err != nil {
				return false, ctrl.Result{}, err
			}
			copyState(vmim, vmi)
			return false, ctrl.Result{RequeueAfter: r.abortGrace()}, nil
		}
		since := conditionSince(vmim, ConditionAbortRequested)
		if since == nil {
			t := vmim.DeletionTimestamp.Time
			since = &t
		}
		if deadline := since.Add(r.abortGrace()); now.Before(deadline) {
			return false, ctrl.Result{RequeueAfter: deadline.Sub(now)}, nil
		}
		ctrl.LoggerFrom(ctx).Info("the node agent did not confirm the abort in time; removing the target pod", "grace", r.abortGrace())

	case ms != nil && !ms.Failed:
		// Not started: close the state so no node agent starts it, and set abortRequested as the
		// contract asks. A conflict means a node agent wrote meanwhile; the retry sees what it wrote.
		base := vmi.DeepCopy()
		vmi.Status.MigrationState.AbortRequested = true
		vmi.Status.MigrationState.Failed = true
		vmi.Status.MigrationState.FailureReason = "aborted: " + abortMsg + " before it started"
		vmi.Status.MigrationState.EndTimestamp = ptrNow()
		if err := r.patchVMIStatus(ctx, base, vmi); err != nil {
			return false, ctrl.Result{}, err
		}
		r.setCondition(vmim, ConditionAbortRequested, metav1.ConditionTrue, ReasonAborted, abortMsg, false)
	}
	if err := r.deleteTargetPods(ctx, vmim); err != nil {
		return false, ctrl.Result{}, err
	}
	copyState(vmim, vmi)
	if !isTerminal(vmim.Status.Phase) {
		r.fail(vmim, ReasonAborted, abortMsg)
	}
	return true, ctrl.Result{}, nil
}

// fail records a failed migration.
func (r *Reconciler) fail(vmim *v1alpha1.VirtualMachineInstanceMigration, reason, message string) {
	r.setCondition(vmim, ConditionFailed, metav1.ConditionTrue, reason, message, false)
	r.setPhase(vmim, v1alpha1.MigrationFailed, reason, message)
}

// setPhase enters a phase, records when, and tells the user.
func (r *Reconciler) setPhase(vmim *v1alpha1.VirtualMachineInstanceMigration, phase v1alpha1.VirtualMachineInstanceMigrationPhase, reason, message string) {
	if vmim.Status.Phase == phase {
		return
	}
	vmim.Status.Phase = phase
	vmim.Status.PhaseTransitionTimestamps = append(vmim.Status.PhaseTransitionTimestamps,
		v1alpha1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{Phase: phase, PhaseTransitionTimestamp: metav1.Now()})
	if reason == "" {
		reason = string(phase)
	}
	if message == "" {
		message = "the migration entered phase " + string(phase)
	}
	typ := corev1.EventTypeNormal
	if phase == v1alpha1.MigrationFailed {
		typ = corev1.EventTypeWarning
	}
	r.event(vmim, typ, reason, "%s", message)
}

// setCondition sets a condition; with eventOnChange it also tells the user when the reason changes.
func (r *Reconciler) setCondition(vmim *v1alpha1.VirtualMachineInstanceMigration, typ string, status metav1.ConditionStatus,
	reason, message string, eventOnChange bool) {
	old := meta.FindStatusCondition(vmim.Status.Conditions, typ)
	changed := old == nil || old.Status != status || old.Reason != reason
	patch.SetCondition(&vmim.Status.Conditions, vmim, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message})
	if eventOnChange && changed {
		r.event(vmim, corev1.EventTypeNormal, reason, "%s", message)
	}
}

// phaseSince is when the migration entered its current phase; zero when not recorded.
func phaseSince(vmim *v1alpha1.VirtualMachineInstanceMigration) time.Time {
	ts := vmim.Status.PhaseTransitionTimestamps
	for i := len(ts) - 1; i >= 0; i-- {
		if ts[i].Phase == vmim.Status.Phase {
			return ts[i].PhaseTransitionTimestamp.Time
		}
	}
	return time.Time{}
}

// conditionSince is when a True condition became True, or nil.
func conditionSince(vmim *v1alpha1.VirtualMachineInstanceMigration, typ string) *time.Time {
	c := meta.FindStatusCondition(vmim.Status.Conditions, typ)
	if c == nil || c.Status != metav1.ConditionTrue {
		return nil
	}
	t := c.LastTransitionTime.Time
	return &t
}

func (r *Reconciler) event(obj runtime.Object, typ, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, typ, reason, format, args...)
	}
}

// SetupWithManager watches migrations, their target pods (by the migration UID label) and their
// instances (through the spec.vmiName index). The controller keeps one worker: the parallel limits
// count what earlier reconciles wrote, which concurrent workers would race on.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	ctx := context.Background()
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &v1alpha1.VirtualMachineInstanceMigration{}, VMINameField, func(o client.Object) []string {
		return []string{o.(*v1alpha1.VirtualMachineInstanceMigration).Spec.VMIName}
	}); err != nil {
		return fmt.Errorf("index migrations by %s: %w", VMINameField, err)
	}
	if err := idx.IndexField(ctx, &v1alpha1.VirtualMachineInstanceMigration{}, UIDField, func(o client.Object) []string {
		return []string{string(o.GetUID())}
	}); err != nil {
		return fmt.Errorf("index migrations by %s: %w", UIDField, err)
	}
	targetPods := predicate.NewPredicateFuncs(func(o client.Object) bool {
		_, ok := o.GetLabels()[v1alpha1.MigrationUIDLabel]
		return ok
	})
	return ctrl.NewControllerManagedBy(mgr).Named("migration").
		For(&v1alpha1.VirtualMachineInstanceMigration{}).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.podToMigration), builder.WithPredicates(targetPods)).
		Watches(&v1alpha1.VirtualMachineInstance{}, handler.EnqueueRequestsFromMapFunc(r.vmiToMigrations)).
		Complete(r)
}

func (r *Reconciler) podToMigration(ctx context.Context, o client.Object) []reconcile.Request {
	uid := o.GetLabels()[v1alpha1.MigrationUIDLabel]
	if uid == "" {
		return nil
	}
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{UIDField: uid}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "map target pod to its migration", "pod", o.GetName())
		return nil
	}
	return requests(list.Items)
}

func (r *Reconciler) vmiToMigrations(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{VMINameField: o.GetName()}); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "map instance to its migrations", "vmi", o.GetName())
		return nil
	}
	return requests(list.Items)
}

// requests are the migrations that still have something to do.
func requests(items []v1alpha1.VirtualMachineInstanceMigration) []reconcile.Request {
	var out []reconcile.Request
	for i := range items {
		m := &items[i]
		if isTerminal(m.Status.Phase) && m.DeletionTimestamp == nil {
			continue
		}
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(m)})
	}
	return out
}
