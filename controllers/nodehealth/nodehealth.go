// Package nodehealth is qvirt-controller's watch over the nodes and their node agents.
//
// A node whose agent stopped beating (its heartbeat annotation older than a timeout, or gone) is
// marked unschedulable, so no new launcher pod lands there. Its instances are left alone: an agent
// outage (a crash loop, an OOM kill, a bad rollout) is not a guest failure, and the guests keep
// running in their launcher pods while the agent is away.
//
// An instance is failed (reason NodeUnresponsive, so its VM's runStrategy can start it elsewhere)
// only when its node itself is lost: the Node's Ready condition has not been True for the timeout
// (the kubelet and its containers are gone or cut off). An instance whose launcher pod is gone is
// failed by the VMI reconciler (PodDeleted); that covers a deleted Node too, whose pods the pod
// garbage collector deletes.
//
// Who sets schedulable: the node agent sets "true" on every beat and "false" when it stops
// cleanly; this reconciler only ever sets "false". A dead node therefore becomes schedulable again
// exactly when its agent beats again, never because someone else touched the Node.
//
// There is no polling: each node is reconciled when it changes and requeued at its own deadline
// (heartbeat + timeout). Heartbeat-only updates are filtered out, since the deadline requeue sees
// the newer heartbeat anyway, so a beating node costs one reconcile per timeout.
package nodehealth

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/patch"
)

const (
	// DefaultTimeout is how long a node agent may go without a heartbeat, and a node without being
	// Ready, before it counts as gone; KubeVirt's default.
	DefaultTimeout = 5 * time.Minute

	// ReasonNodeUnresponsive is the status.reason of an instance failed here, and its Event's reason.
	ReasonNodeUnresponsive = "NodeUnresponsive"

	// VMINodeIndex indexes cached instances by status.nodeName.
	VMINodeIndex = "nodehealth.qvirt.io/vmi-node"
)

// Reconciler reconciles Nodes that carry a qvirt node agent.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// Timeout is how old a heartbeat may get; DefaultTimeout when zero.
	Timeout time.Duration
	// Now is the clock; time.Now when nil.
	Now func() time.Time
}

// NodeSelector selects the nodes a node agent ever labelled. A manager running this reconciler
// limits its Node cache to it (cache.Options.ByObject), so nodes without qvirt cost nothing. The
// agent sets the label on its first beat and nothing removes it; a node whose label an operator
// removes by hand drops out of this watch.
func NodeSelector() labels.Selector {
	req, err := labels.NewRequirement(v1alpha1.NodeSchedulableLabel, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant key: cannot fail
	}
	return labels.NewSelector().Add(*req)
}

// SetupWithManager registers the reconciler. Nodes are watched whole (their Ready condition);
// instances are watched to catch one placed on a node already found lost.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.VirtualMachineInstance{}, VMINodeIndex, func(o client.Object) []string {
		if n := o.(*v1alpha1.VirtualMachineInstance).Status.NodeName; n != "" {
			return []string{n}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("index instances by status.nodeName: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).Named("nodehealth").
		For(&corev1.Node{}, builder.WithPredicates(notHeartbeatOnly())).
		Watches(&v1alpha1.VirtualMachineInstance{}, handler.EnqueueRequestsFromMapFunc(vmiNode),
			builder.WithPredicates(placedOnNode())).
		Complete(r)
}

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch

// Reconcile checks one node: an agent without a recent heartbeat makes its node unschedulable, a
// node lost (not Ready for the timeout) fails its instances, and a node that may yet
// turn dead or lost is requeued at that deadline. A write that lost to a newer version is requeued
// (patch.Result).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return patch.Result(r.reconcile(ctx, req))
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	now := r.now()
	node := &corev1.Node{}
	if err := r.Client.Get(ctx, req.NamespacedName, node); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	h := Check(node, r.timeout(), now)
	if !h.Managed {
		return ctrl.Result{}, nil
	}
	var errs []error
	if h.Dead && node.Labels[v1alpha1.NodeSchedulableLabel] != "false" {
		if err := r.markUnschedulable(ctx, node); err != nil {
			errs = append(errs, err)
		} else {
			ctrl.LoggerFrom(ctx).Info("node agent unresponsive: node marked unschedulable; its guests keep running", "why", h.Why)
		}
	}
	l := Lost(node, r.timeout(), now)
	if l.Lost {
		if err := r.failInstances(ctx, req.Name, l.Why, now); err != nil {
			errs = append(errs, err)
		}
	}
	// The agent's next beat (which sets schedulable=true) and the kubelet's Ready are Node updates.
	return ctrl.Result{RequeueAfter: nextCheck(now, h, l)}, kerrors.NewAggregate(errs)
}

