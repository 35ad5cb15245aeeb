package migration

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/qvirt/qvirt/api/v1alpha1"
	vmictrl "github.com/qvirt/qvirt/controllers/vmi"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) {
	// QVIRT_TEST_LOG=1 shows the reconciler's logs.
	if os.Getenv("QVIRT_TEST_LOG") != "" {
		ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 1}))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	envtest.Main(m, &cp)
}

// Neither the VMI reconciler, the node agent (qvirt-handler) nor the kubelet runs in these tests:
// the tests play them by creating the running instance and its source launcher pod, binding pods,
// writing pod status and writing the node agents' fields of vmi.status.migrationState.

const waitTimeout = 30 * time.Second

// testEnv is one test's namespace, configuration and running reconciler.
type testEnv struct {
	t     *testing.T
	ctx   context.Context
	ns    string
	store *config.Store
	// podCacheLag delays the reconciler's view of new pods (laggingPods).
	podCacheLag time.Duration
}

func setup(t *testing.T, mutate func(c *config.Config)) *testEnv {
	t.Helper()
	return setupWith(t, mutate, 0)
}

// setupWith is setup with a reconciler whose cache sees pods only podCacheLag after their creation.
func setupWith(t *testing.T, mutate func(c *config.Config), podCacheLag time.Duration) *testEnv {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "migration-test-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	c := config.Default()
	if mutate != nil {
		mutate(&c)
	}
	e := &testEnv{t: t, ctx: ctx, ns: ns.Name, store: config.NewStore(c), podCacheLag: podCacheLag}
	// Runs after the manager stopped: migrations left in flight would count against the
	// cluster-wide limit in later tests.
	t.Cleanup(e.finishMigrations)
	e.startManager(&Reconciler{PendingRequeue: 100 * time.Millisecond, AbortGrace: 3 * time.Second})
	return e
}

// startManager runs a manager with only the migration reconciler, caching only the test's namespace,
// until the test ends.
func (e *testEnv) startManager(r *Reconciler) {
	t := e.t
	t.Helper()
	opts := cp.ManagerOptions()
	// Launcher pods trimmed as qvirt-controller's cache trims them.
	opts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{e.ns: {}}, DefaultTransform: vmictrl.CacheTransform}
	mgr, err := ctrl.NewManager(cp.Config, opts)
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	r.Client, r.Scheme, r.Config = mgr.GetClient(), mgr.GetScheme(), e.store
	if e.podCacheLag > 0 {
		r.Client = laggingPods{Client: r.Client, lag: e.podCacheLag}
	}
	//lint:ignore SA1019 the cross-controller contract uses the core/v1 events recorder
	r.Recorder = mgr.GetEventRecorderFor("qvirt-migration")
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setup reconciler: %v", err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// finishMigrations marks the namespace's migrations Failed and removes them.
func (e *testEnv) finishMigrations() {
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := cp.Client.List(e.ctx, &list, client.InNamespace(e.ns)); err != nil {
		e.t.Errorf("list migrations: %v", err)
		return
	}
	for i := range list.Items {
		m := &list.Items[i]
		if !isTerminal(m.Status.Phase) {
			m.Status.Phase = v1alpha1.MigrationFailed
			if err := cp.Client.Status().Update(e.ctx, m); err != nil && !apierrors.IsNotFound(err) {
				e.t.Errorf("finish migration %s: %v", m.Name, err)
			}
		}
		m.Finalizers = nil
		if err := cp.Client.Update(e.ctx, m); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("remove finalizers of migration %s: %v", m.Name, err)
		}
		if err := cp.Client.Delete(e.ctx, m); client.IgnoreNotFound(err) != nil {
			e.t.Errorf("delete migration %s: %v", m.Name, err)
		}
	}
}

// eventually polls cond until it returns true or the timeout passes; the last message says why not.
func (e *testEnv) eventually(what string, cond func() (bool, string)) {
	e.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s: %s", what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runningVMI plays the VMI reconciler and the node agent: an instance Running on node in its source
// launcher pod. bridge puts the pod network on the bridge binding, which cannot live-migrate.
func (e *testEnv) runningVMI(name, node string, bridge bool) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
	e.t.Helper()
	return e.runningVMIWith(name, node, bridge, nil)
}

