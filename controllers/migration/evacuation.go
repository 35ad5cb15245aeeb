package migration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
)

// Evacuation backoff, as KubeVirt's migration controller applies it to evacuation migrations
// (handleMigrationBackoff): none before the first attempt, 20 s after the first failure, doubling
// after each further one. qvirt caps it so a long drain still retries every few minutes.
const (
	EvacuationFirstBackoff = 20 * time.Second
	EvacuationMaxBackoff   = 5 * time.Minute
)

// Reasons of the evacuation's Events on the instance.
const (
	ReasonEvacuationStarted = "EvacuationMigrationCreated"
	// ReasonEvacuationBackoff: earlier evacuation migrations failed; the next waits (KubeVirt's
	// MigrationBackoff).
	ReasonEvacuationBackoff = "MigrationBackoff"
)

// EvacuationReconciler migrates instances marked for evacuation (status.evacuationNodeName, set
// by the pods/eviction webhook of controllers/admission) off their node, as KubeVirt's evacuation
// controller does: one VirtualMachineInstanceMigration at a time, annotated
// v1alpha1.EvacuationMigrationAnnotation, retried with a growing backoff when it fails. Instances
// with evictionStrategy External are left to the outside controller the mark is for. The
// migration Reconciler clears the mark when the instance leaves the node.
type EvacuationReconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	Config   *config.Store
	// APIReader lists the instance's migrations around the cache before one is created: a
	// migration this reconciler created a moment ago and the cache has not seen yet must not get
	// a twin (which the migration reconciler would fail, counting as a failed attempt).
	// SetupWithManager sets the manager's when nil.
	APIReader client.Reader
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstancemigrations,verbs=create
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile starts the next evacuation migration of one instance when it is due.
func (r *EvacuationReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := r.Client.Get(ctx, req.NamespacedName, vmi); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	node := vmi.Status.EvacuationNodeName
	if node == "" || !vmi.DeletionTimestamp.IsZero() || vmi.Status.Phase != v1alpha1.Running || vmi.Status.NodeName != node {
		return ctrl.Result{}, nil
	}
	switch r.Config.Get().EvictionStrategyFor(&vmi.Spec) {
	case v1alpha1.EvictionStrategyLiveMigrate, v1alpha1.EvictionStrategyLiveMigrateIfPossible:
	default:
		return ctrl.Result{}, nil
	}
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := r.Client.List(ctx, &list, client.InNamespace(vmi.Namespace), client.MatchingFields{VMINameField: vmi.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("list migrations of %s: %w", vmi.Name, err)
	}
	plan := PlanEvacuation(vmi, list.Items, r.now())
	if plan.Active == nil && plan.Wait == 0 {
		// About to create one: decide again on what the API server has.
		var live v1alpha1.VirtualMachineInstanceMigrationList
		if err := r.APIReader.List(ctx, &live, client.InNamespace(vmi.Namespace)); err != nil {
			return ctrl.Result{}, fmt.Errorf("list migrations of %s: %w", vmi.Name, err)
		}
		plan = PlanEvacuation(vmi, live.Items, r.now())
	}
	switch {
	case plan.Active != nil:
		return ctrl.Result{}, nil
	case plan.Wait > 0:
		r.event(vmi, corev1.EventTypeWarning, ReasonEvacuationBackoff, "%s", plan.Describe())
		return ctrl.Result{RequeueAfter: plan.Wait}, nil
	}
	vmim := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: vmi.Namespace, GenerateName: vmi.Name + "-evacuation-",
			Labels:      map[string]string{v1alpha1.VMINameLabel: vmi.Name},
			Annotations: map[string]string{v1alpha1.EvacuationMigrationAnnotation: node},
		},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
	}
	if err := r.Client.Create(ctx, vmim); err != nil {
		return ctrl.Result{}, fmt.Errorf("create evacuation migration of %s: %w", vmi.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("created evacuation migration", "migration", vmim.Name, "node", node, "failedBefore", plan.Failed)
	r.event(vmi, corev1.EventTypeNormal, ReasonEvacuationStarted,
		"node %s is being drained: created migration %s to move the instance off it", node, vmim.Name)
	return ctrl.Result{}, nil
}

func (r *EvacuationReconciler) event(obj *v1alpha1.VirtualMachineInstance, typ, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, typ, reason, format, args...)
	}
}