// nextCheck is how long until the node may turn dead or lost without any update to it; 0 when
// only an update can change what was found.
func nextCheck(now time.Time, h Health, l Loss) time.Duration {
	var next time.Time
	for _, d := range []time.Time{h.Deadline, l.Deadline} {
		if d.After(now) && (next.IsZero() || d.Before(next)) {
			next = d
		}
	}
	if next.IsZero() {
		return 0
	}
	return next.Sub(now)
}

// markUnschedulable sets schedulable=false unless the node changed since it was read: a beat that
// just arrived must not be overwritten.
func (r *Reconciler) markUnschedulable(ctx context.Context, node *corev1.Node) error {
	base := node.DeepCopy()
	node.Labels = maps.Clone(node.Labels)
	node.Labels[v1alpha1.NodeSchedulableLabel] = "false"
	err := r.Client.Patch(ctx, node, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		// A conflict is requeued (patch.Result): the newer version's event may be a heartbeat,
		// which notHeartbeatOnly filters out, so nothing else would bring the node back.
		return fmt.Errorf("mark node %s unschedulable: %w", node.Name, err)
	}
	return nil
}

// failInstances ends every unfinished instance whose status.nodeName is the node.
func (r *Reconciler) failInstances(ctx context.Context, nodeName, why string, now time.Time) error {
	var list v1alpha1.VirtualMachineInstanceList
	if err := r.Client.List(ctx, &list, client.MatchingFields{VMINodeIndex: nodeName}); err != nil {
		return fmt.Errorf("list instances on node %s: %w", nodeName, err)
	}
	var errs []error
	for i := range list.Items {
		if err := r.failInstance(ctx, &list.Items[i], nodeName, why, now); err != nil {
			errs = append(errs, err)
		}
	}
	return kerrors.NewAggregate(errs)
}

func (r *Reconciler) failInstance(ctx context.Context, inst *v1alpha1.VirtualMachineInstance, nodeName, why string, now time.Time) error {
	if inst.Status.Phase.Final() {
		return nil
	}
	status := patch.NewStatus(r.Client, inst)
	t := metav1.NewTime(now)
	inst.Status.SetPhase(v1alpha1.Failed, t)
	inst.Status.Reason = ReasonNodeUnresponsive
	msg := fmt.Sprintf("Node %s is lost: %s", nodeName, why)
	if meta.FindStatusCondition(inst.Status.Conditions, v1alpha1.VirtualMachineInstanceReady) != nil {
		// Nobody else will ever update it: the node agent that owns it is gone.
		patch.SetCondition(&inst.Status.Conditions, inst, metav1.Condition{
			Type: v1alpha1.VirtualMachineInstanceReady, Status: metav1.ConditionFalse,
			Reason: ReasonNodeUnresponsive, Message: msg, LastTransitionTime: t,
		})
	}
	// The optimistic lock keeps a stale cache from failing an instance that moved on meanwhile
	// (migrated away, or ended by its agent just before it died).
	_, err := status.Patch(ctx, inst)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fail instance: %w", err)
	}
	r.Recorder.Event(inst, corev1.EventTypeWarning, ReasonNodeUnresponsive, msg)
	ctrl.LoggerFrom(ctx).Info("instance failed: node lost", "vmi", client.ObjectKeyFromObject(inst), "node", nodeName)
	return nil
}