// runningVMIWith is runningVMI with a hook to change the source pod before it is created; a pod
// given a nodeName is not bound again.
func (e *testEnv) runningVMIWith(name, node string, bridge bool, mutatePod func(*corev1.Pod)) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
	t := e.t
	t.Helper()
	iface := v1alpha1.Interface{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}
	if bridge {
		iface = v1alpha1.Interface{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}
	}
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns, Labels: map[string]string{"app": "web"}},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{
				Resources: v1alpha1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("512Mi")}},
				Devices:   v1alpha1.Devices{Interfaces: []v1alpha1.Interface{iface}},
			},
			Networks: []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}},
		},
	}
	if err := cp.Client.Create(e.ctx, vmi); err != nil {
		t.Fatalf("create vmi: %v", err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "qvirt-launcher-" + name + "-", Namespace: e.ns,
			Labels: map[string]string{v1alpha1.AppLabel: v1alpha1.LauncherApp, v1alpha1.VMINameLabel: name,
				v1alpha1.VMIUIDLabel: string(vmi.UID), "app": "web"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "VirtualMachineInstance",
				Name: name, UID: vmi.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "launcher", Image: "example/qvirt-launcher:test",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("620Mi"), corev1.ResourceCPU: resource.MustParse("100m")}},
		}}},
	}
	if mutatePod != nil {
		mutatePod(pod)
	}
	if err := cp.Client.Create(e.ctx, pod); err != nil {
		t.Fatalf("create source pod: %v", err)
	}
	if pod.Spec.NodeName == "" {
		e.runPod(pod, node)
	} else {
		e.setPodPhase(pod, corev1.PodRunning)
	}
	e.updateVMIStatus(vmi, func(s *v1alpha1.VirtualMachineInstanceStatus) {
		s.Phase = v1alpha1.Running
		s.NodeName = node
		s.ActivePods = map[types.UID]string{pod.UID: node}
	})
	return vmi, pod
}

// runPod plays kube-scheduler and the kubelet: binds the pod to node and reports it Running.
func (e *testEnv) runPod(pod *corev1.Pod, node string) {
	e.t.Helper()
	e.bind(pod, node)
	e.setPodPhase(pod, corev1.PodRunning)
}

// bind plays kube-scheduler placing pod on node.
func (e *testEnv) bind(pod *corev1.Pod, node string) {
	e.t.Helper()
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	if err := cp.Client.SubResource("binding").Create(e.ctx, pod, binding); err != nil {
		e.t.Fatalf("bind pod %s: %v", pod.Name, err)
	}
}

// setPodPhase plays the kubelet reporting a pod's phase.
func (e *testEnv) setPodPhase(pod *corev1.Pod, phase corev1.PodPhase) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		pod.Status.Phase = phase
		return cp.Client.Status().Update(e.ctx, pod)
	})
	if err != nil {
		e.t.Fatalf("set phase of pod %s: %v", pod.Name, err)
	}
}

// updateVMIStatus writes the instance's status as the VMI reconciler or a node agent would.
func (e *testEnv) updateVMIStatus(vmi *v1alpha1.VirtualMachineInstance, mutate func(s *v1alpha1.VirtualMachineInstanceStatus)) {
	e.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(vmi), vmi); err != nil {
			return err
		}
		mutate(&vmi.Status)
		return cp.Client.Status().Update(e.ctx, vmi)
	})
	if err != nil {
		e.t.Fatalf("update status of vmi %s: %v", vmi.Name, err)
	}
}

// agent plays a node agent writing its fields of the instance's migration state.
func (e *testEnv) agent(vmi *v1alpha1.VirtualMachineInstance, mutate func(ms *v1alpha1.VirtualMachineInstanceMigrationState)) {
	e.t.Helper()
	e.updateVMIStatus(vmi, func(s *v1alpha1.VirtualMachineInstanceStatus) {
		if s.MigrationState == nil {
			e.t.Fatalf("vmi %s has no migration state", vmi.Name)
		}
		mutate(s.MigrationState)
	})
}

