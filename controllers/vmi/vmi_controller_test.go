package vmi

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) {
	ctrl.SetLogger(logr.New(errorSink{}))
	envtest.Main(m, &cp)
}

// errorSink prints errors only: the tests assert outcomes, and informational logs of thousands of
// reconciles would bury a failure.
type errorSink struct{ name string }

func (errorSink) Init(logr.RuntimeInfo)    {}
func (errorSink) Enabled(int) bool         { return false }
func (errorSink) Info(int, string, ...any) {}
func (s errorSink) Error(err error, msg string, kv ...any) {
	fmt.Fprintf(os.Stderr, "ERROR %s: %s: %v %v\n", s.name, msg, err, kv)
}
func (s errorSink) WithValues(...any) logr.LogSink { return s }
func (s errorSink) WithName(name string) logr.LogSink {
	if s.name != "" {
		name = s.name + "." + name
	}
	return errorSink{name: name}
}

// The node agent (qvirt-handler) and the kubelet do not exist in these tests: the tests play their
// part by binding pods, writing pod status and force-deleting terminating pods.

const waitTimeout = 30 * time.Second

// emulationConfig is the configuration most tests run with: TCG, as on these machines.
func emulationConfig() *config.Store {
	c := config.Default()
	c.UseEmulation = true
	return config.NewStore(c)
}

// newNamespace creates a namespace for one test; managers started for the test watch only it.
func newNamespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vmi-test-"}}
	if err := cp.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return ns.Name
}

// managerOptions are the options the tests and the benchmark run the reconciler's manager with: the
// cache limited to the namespace and to launcher pods, trimmed as qvirt-controller trims them.
func managerOptions(ns string) ctrl.Options {
	opts := cp.ManagerOptions()
	opts.Cache = cache.Options{
		DefaultNamespaces: map[string]cache.Config{ns: {}},
		DefaultTransform:  CacheTransform,
		ByObject:          map[client.Object]cache.ByObject{&corev1.Pod{}: {Label: LauncherPodSelector()}},
	}
	return opts
}

// startManager runs a manager with the VMI reconciler until the returned stop is called (or the
// test ends). stop waits for the manager to finish.
func startManager(t testing.TB, ns string, store *config.Store, cfg *rest.Config) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(cfg, managerOptions(ns))
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	r := &Reconciler{
		Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Config: store, APIReader: mgr.GetAPIReader(),
		//lint:ignore SA1019 the cross-controller contract uses the core/v1 events recorder
		Recorder: mgr.GetEventRecorderFor("qvirt-vmi"),
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setup reconciler: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

func newVMI(ns, name string) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{
			Resources: v1alpha1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("512Mi"), corev1.ResourceCPU: resource.MustParse("250m"),
			}},
		}},
	}
}

// eventually polls cond until it returns true or the timeout passes; the last message says why not.
func eventually(t testing.TB, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var msg string
	for {
		var ok bool
		ok, msg = cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getVMI(t testing.TB, v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	got := &v1alpha1.VirtualMachineInstance{}
	if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(v), got); err != nil {
		t.Fatalf("get vmi %s: %v", v.Name, err)
	}
	return got
}

// podsOf lists the launcher pods carrying the instance's UID label, straight from the API server.
func podsOf(t testing.TB, v *v1alpha1.VirtualMachineInstance) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	if err := cp.Client.List(context.Background(), &list, client.InNamespace(v.Namespace),
		client.MatchingLabels{v1alpha1.VMIUIDLabel: string(v.UID)}); err != nil {
		t.Fatalf("list pods: %v", err)
	}
	return list.Items
}

func waitPod(t testing.TB, v *v1alpha1.VirtualMachineInstance) corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	eventually(t, "a launcher pod for "+v.Name, func() (bool, string) {
		pods = podsOf(t, v)
		return len(pods) == 1, fmt.Sprintf("%d pods", len(pods))
	})
	return pods[0]
}