func (r *EvacuationReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Evacuation is how the evacuation of an instance off a node stands.
type Evacuation struct {
	// Node is the node being left.
	Node string
	// Active is the evacuation migration under way, if any; any other migration of the
	// instance under way counts too (one migration per instance at a time).
	Active *v1alpha1.VirtualMachineInstanceMigration
	// Failed counts the evacuation migrations off Node that failed since the last one that
	// succeeded; LastFailure is the newest one's reason.
	Failed      int
	LastFailure string
	// Wait is how long until the next attempt is due; 0 when it is.
	Wait time.Duration
}

// PlanEvacuation decides, from an instance marked for evacuation and its migrations, whether a
// migration runs, and when the next one is due after failures.
func PlanEvacuation(vmi *v1alpha1.VirtualMachineInstance, migrations []v1alpha1.VirtualMachineInstanceMigration, now time.Time) Evacuation {
	ev := Evacuation{Node: vmi.Status.EvacuationNodeName}
	var ours []*v1alpha1.VirtualMachineInstanceMigration
	for i := range migrations {
		m := &migrations[i]
		if m.Spec.VMIName != vmi.Name {
			continue
		}
		if !isTerminal(m.Status.Phase) && m.DeletionTimestamp.IsZero() {
			ev.Active = m
		}
		if m.Annotations[v1alpha1.EvacuationMigrationAnnotation] == ev.Node {
			ours = append(ours, m)
		}
	}
	// Newest first.
	slices.SortFunc(ours, func(a, b *v1alpha1.VirtualMachineInstanceMigration) int {
		return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
	})
	var lastFailed time.Time
	for _, m := range ours {
		if m.Status.Phase == v1alpha1.MigrationSucceeded {
			break
		}
		if m.Status.Phase != v1alpha1.MigrationFailed {
			continue
		}
		ev.Failed++
		if ev.Failed == 1 {
			ev.LastFailure = failureMessage(m)
			lastFailed = failedAt(m)
		}
	}
	if ev.Active == nil && ev.Failed > 0 {
		backoff := EvacuationFirstBackoff << min(ev.Failed-1, 10)
		ev.Wait = max(lastFailed.Add(min(backoff, EvacuationMaxBackoff)).Sub(now), 0)
	}
	return ev
}

// Describe says how the evacuation stands, for people (the eviction's refusal, Events).
func (ev Evacuation) Describe() string {
	var b strings.Builder
	switch {
	case ev.Active != nil:
		phase := ev.Active.Status.Phase
		if phase == "" {
			phase = v1alpha1.MigrationPending
		}
		fmt.Fprintf(&b, "migration %s is %s", ev.Active.Name, phase)
	case ev.Wait > 0:
		fmt.Fprintf(&b, "next migration off node %s in %s", ev.Node, ev.Wait.Round(time.Second))
	default:
		fmt.Fprintf(&b, "a migration off node %s is being created", ev.Node)
	}
	if ev.Failed > 0 {
		fmt.Fprintf(&b, "; %d migration(s) off node %s failed before, the last: %s", ev.Failed, ev.Node, ev.LastFailure)
	}
	return b.String()
}

func failureMessage(m *v1alpha1.VirtualMachineInstanceMigration) string {
	if c := meta.FindStatusCondition(m.Status.Conditions, ConditionFailed); c != nil && c.Message != "" {
		return fmt.Sprintf("%s (%s: %s)", m.Name, c.Reason, c.Message)
	}
	if ms := m.Status.MigrationState; ms != nil && ms.FailureReason != "" {
		return fmt.Sprintf("%s (%s)", m.Name, ms.FailureReason)
	}
	return m.Name + " (no reason recorded)"
}

// failedAt is when the migration failed: its Failed phase transition, else its creation.
func failedAt(m *v1alpha1.VirtualMachineInstanceMigration) time.Time {
	for _, ts := range m.Status.PhaseTransitionTimestamps {
		if ts.Phase == v1alpha1.MigrationFailed {
			return ts.PhaseTransitionTimestamp.Time
		}
	}
	return m.CreationTimestamp.Time
}

// SetupWithManager watches instances and, through spec.vmiName, their migrations (the migration
// Reconciler registers that index; set it up first).
func (r *EvacuationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	return ctrl.NewControllerManagedBy(mgr).Named("evacuation").
		For(&v1alpha1.VirtualMachineInstance{}).
		Watches(&v1alpha1.VirtualMachineInstanceMigration{}, handler.EnqueueRequestsFromMapFunc(
			func(_ context.Context, o client.Object) []reconcile.Request {
				m := o.(*v1alpha1.VirtualMachineInstanceMigration)
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: m.Namespace, Name: m.Spec.VMIName}}}
			})).
		Complete(r)
}