func (e *testEnv) getVMI(vmi *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	e.t.Helper()
	got := &v1alpha1.VirtualMachineInstance{}
	if err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(vmi), got); err != nil {
		e.t.Fatalf("get vmi %s: %v", vmi.Name, err)
	}
	return got
}

func (e *testEnv) migrate(name, vmi string) *v1alpha1.VirtualMachineInstanceMigration {
	e.t.Helper()
	m := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
	}
	if err := cp.Client.Create(e.ctx, m); err != nil {
		e.t.Fatalf("create migration %s: %v", name, err)
	}
	return m
}

func (e *testEnv) getMigration(m *v1alpha1.VirtualMachineInstanceMigration) (*v1alpha1.VirtualMachineInstanceMigration, error) {
	got := &v1alpha1.VirtualMachineInstanceMigration{}
	err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(m), got)
	return got, err
}

// waitPhase waits for a migration to reach phase and returns it.
func (e *testEnv) waitPhase(m *v1alpha1.VirtualMachineInstanceMigration, phase v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
	e.t.Helper()
	var got *v1alpha1.VirtualMachineInstanceMigration
	e.eventually(fmt.Sprintf("migration %s %s", m.Name, phase), func() (bool, string) {
		var err error
		got, err = e.getMigration(m)
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == phase, fmt.Sprintf("phase %s, conditions %+v", got.Status.Phase, got.Status.Conditions)
	})
	return got
}

// targetPods lists the pods carrying the migration's label.
func (e *testEnv) targetPods(m *v1alpha1.VirtualMachineInstanceMigration) []corev1.Pod {
	e.t.Helper()
	var pods corev1.PodList
	if err := cp.Client.List(e.ctx, &pods, client.InNamespace(e.ns), client.MatchingLabels{v1alpha1.MigrationUIDLabel: string(m.UID)}); err != nil {
		e.t.Fatalf("list target pods: %v", err)
	}
	return pods.Items
}

// waitTargetPod waits for the migration's single target pod.
func (e *testEnv) waitTargetPod(m *v1alpha1.VirtualMachineInstanceMigration) *corev1.Pod {
	e.t.Helper()
	var pod *corev1.Pod
	e.eventually("target pod of "+m.Name, func() (bool, string) {
		got, err := e.getMigration(m)
		if err != nil {
			return false, err.Error()
		}
		m.UID = got.UID
		pods := e.targetPods(m)
		if len(pods) != 1 {
			return false, fmt.Sprintf("%d target pods", len(pods))
		}
		pod = &pods[0]
		return true, ""
	})
	return pod
}

// podGone reports whether a pod was deleted: removed, or terminating (no kubelet finishes it here).
func (e *testEnv) podGone(pod *corev1.Pod) (bool, string) {
	got := &corev1.Pod{}
	err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(pod), got)
	if apierrors.IsNotFound(err) {
		return true, ""
	}
	if err != nil {
		return false, err.Error()
	}
	return got.DeletionTimestamp != nil, "pod " + pod.Name + " still exists"
}

func condition(m *v1alpha1.VirtualMachineInstanceMigration, typ string) *metav1.Condition {
	return meta.FindStatusCondition(m.Status.Conditions, typ)
}

func (e *testEnv) assertFailed(m *v1alpha1.VirtualMachineInstanceMigration, reason string) {
	e.t.Helper()
	got := e.waitPhase(m, v1alpha1.MigrationFailed)
	c := condition(got, ConditionFailed)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
		e.t.Fatalf("Failed condition = %+v, want reason %s", c, reason)
	}
	e.waitReleased(m)
}