func waitPhase(t testing.TB, v *v1alpha1.VirtualMachineInstance, phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	var got *v1alpha1.VirtualMachineInstance
	eventually(t, fmt.Sprintf("vmi %s in phase %s", v.Name, phase), func() (bool, string) {
		got = getVMI(t, v)
		return got.Status.Phase == phase, fmt.Sprintf("phase %q reason %q", got.Status.Phase, got.Status.Reason)
	})
	return got
}

// runPod plays the scheduler and the kubelet: binds the pod to node and reports it Running.
func runPod(t testing.TB, pod *corev1.Pod, node string) {
	t.Helper()
	ctx := context.Background()
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	if err := cp.Client.SubResource("binding").Create(ctx, pod, binding); err != nil {
		t.Fatalf("bind pod: %v", err)
	}
	setPodPhase(t, pod, corev1.PodRunning, "")
}

// setPodPhase plays the kubelet reporting the pod's phase.
func setPodPhase(t testing.TB, pod *corev1.Pod, phase corev1.PodPhase, reason string) {
	t.Helper()
	ctx := context.Background()
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatalf("get pod: %v", err)
	}
	pod.Status.Phase = phase
	pod.Status.Reason = reason
	if err := cp.Client.Status().Update(ctx, pod); err != nil {
		t.Fatalf("update pod status: %v", err)
	}
}

// eventsFor lists the Events about an object as "Type Reason: message".
func eventsFor(t testing.TB, obj client.Object) []string {
	t.Helper()
	var list corev1.EventList
	if err := cp.Client.List(context.Background(), &list, client.InNamespace(obj.GetNamespace())); err != nil {
		t.Fatalf("list events: %v", err)
	}
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.UID == obj.GetUID() {
			out = append(out, e.Type+" "+e.Reason+": "+e.Message)
		}
	}
	return out
}

// waitEvent waits for an Event about obj whose "Type Reason: message" starts with prefix.
func waitEvent(t testing.TB, obj client.Object, prefix string) {
	t.Helper()
	eventually(t, "event "+prefix, func() (bool, string) {
		evs := eventsFor(t, obj)
		for _, e := range evs {
			if strings.HasPrefix(e, prefix) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %q", evs)
	})
}

func TestInstanceGetsLauncherPodAndIsScheduled(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()
	v := newVMI(ns, "web")
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}

	pod := waitPod(t, v)
	if !strings.HasPrefix(pod.Name, "qvirt-launcher-web-") {
		t.Errorf("pod name %q, want generated from qvirt-launcher-web-", pod.Name)
	}
	for k, want := range map[string]string{
		v1alpha1.AppLabel: v1alpha1.LauncherApp, v1alpha1.VMINameLabel: "web", v1alpha1.VMIUIDLabel: string(v.UID), "app": "web",
	} {
		if got := pod.Labels[k]; got != want {
			t.Errorf("pod label %s = %q, want %q", k, got, want)
		}
	}
	owner := metav1.GetControllerOf(&pod)
	if owner == nil || owner.UID != v.UID || owner.Kind != "VirtualMachineInstance" || !ptr.Deref(owner.BlockOwnerDeletion, false) {
		t.Errorf("pod controller = %+v, want the VMI with blockOwnerDeletion", owner)
	}
	res := pod.Spec.Containers[0].Resources
	// 512Mi guest and 101Mi overhead, with 48Mi for emulation's translation cache (the test
	// cluster uses emulation).
	if q := res.Requests[corev1.ResourceMemory]; q.String() != "661Mi" {
		t.Errorf("requests.memory = %s, want 661Mi", q.String())
	}
	if q := res.Requests[corev1.ResourceCPU]; q.String() != "250m" {
		t.Errorf("requests.cpu = %s, want 250m", q.String())
	}
	if _, ok := res.Requests[v1alpha1.KVMResource]; ok {
		t.Errorf("pod requests %s under emulation", v1alpha1.KVMResource)
	}
	if q := res.Limits[v1alpha1.TunResource]; q.Value() != 1 {
		t.Errorf("limits[%s] = %s, want 1", v1alpha1.TunResource, q.String())
	}

	got := waitPhase(t, v, v1alpha1.Scheduling)
	if !controllerutil.ContainsFinalizer(got, v1alpha1.GracefulShutdownFinalizer) {
		t.Errorf("finalizers %v lack %s", got.Finalizers, v1alpha1.GracefulShutdownFinalizer)
	}
	var phases []v1alpha1.VirtualMachineInstancePhase
	for _, p := range got.Status.PhaseTransitionTimestamps {
		phases = append(phases, p.Phase)
	}
	if fmt.Sprint(phases) != "[Pending Scheduling]" {
		t.Errorf("phase transitions %v, want [Pending Scheduling]", phases)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("LiveMigratable = %+v, want True", c)
	}
	waitEvent(t, v, "Normal "+EventSuccessfulCreate+": Created launcher pod "+pod.Name)

	runPod(t, &pod, "node-1")
	got = waitPhase(t, v, v1alpha1.Scheduled)
	if got.Status.NodeName != "node-1" || got.Status.ActivePods[pod.UID] != "node-1" {
		t.Errorf("nodeName %q activePods %v, want node-1 and {%s: node-1}", got.Status.NodeName, got.Status.ActivePods, pod.UID)
	}
	waitEvent(t, v, "Normal "+EventScheduled+": Launcher pod "+pod.Name+" running on node node-1")
	if n := len(podsOf(t, v)); n != 1 {
		t.Errorf("%d launcher pods, want 1", n)
	}
}

