package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/migration"
	"github.com/qvirt/qvirt/internal/config"
)

// EvictionPath is where the pods/eviction webhook is served.
const EvictionPath = "/validate-v1-pod-eviction"

// The eviction webhook sees every eviction in the cluster, so its failure policy is Ignore, as
// KubeVirt's virt-launcher-eviction-interceptor's is: a qvirt-controller that is down must not
// block the drain of nodes without VMs. The price (qvirt has no PodDisruptionBudget behind it, as
// KubeVirt has) is that while the controller is down an eviction stops a VM instead of moving it.
// The side effect (marking the instance) is skipped on dry runs.
// +kubebuilder:webhook:path=/validate-v1-pod-eviction,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=pods/eviction,verbs=create,versions=v1,name=veviction.qvirt.io,admissionReviewVersions=v1

// EvictionAdmitter turns evictions of launcher pods (the Eviction API, as `kubectl drain` and the
// descheduler use it) into evacuations, with KubeVirt's meaning of the instance's
// evictionStrategy (pkg/virt-api/webhooks/validating-webhook/admitters/pod-eviction-admitter.go
// and docs/handling-eviction-requests.md in kubevirt/kubevirt):
//
//   - None: the eviction goes through; the instance stops with its pod and its run strategy
//     decides what follows.
//   - LiveMigrate: a live-migratable instance is marked (status.evacuationNodeName) and the
//     eviction refused with 429 TooManyRequests, which `kubectl drain` retries; the evacuation
//     controller (controllers/migration) migrates it away and the source pod goes with the
//     migration's success. A non-migratable one is refused with the reason.
//   - LiveMigrateIfPossible: as LiveMigrate when migratable, otherwise as None.
//   - External: marked and refused; an outside controller acts on the mark.
//
// Once marked, later evictions are refused (429) with how the evacuation stands, where KubeVirt
// lets them go to a PodDisruptionBudget that refuses them.
type EvictionAdmitter struct {
	// Reader reads the evicted pod, its instance and the instance's migrations from
	// kube-apiserver, not from the manager's cache: a cache that has not caught up with a new
	// launcher pod, or with the instance's Running status, would let the eviction through and stop
	// the guest, and a replica that does not lead holds no cache of them (controllers.Setup).
	// Evictions are rare (a drain), so the reads cost nothing that matters.
	Reader client.Reader
	// Client marks instances.
	Client client.Client
	Config *config.Store
}

// Handle implements admission.Handler.
func (a *EvictionAdmitter) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.SubResource != "eviction" {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := a.Reader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: req.Name}, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed("")
		}
		return tooManyRequests(fmt.Sprintf("qvirt could not read pod %s/%s: %v", req.Namespace, req.Name, err))
	}
	vmiName := pod.Labels[v1alpha1.VMINameLabel]
	if pod.Labels[v1alpha1.AppLabel] != v1alpha1.LauncherApp || vmiName == "" || pod.DeletionTimestamp != nil {
		return admission.Allowed("")
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := a.Reader.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: vmiName}, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Allowed("")
		}
		return tooManyRequests(fmt.Sprintf("qvirt could not read VMI %s/%s: %v", req.Namespace, vmiName, err))
	}
	return a.decide(ctx, pod, vmi, isDryRun(req))
}

// isDryRun: an eviction's dry run is asked in its body (deleteOptions.dryRun, as `kubectl drain
// --dry-run=server` sends it), which kube-apiserver does not reflect in the request's dryRun.
func isDryRun(req admission.Request) bool {
	if req.DryRun != nil && *req.DryRun {
		return true
	}
	var ev policyv1.Eviction
	if err := json.Unmarshal(req.Object.Raw, &ev); err != nil {
		return true // unreadable: do nothing that a dry run must not do
	}
	return ev.DeleteOptions != nil && slices.Contains(ev.DeleteOptions.DryRun, metav1.DryRunAll)
}