// waitReleased waits until finished migration m holds no finalizer: finishing it cleaned up, and
// one that stayed would need qvirt-controller to delete it (an uninstall would leave it, and its
// CRD, Terminating).
func (e *testEnv) waitReleased(m *v1alpha1.VirtualMachineInstanceMigration) {
	e.t.Helper()
	e.eventually("the finished migration's finalizer released", func() (bool, string) {
		cur, err := e.getMigration(m)
		if err != nil {
			return apierrors.IsNotFound(err), err.Error()
		}
		return !controllerutil.ContainsFinalizer(cur, v1alpha1.MigrationFinalizer), fmt.Sprint("finalizers ", cur.Finalizers)
	})
}

// driveToRunning plays kube-scheduler, the kubelet and both node agents up to a started migration.
func (e *testEnv) driveToRunning(m *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance, node string) *corev1.Pod {
	e.t.Helper()
	tp := e.waitTargetPod(m)
	e.waitPhase(m, v1alpha1.MigrationScheduling)
	e.runPod(tp, node)
	e.waitPhase(m, v1alpha1.MigrationPreparingTarget)
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.TargetReady, ms.TargetNodeAddress = true, "10.0.0.2"
	})
	e.waitPhase(m, v1alpha1.MigrationTargetReady)
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.StartTimestamp = ptr.To(metav1.Now()) })
	e.waitPhase(m, v1alpha1.MigrationRunning)
	return tp
}

func TestMigrationSucceeds(t *testing.T) {
	e := setup(t, nil)
	vmi, source := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)

	tp := e.waitTargetPod(m)
	// The target pod is a copy of the source pod that must land elsewhere.
	terms := tp.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
		t.Fatalf("target pod node affinity = %+v", terms)
	}
	if r := terms[0].MatchExpressions[0]; r.Key != corev1.LabelHostname || r.Operator != corev1.NodeSelectorOpNotIn ||
		len(r.Values) != 1 || r.Values[0] != "node-a" {
		t.Errorf("target pod node affinity = %+v, want %s NotIn [node-a]", r, corev1.LabelHostname)
	}
	if tp.Spec.NodeName != "" || tp.Spec.Containers[0].Image != source.Spec.Containers[0].Image ||
		!tp.Spec.Containers[0].Resources.Requests.Memory().Equal(*source.Spec.Containers[0].Resources.Requests.Memory()) {
		t.Errorf("target pod spec differs from the source's: %+v", tp.Spec)
	}
	if tp.Labels[v1alpha1.VMIUIDLabel] != string(vmi.UID) || tp.Labels["app"] != "web" {
		t.Errorf("target pod labels = %v", tp.Labels)
	}
	if owner := metav1.GetControllerOf(tp); owner == nil || owner.UID != vmi.UID || len(tp.OwnerReferences) != 1 {
		t.Errorf("target pod owners = %+v, want only the instance", tp.OwnerReferences)
	}

	e.waitPhase(m, v1alpha1.MigrationScheduling)
	e.runPod(tp, "node-b")
	e.waitPhase(m, v1alpha1.MigrationPreparingTarget)
	ms := e.getVMI(vmi).Status.MigrationState
	if ms == nil || ms.MigrationUID != m.UID || ms.SourceNode != "node-a" || ms.SourcePod != source.Name ||
		ms.TargetNode != "node-b" || ms.TargetPod != tp.Name {
		t.Fatalf("vmi migration state = %+v", ms)
	}
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.TargetReady, ms.TargetNodeAddress = true, "10.0.0.2"
	})
	e.waitPhase(m, v1alpha1.MigrationTargetReady)
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.StartTimestamp = ptr.To(metav1.Now()) })
	e.waitPhase(m, v1alpha1.MigrationRunning)
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.Completed, ms.EndTimestamp = true, ptr.To(metav1.Now())
	})
	got := e.waitPhase(m, v1alpha1.MigrationSucceeded)
	e.waitReleased(m)

	after := e.getVMI(vmi)
	if after.Status.NodeName != "node-b" {
		t.Errorf("vmi nodeName = %q, want node-b", after.Status.NodeName)
	}
	if len(after.Status.ActivePods) != 1 || after.Status.ActivePods[tp.UID] != "node-b" {
		t.Errorf("vmi activePods = %v, want {%s: node-b}", after.Status.ActivePods, tp.UID)
	}
	e.eventually("source pod deleted", func() (bool, string) { return e.podGone(source) })
	if ok, msg := e.podGone(tp); ok {
		t.Errorf("the target pod must stay: %s", msg)
	}
	if got.Status.MigrationState == nil || !got.Status.MigrationState.Completed || got.Status.MigrationState.TargetNode != "node-b" {
		t.Errorf("migration's migrationState = %+v", got.Status.MigrationState)
	}
	var phases []v1alpha1.VirtualMachineInstanceMigrationPhase
	for _, p := range got.Status.PhaseTransitionTimestamps {
		phases = append(phases, p.Phase)
	}
	want := []v1alpha1.VirtualMachineInstanceMigrationPhase{v1alpha1.MigrationPending, v1alpha1.MigrationScheduling,
		v1alpha1.MigrationScheduled, v1alpha1.MigrationPreparingTarget, v1alpha1.MigrationTargetReady,
		v1alpha1.MigrationRunning, v1alpha1.MigrationSucceeded}
	if fmt.Sprint(phases) != fmt.Sprint(want) {
		t.Errorf("phase transitions = %v, want %v", phases, want)
	}

	// The instance can migrate again, back from node-b; the former target pod is now the source.
	m2 := e.migrate("mig-back", vmi.Name)
	tp2 := e.waitTargetPod(m2)
	if r := tp2.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions; len(r) != 1 || r[0].Values[0] != "node-b" {
		t.Errorf("second target pod node affinity = %+v, want NotIn [node-b] only", r)
	}
	e.waitPhase(m2, v1alpha1.MigrationScheduling)
	e.runPod(tp2, "node-a")
	e.waitPhase(m2, v1alpha1.MigrationPreparingTarget)
	if ms := e.getVMI(vmi).Status.MigrationState; ms.SourcePod != tp.Name || ms.TargetPod != tp2.Name || ms.Completed {
		t.Errorf("second migration state = %+v", ms)
	}
}