func TestPodFailureFailsInstance(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()

	t.Run("pod failed", func(t *testing.T) {
		v := newVMI(ns, "crashes")
		if err := cp.Client.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		pod := waitPod(t, v)
		runPod(t, &pod, "node-1")
		waitPhase(t, v, v1alpha1.Scheduled)
		setPodPhase(t, &pod, corev1.PodFailed, "Evicted")
		got := waitPhase(t, v, v1alpha1.Failed)
		if got.Status.Reason != ReasonPodFailed {
			t.Errorf("reason %q, want %s", got.Status.Reason, ReasonPodFailed)
		}
		waitEvent(t, v, "Warning "+EventPodFailed+": Launcher pod "+pod.Name+" failed: Evicted")
		// A failed instance gets no new pod.
		time.Sleep(time.Second)
		if n := len(podsOf(t, v)); n != 1 {
			t.Errorf("%d pods after failure, want only the failed one", n)
		}
	})

	t.Run("pod deleted while Scheduled", func(t *testing.T) {
		v := newVMI(ns, "loses-pod")
		if err := cp.Client.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		pod := waitPod(t, v)
		runPod(t, &pod, "node-1")
		waitPhase(t, v, v1alpha1.Scheduled)
		// A bound pod only goes away once its kubelet confirms; play it with grace 0.
		if err := cp.Client.Delete(ctx, &pod, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
		got := waitPhase(t, v, v1alpha1.Failed)
		if got.Status.Reason != ReasonPodDeleted {
			t.Errorf("reason %q, want %s", got.Status.Reason, ReasonPodDeleted)
		}
		waitEvent(t, v, "Warning "+EventPodDeleted+": Launcher pod disappeared while the instance was Scheduled")
		time.Sleep(time.Second)
		if n := len(podsOf(t, v)); n != 0 {
			t.Errorf("%d pods after the pod was deleted, want none: a failed instance gets no new pod", n)
		}
	})
}

func TestDeletingInstanceDeletesPodFirst(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()
	v := newVMI(ns, "goes")
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, v)
	runPod(t, &pod, "node-1")
	waitPhase(t, v, v1alpha1.Scheduled)

	if err := cp.Client.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	// The pod is asked to terminate (the launcher shuts the guest down), the instance waits for it.
	eventually(t, "launcher pod terminating", func() (bool, string) {
		pods := podsOf(t, v)
		return len(pods) == 1 && pods[0].DeletionTimestamp != nil, fmt.Sprintf("pods %d", len(pods))
	})
	waitEvent(t, v, "Normal "+EventSuccessfulDelete+": Deleted launcher pod "+pod.Name)
	got := getVMI(t, v)
	if got.DeletionTimestamp == nil || !controllerutil.ContainsFinalizer(got, v1alpha1.GracefulShutdownFinalizer) {
		t.Fatalf("instance released while its pod terminates: finalizers %v", got.Finalizers)
	}

	// The kubelet confirms the pod is gone.
	if err := cp.Client.Delete(ctx, &pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(t, "instance gone", func() (bool, string) {
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(v), &v1alpha1.VirtualMachineInstance{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
	})
	if n := len(podsOf(t, v)); n != 0 {
		t.Errorf("%d pods left", n)
	}
}

func TestDeletingUnscheduledInstance(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()
	v := newVMI(ns, "short")
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	waitPod(t, v)
	if err := cp.Client.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	// An unbound pod is deleted at once, so the instance goes without anyone's help.
	eventually(t, "instance and pod gone", func() (bool, string) {
		err := cp.Client.Get(ctx, client.ObjectKeyFromObject(v), &v1alpha1.VirtualMachineInstance{})
		n := len(podsOf(t, v))
		return apierrors.IsNotFound(err) && n == 0, fmt.Sprintf("get: %v, pods %d", err, n)
	})
}

func TestRestartDuringCreationMakesOnePodPerInstance(t *testing.T) {
	ns := newNamespace(t)
	store := emulationConfig()
	stop := startManager(t, ns, store, cp.Config)
	ctx := context.Background()
	const total = 50
	var vmis []*v1alpha1.VirtualMachineInstance
	for i := range total {
		v := newVMI(ns, fmt.Sprintf("vm-%02d", i))
		if err := cp.Client.Create(ctx, v); err != nil {
			t.Fatal(err)
		}
		vmis = append(vmis, v)
		if i == total/2 {
			// Mid-stream, while the first manager is busy creating pods: replace it.
			stop()
			startManager(t, ns, store, cp.Config)
		}
	}
	for _, v := range vmis {
		waitPod(t, v)
		waitPhase(t, v, v1alpha1.Scheduling)
	}
	// Give a duplicate every chance to appear before counting.
	time.Sleep(2 * time.Second)
	var list corev1.PodList
	if err := cp.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	perVMI := map[string]int{}
	for _, p := range list.Items {
		perVMI[p.Labels[v1alpha1.VMIUIDLabel]]++
	}
	for _, v := range vmis {
		if n := perVMI[string(v.UID)]; n != 1 {
			t.Errorf("vmi %s has %d launcher pods, want exactly 1", v.Name, n)
		}
	}
	if len(list.Items) != total {
		t.Errorf("%d pods for %d instances", len(list.Items), total)
	}
}

func TestBridgeOnPodNetworkIsNotLiveMigratable(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	v := newVMI(ns, "bridged")
	v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}
	if err := cp.Client.Create(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	eventually(t, "LiveMigratable=False", func() (bool, string) {
		c := meta.FindStatusCondition(getVMI(t, v).Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.InterfaceNotLiveMigratableReason, fmt.Sprintf("condition %+v", c)
	})
}

func TestSourcePodRemovedAfterMigrationKeepsInstance(t *testing.T) {
	ns := newNamespace(t)
	store := emulationConfig()
	startManager(t, ns, store, cp.Config)
	ctx := context.Background()
	v := newVMI(ns, "moves")
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	source := waitPod(t, v)
	runPod(t, &source, "node-1")
	v = waitPhase(t, v, v1alpha1.Scheduled)

	// Play the migration reconciler: a target pod on node-2 (rendered the same way, plus the
	// migration label), then on success the instance moves to it and the source pod goes.
	target, err := RenderLauncherPod(v, store.Get(), nil)
	if err != nil {
		t.Fatal(err)
	}
	target.Labels[v1alpha1.MigrationUIDLabel] = "migration-1"
	if err := controllerutil.SetControllerReference(v, target, cp.Scheme); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Create(ctx, target); err != nil {
		t.Fatal(err)
	}
	runPod(t, target, "node-2")
	time.Sleep(500 * time.Millisecond)
	if got := getVMI(t, v); got.Status.Phase != v1alpha1.Scheduled || got.Status.NodeName != "node-1" {
		t.Fatalf("a target pod changed the instance: phase %s node %s", got.Status.Phase, got.Status.NodeName)
	}

	base := v.DeepCopy()
	v.Status.NodeName = "node-2"
	v.Status.ActivePods = map[types.UID]string{target.UID: "node-2"}
	if err := cp.Client.Status().Patch(ctx, v, client.MergeFrom(base)); err != nil {
		t.Fatal(err)
	}
	if err := cp.Client.Delete(ctx, &source, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	got := getVMI(t, v)
	if got.Status.Phase != v1alpha1.Scheduled || got.Status.NodeName != "node-2" {
		t.Fatalf("after migration: phase %s (reason %q) node %s, want Scheduled on node-2", got.Status.Phase, got.Status.Reason, got.Status.NodeName)
	}
	if pods := podsOf(t, v); len(pods) != 1 || pods[0].UID != target.UID {
		t.Errorf("pods after migration: %d, want only the target", len(pods))
	}

	// The target pod is now the instance's pod: losing it ends the instance.
	if err := cp.Client.Delete(ctx, target, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	if got := waitPhase(t, v, v1alpha1.Failed); got.Status.Reason != ReasonPodDeleted {
		t.Errorf("reason %q, want %s", got.Status.Reason, ReasonPodDeleted)
	}
}

// TestLauncherPodGetsProbes: the instance's tcpSocket readiness probe and httpGet liveness probe
// become the compute container's, which the API server accepts and defaults as for any pod, so
// the kubelet probes the guest at the pod IP.
func TestLauncherPodGetsProbes(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, ns, emulationConfig(), cp.Config)
	ctx := context.Background()
	v := newVMI(ns, "probed")
	v.Spec.ReadinessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}},
		InitialDelaySeconds: 3, PeriodSeconds: 2, FailureThreshold: 4}
	v.Spec.LivenessProbe = &v1alpha1.Probe{Handler: v1alpha1.Handler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080), Path: "/healthz",
		HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Probe", Value: "qvirt"}}}}, InitialDelaySeconds: 120, TimeoutSeconds: 5}
	if err := cp.Client.Create(ctx, v); err != nil {
		t.Fatal(err)
	}
	pod := waitPod(t, v)
	c := pod.Spec.Containers[0]
	wantReady := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}},
		InitialDelaySeconds: 3, TimeoutSeconds: 1, PeriodSeconds: 2, SuccessThreshold: 1, FailureThreshold: 4}
	if !equality.Semantic.DeepEqual(c.ReadinessProbe, wantReady) {
		t.Errorf("compute container readinessProbe = %+v, want %+v", c.ReadinessProbe, wantReady)
	}
	wantLive := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(8080), Path: "/healthz",
		Scheme: corev1.URISchemeHTTP, HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Probe", Value: "qvirt"}}}},
		InitialDelaySeconds: 120, TimeoutSeconds: 5, PeriodSeconds: 10, SuccessThreshold: 1, FailureThreshold: 3}
	if !equality.Semantic.DeepEqual(c.LivenessProbe, wantLive) {
		t.Errorf("compute container livenessProbe = %+v, want %+v", c.LivenessProbe, wantLive)
	}
}