// decide is the answer to an eviction of pod, a launcher pod of vmi.
func (a *EvictionAdmitter) decide(ctx context.Context, pod *corev1.Pod, vmi *v1alpha1.VirtualMachineInstance, dryRun bool) admission.Response {
	key := vmi.Namespace + "/" + vmi.Name
	// A pod that is not the instance's current one (a migration's target, or a source the
	// instance has left) holds no guest that an eviction would stop; nor does a finished instance.
	if vmi.Status.Phase.Final() || vmi.Status.NodeName == "" || pod.Spec.NodeName != vmi.Status.NodeName ||
		string(vmi.UID) != pod.Labels[v1alpha1.VMIUIDLabel] {
		return admission.Allowed("")
	}
	strategy := a.Config.Get().EvictionStrategyFor(&vmi.Spec)
	migratable, why := isMigratable(vmi)
	switch strategy {
	case v1alpha1.EvictionStrategyLiveMigrate:
		if !migratable {
			return tooManyRequests(fmt.Sprintf("VMI %s has evictionStrategy LiveMigrate but is not live-migratable: %s", key, why))
		}
	case v1alpha1.EvictionStrategyLiveMigrateIfPossible:
		if !migratable {
			return admission.Allowed("VMI " + key + " is not live-migratable: it stops with its pod")
		}
	case v1alpha1.EvictionStrategyExternal:
	default:
		return admission.Allowed("")
	}
	if vmi.Status.EvacuationNodeName != "" {
		return tooManyRequests(fmt.Sprintf("Evacuation in progress for VMI %s: %s", key, a.progress(ctx, vmi, strategy)))
	}
	if !dryRun {
		if err := markForEvacuation(ctx, a.Client, vmi, pod.Spec.NodeName); err != nil {
			return tooManyRequests(fmt.Sprintf("qvirt could not mark VMI %s for evacuation: %v", key, err))
		}
		ctrl.LoggerFrom(ctx).Info("eviction of a launcher pod marked its instance for evacuation",
			"pod", pod.Name, "vmi", key, "node", pod.Spec.NodeName, "evictionStrategy", strategy)
	}
	if strategy == v1alpha1.EvictionStrategyExternal {
		return tooManyRequests(fmt.Sprintf("Eviction marked VMI %s for evacuation by an external controller (evictionStrategy External, status.evacuationNodeName %s)", key, pod.Spec.NodeName))
	}
	return tooManyRequests(fmt.Sprintf("Eviction triggered evacuation of VMI %s: it live-migrates off node %s and the pod goes once it has left", key, pod.Spec.NodeName))
}

// progress says how the evacuation of vmi stands, for the refusal of a repeated eviction.
func (a *EvictionAdmitter) progress(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, strategy v1alpha1.EvictionStrategy) string {
	if strategy == v1alpha1.EvictionStrategyExternal {
		return "waiting for an external controller to move it off node " + vmi.Status.EvacuationNodeName
	}
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := a.Reader.List(ctx, &list, client.InNamespace(vmi.Namespace)); err != nil {
		return "migrating it off node " + vmi.Status.EvacuationNodeName
	}
	return migration.PlanEvacuation(vmi, list.Items, metav1.Now().Time).Describe()
}

// isMigratable reads the instance's LiveMigratable condition, as KubeVirt's vmi.IsMigratable does;
// an instance without it yet is judged from its spec.
func isMigratable(vmi *v1alpha1.VirtualMachineInstance) (bool, string) {
	if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable); c != nil {
		return c.Status == metav1.ConditionTrue, c.Message
	}
	ok, _, msg := v1alpha1.LiveMigratable(&vmi.Spec)
	return ok, msg
}

// markForEvacuation sets status.evacuationNodeName, locked on the version read, so that an
// instance that moved meanwhile is not marked for the node it left.
func markForEvacuation(ctx context.Context, c client.Client, vmi *v1alpha1.VirtualMachineInstance, node string) error {
	base := vmi.DeepCopy()
	vmi.Status.EvacuationNodeName = node
	return c.Status().Patch(ctx, vmi, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
}

// tooManyRequests refuses an eviction the way the Eviction API refuses one a disruption budget
// forbids: 429, which `kubectl drain` retries every few seconds.
func tooManyRequests(msg string) admission.Response {
	return admission.Response{AdmissionResponse: admissionv1.AdmissionResponse{
		Allowed: false,
		Result:  &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests, Message: msg},
	}}
}