func TestTargetPodFailure(t *testing.T) {
	e := setup(t, nil)
	vmi, source := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	tp := e.waitTargetPod(m)
	e.runPod(tp, "node-b")
	e.waitPhase(m, v1alpha1.MigrationPreparingTarget)

	e.setPodPhase(tp, corev1.PodFailed)
	e.assertFailed(m, ReasonTargetPodFailed)
	e.eventually("target pod deleted", func() (bool, string) { return e.podGone(tp) })
	after := e.getVMI(vmi)
	if after.Status.NodeName != "node-a" || after.Status.ActivePods[source.UID] != "node-a" {
		t.Errorf("vmi moved: nodeName %q activePods %v", after.Status.NodeName, after.Status.ActivePods)
	}
	if ms := after.Status.MigrationState; ms == nil || !ms.Failed || ms.Completed {
		t.Errorf("vmi migration state = %+v, want failed", ms)
	}
	if ok, _ := e.podGone(source); ok {
		t.Errorf("source pod was deleted")
	}
}

// laggingPods is a cache that learns of a migration's target pod only lag after its creation, as
// an informer under load does.
type laggingPods struct {
	client.Client
	lag time.Duration
}

func (c laggingPods) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.Client.List(ctx, list, opts...); err != nil {
		return err
	}
	if pods, ok := list.(*corev1.PodList); ok {
		pods.Items = slices.DeleteFunc(pods.Items, func(p corev1.Pod) bool {
			return p.Labels[v1alpha1.MigrationUIDLabel] != "" && time.Since(p.CreationTimestamp.Time) < c.lag
		})
	}
	return nil
}