// Health is what a node's metadata says about its agent.
type Health struct {
	// Managed: a node agent labelled or beat on this node at some time.
	Managed bool
	// Dead: the heartbeat is missing, unreadable or older than the timeout; Why says which.
	Dead bool
	Why  string
	// Deadline is when a live node turns dead without a newer beat.
	Deadline time.Time
}

// Check judges a node from its labels and annotations at now. It is pure.
func Check(node metav1.Object, timeout time.Duration, now time.Time) Health {
	_, labelled := node.GetLabels()[v1alpha1.NodeSchedulableLabel]
	beat, beating := node.GetAnnotations()[v1alpha1.NodeHeartbeatAnnotation]
	if !labelled && !beating {
		return Health{}
	}
	if !beating {
		return Health{Managed: true, Dead: true, Why: "its heartbeat annotation " + v1alpha1.NodeHeartbeatAnnotation + " is gone"}
	}
	last, err := time.Parse(time.RFC3339, beat)
	if err != nil {
		return Health{Managed: true, Dead: true, Why: fmt.Sprintf("its heartbeat %q is not an RFC 3339 time", beat)}
	}
	deadline := last.Add(timeout)
	if !now.Before(deadline) {
		return Health{Managed: true, Dead: true, Deadline: deadline,
			Why: fmt.Sprintf("last heartbeat at %s, more than %s ago", last.UTC().Format(time.RFC3339), timeout)}
	}
	return Health{Managed: true, Deadline: deadline}
}

// Loss is what a node's Ready condition says about the node itself.
type Loss struct {
	// Lost: Ready has not been True for the timeout; Why says since when.
	Lost bool
	Why  string
	// Deadline is when a node that is not Ready now counts as lost.
	Deadline time.Time
}

// Lost judges a node from its Ready condition at now. A node that never reported one (no kubelet
// has run it) is not judged: nothing says its pods are gone. It is pure.
func Lost(node *corev1.Node, timeout time.Duration, now time.Time) Loss {
	var ready *corev1.NodeCondition
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			ready = &node.Status.Conditions[i]
		}
	}
	if ready == nil || ready.Status == corev1.ConditionTrue {
		return Loss{}
	}
	since := ready.LastTransitionTime.Time
	deadline := since.Add(timeout)
	if now.Before(deadline) {
		return Loss{Deadline: deadline}
	}
	return Loss{Lost: true, Deadline: deadline, Why: fmt.Sprintf("its Ready condition is %s (%s) since %s, more than %s ago",
		ready.Status, ready.Reason, since.UTC().Format(time.RFC3339), timeout)}
}

// notHeartbeatOnly drops Node updates that only advanced a heartbeat (the agent's annotation or the
// kubelet's condition times): the deadline requeue reads the newer beat when it comes due. Changes
// of labels, of the annotation's presence and of the Ready status pass.
func notHeartbeatOnly() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		if !ok || !ok2 || !maps.Equal(o.Labels, n.Labels) || readyStatus(o) != readyStatus(n) {
			return true
		}
		_, had := o.Annotations[v1alpha1.NodeHeartbeatAnnotation]
		_, has := n.Annotations[v1alpha1.NodeHeartbeatAnnotation]
		return had != has
	}}
}

func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// placedOnNode passes instances that are unfinished and on a node, when created or moved to one.
func placedOnNode() predicate.Predicate {
	onNode := func(o client.Object) bool {
		inst, ok := o.(*v1alpha1.VirtualMachineInstance)
		return ok && inst.Status.NodeName != "" && !inst.Status.Phase.Final()
	}
	return predicate.Funcs{
		CreateFunc: func(e event.CreateEvent) bool { return onNode(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok := e.ObjectOld.(*v1alpha1.VirtualMachineInstance)
			n, ok2 := e.ObjectNew.(*v1alpha1.VirtualMachineInstance)
			return ok && ok2 && onNode(n) && o.Status.NodeName != n.Status.NodeName
		},
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

func vmiNode(_ context.Context, o client.Object) []reconcile.Request {
	inst, ok := o.(*v1alpha1.VirtualMachineInstance)
	if !ok || inst.Status.NodeName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: inst.Status.NodeName}}}
}

func (r *Reconciler) timeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return DefaultTimeout
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}