// A target pod that the cache does not hold yet is not a target pod that is gone: seen in e2e,
// the migration failed with "the target pod is gone" the moment after it created the pod.
func TestTargetPodNotYetCached(t *testing.T) {
	e := setupWith(t, nil, 3*time.Second)
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	e.waitTargetPod(m)
	e.waitPhase(m, v1alpha1.MigrationScheduling)
	time.Sleep(4 * time.Second) // past the lag, with the reconciler woken by the pod's events
	var got v1alpha1.VirtualMachineInstanceMigration
	if err := cp.Client.Get(e.ctx, client.ObjectKeyFromObject(m), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase == v1alpha1.MigrationFailed {
		t.Fatalf("the migration failed while its target pod was not in the cache yet: %+v", got.Status.Conditions)
	}
}

func TestTargetPodDeletedWhileScheduling(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	tp := e.waitTargetPod(m)
	e.waitPhase(m, v1alpha1.MigrationScheduling)
	if err := cp.Client.Delete(e.ctx, tp); err != nil {
		t.Fatalf("delete target pod: %v", err)
	}
	e.assertFailed(m, ReasonTargetPodDeleted)
}

func TestNodeAgentReportsFailure(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	tp := e.driveToRunning(m, vmi, "node-b")
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.Failed, ms.FailureReason, ms.EndTimestamp = true, "connection reset", ptr.To(metav1.Now())
	})
	e.assertFailed(m, ReasonMigrationFailed)
	e.eventually("target pod deleted", func() (bool, string) { return e.podGone(tp) })
	if got := e.getVMI(vmi); got.Status.NodeName != "node-a" {
		t.Errorf("vmi nodeName = %q, want node-a", got.Status.NodeName)
	}
}

func TestCancelByDeletion(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	tp := e.driveToRunning(m, vmi, "node-b")

	if err := cp.Client.Delete(e.ctx, m); err != nil {
		t.Fatalf("delete migration: %v", err)
	}
	e.eventually("abortRequested", func() (bool, string) {
		ms := e.getVMI(vmi).Status.MigrationState
		return ms != nil && ms.AbortRequested, fmt.Sprintf("%+v", ms)
	})
	// The node agent has not confirmed: the target pod stays and the migration waits.
	time.Sleep(500 * time.Millisecond)
	if ok, _ := e.podGone(tp); ok {
		t.Fatalf("target pod removed before the node agent confirmed the abort")
	}
	if _, err := e.getMigration(m); err != nil {
		t.Fatalf("migration gone before the node agent confirmed the abort: %v", err)
	}
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.Failed, ms.FailureReason = true, "aborted"
	})
	e.eventually("target pod deleted", func() (bool, string) { return e.podGone(tp) })
	e.eventually("migration gone", func() (bool, string) {
		_, err := e.getMigration(m)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if got := e.getVMI(vmi); got.Status.NodeName != "node-a" {
		t.Errorf("vmi nodeName = %q, want node-a", got.Status.NodeName)
	}
}

func TestCancelBeforeStart(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	tp := e.waitTargetPod(m)
	e.runPod(tp, "node-b")
	e.waitPhase(m, v1alpha1.MigrationPreparingTarget)

	if err := cp.Client.Delete(e.ctx, m); err != nil {
		t.Fatalf("delete migration: %v", err)
	}
	e.eventually("migration gone", func() (bool, string) {
		_, err := e.getMigration(m)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if ok, msg := e.podGone(tp); !ok {
		t.Errorf("target pod not deleted: %s", msg)
	}
	if ms := e.getVMI(vmi).Status.MigrationState; ms == nil || !ms.AbortRequested || !ms.Failed {
		t.Errorf("vmi migration state = %+v, want abortRequested and failed", ms)
	}
}

func TestCancelNotConfirmedWithinGrace(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	tp := e.driveToRunning(m, vmi, "node-b")
	if err := cp.Client.Delete(e.ctx, m); err != nil {
		t.Fatalf("delete migration: %v", err)
	}
	// AbortGrace is 3s in these tests; the node agent never answers.
	e.eventually("target pod deleted", func() (bool, string) { return e.podGone(tp) })
	e.eventually("migration gone", func() (bool, string) {
		_, err := e.getMigration(m)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// TestDeletedDuringHandover deletes a migration whose source has handed the guest over, or that
// switched to post-copy (the guest runs on the target): it is too late to abort, so the target pod
// stays (its node agent decides who runs the guest, or runs it already) past the abort grace, and
// the migration completes as the target's agent reports.
func TestDeletedDuringHandover(t *testing.T) {
	for name, c := range map[string]struct {
		mark func(ms *v1alpha1.VirtualMachineInstanceMigrationState)
		seen func(ms *v1alpha1.VirtualMachineInstanceMigrationState) bool
	}{
		"handed over": {func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.SourceHandedOver = true },
			func(ms *v1alpha1.VirtualMachineInstanceMigrationState) bool { return ms.SourceHandedOver }},
		"in post-copy": {func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.Mode = v1alpha1.MigrationPostCopy },
			func(ms *v1alpha1.VirtualMachineInstanceMigrationState) bool {
				return ms.Mode == v1alpha1.MigrationPostCopy
			}},
	} {
		t.Run(name, func(t *testing.T) {
			e := setup(t, nil)
			vmi, _ := e.runningVMI("vm1", "node-a", false)
			m := e.migrate("mig", vmi.Name)
			tp := e.driveToRunning(m, vmi, "node-b")
			e.agent(vmi, c.mark)
			e.eventually("the mark seen", func() (bool, string) {
				got, err := e.getMigration(m)
				if err != nil {
					return false, err.Error()
				}
				return got.Status.MigrationState != nil && c.seen(got.Status.MigrationState), fmt.Sprintf("%+v", got.Status.MigrationState)
			})
			if err := cp.Client.Delete(e.ctx, m); err != nil {
				t.Fatalf("delete migration: %v", err)
			}
			// AbortGrace is 3s in these tests.
			time.Sleep(4 * time.Second)
			if ok, _ := e.podGone(tp); ok {
				t.Fatalf("target pod removed while the guest was the target's")
			}
			if ms := e.getVMI(vmi).Status.MigrationState; ms.Failed || ms.AbortRequested {
				t.Fatalf("vmi migration state = %+v: the migration was aborted", ms)
			}
			e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.Completed = true })
			e.eventually("vmi moved to node-b", func() (bool, string) {
				got := e.getVMI(vmi)
				return got.Status.NodeName == "node-b", got.Status.NodeName
			})
			e.eventually("migration gone", func() (bool, string) {
				_, err := e.getMigration(m)
				return apierrors.IsNotFound(err), fmt.Sprint(err)
			})
		})
	}
}

func TestMigrationTimesOut(t *testing.T) {
	// A 512Mi guest at 1 second per GiB may run one second.
	e := setup(t, func(c *config.Config) { c.Migrations.CompletionTimeoutPerGiB = 1 })
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	tp := e.driveToRunning(m, vmi, "node-b")
	e.eventually("abortRequested", func() (bool, string) {
		ms := e.getVMI(vmi).Status.MigrationState
		return ms != nil && ms.AbortRequested, fmt.Sprintf("%+v", ms)
	})
	// The VMI's abortRequested and the migration's condition are written by separate patches.
	e.eventually("AbortRequested condition with the timeout reason", func() (bool, string) {
		got, err := e.getMigration(m)
		if err != nil {
			return false, err.Error()
		}
		c := condition(got, ConditionAbortRequested)
		return c != nil && c.Reason == ReasonCompletionTimeout, fmt.Sprintf("%+v", c)
	})
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.Failed, ms.FailureReason = true, "aborted on request"
	})
	e.assertFailed(m, ReasonCompletionTimeout)
	e.eventually("target pod deleted", func() (bool, string) { return e.podGone(tp) })
}

func TestNotMigratable(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMI("vm1", "node-a", true)
	m := e.migrate("mig", vmi.Name)
	e.assertFailed(m, v1alpha1.InterfaceNotLiveMigratableReason)
	if pods := e.targetPods(m); len(pods) != 0 {
		t.Errorf("%d target pods created", len(pods))
	}
}

func TestVMINotRunningOrMissing(t *testing.T) {
	e := setup(t, nil)
	m := e.migrate("missing", "nope")
	e.assertFailed(m, ReasonVMINotFound)

	vmi, _ := e.runningVMI("vm1", "node-a", false)
	e.updateVMIStatus(vmi, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.Phase = v1alpha1.Scheduled })
	m2 := e.migrate("not-running", vmi.Name)
	e.assertFailed(m2, ReasonVMINotRunning)
}

func TestSecondMigrationOfSameVMI(t *testing.T) {
	e := setup(t, nil)
	vmi, _ := e.runningVMI("vm1", "node-a", false)
	first := e.migrate("first", vmi.Name)
	e.waitPhase(first, v1alpha1.MigrationScheduling)
	second := e.migrate("second", vmi.Name)
	e.assertFailed(second, ReasonMigrationInProgress)
	if got, _ := e.getMigration(first); got.Status.Phase != v1alpha1.MigrationScheduling {
		t.Errorf("first migration phase = %s, want Scheduling", got.Status.Phase)
	}
	if pods := e.targetPods(second); len(pods) != 0 {
		t.Errorf("second migration created %d target pods", len(pods))
	}
}

// limitCase runs three migrations whose third is held back by a limit until the first finishes.
func limitCase(t *testing.T, e *testEnv, nodes [3]string, wantReason string) {
	t.Helper()
	var ms [3]*v1alpha1.VirtualMachineInstanceMigration
	var vmis [3]*v1alpha1.VirtualMachineInstance
	for i := range ms {
		vmis[i], _ = e.runningVMI(fmt.Sprintf("vm%d", i), nodes[i], false)
	}
	for i := range 2 {
		ms[i] = e.migrate(fmt.Sprintf("mig%d", i), vmis[i].Name)
		e.waitPhase(ms[i], v1alpha1.MigrationScheduling)
	}
	ms[2] = e.migrate("mig2", vmis[2].Name)
	e.eventually("third migration held back", func() (bool, string) {
		got, err := e.getMigration(ms[2])
		if err != nil {
			return false, err.Error()
		}
		c := condition(got, ConditionAdmitted)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == wantReason, fmt.Sprintf("%+v", got.Status)
	})
	time.Sleep(500 * time.Millisecond)
	if got, _ := e.getMigration(ms[2]); got.Status.Phase != v1alpha1.MigrationPending || len(e.targetPods(ms[2])) != 0 {
		t.Fatalf("third migration phase %s with %d target pods, want Pending with none", got.Status.Phase, len(e.targetPods(ms[2])))
	}

	// The first one finishes; the third may go.
	tp := e.driveToRunning(ms[0], vmis[0], "node-z")
	_ = tp
	e.agent(vmis[0], func(s *v1alpha1.VirtualMachineInstanceMigrationState) { s.Completed = true })
	e.waitPhase(ms[0], v1alpha1.MigrationSucceeded)
	got := e.waitPhase(ms[2], v1alpha1.MigrationScheduling)
	if c := condition(got, ConditionAdmitted); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Admitted condition = %+v", c)
	}
	if got, _ := e.getMigration(ms[1]); got.Status.Phase != v1alpha1.MigrationScheduling {
		t.Errorf("second migration phase = %s", got.Status.Phase)
	}
}

func TestParallelOutboundPerNode(t *testing.T) {
	e := setup(t, func(c *config.Config) { c.Migrations.ParallelOutboundPerNode, c.Migrations.ParallelPerCluster = 2, 10 })
	limitCase(t, e, [3]string{"node-a", "node-a", "node-a"}, ReasonNodeLimitReached)

	// A migration leaving another node is not held back by node-a's limit.
	other, _ := e.runningVMI("vm-other", "node-c", false)
	m := e.migrate("mig-other", other.Name)
	e.waitPhase(m, v1alpha1.MigrationScheduling)
}

func TestParallelPerCluster(t *testing.T) {
	e := setup(t, func(c *config.Config) { c.Migrations.ParallelOutboundPerNode, c.Migrations.ParallelPerCluster = 5, 2 })
	limitCase(t, e, [3]string{"node-a", "node-b", "node-c"}, ReasonClusterLimitReached)
}
