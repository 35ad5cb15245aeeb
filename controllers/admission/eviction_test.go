package admission_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/admission"
	"github.com/qvirt/qvirt/controllers/migration"
	"github.com/qvirt/qvirt/internal/config"
)

const evictNode = "node-a"

// evictee is a running instance on evictNode with its launcher pod, as the controllers and the
// node agent leave them.
func evictee(t *testing.T, ns, name string, strategy *v1alpha1.EvictionStrategy, migratable bool) (*v1alpha1.VirtualMachineInstance, *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	data := []byte(sampleYAML(t, "vmi_testguest.yaml"))
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := yaml.Unmarshal(data, vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Namespace, vmi.Name = ns, name
	vmi.Spec.EvictionStrategy = strategy
	if err := cp.Client.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.Running, evictNode
	cond := metav1.Condition{Type: v1alpha1.VirtualMachineInstanceIsMigratable, Status: metav1.ConditionTrue,
		Reason: v1alpha1.MigratableReason, Message: "the instance can be live-migrated"}
	if !migratable {
		cond.Status, cond.Reason = metav1.ConditionFalse, v1alpha1.InterfaceNotLiveMigratableReason
		cond.Message = `interface "default" uses the bridge binding on the pod network`
	}
	meta.SetStatusCondition(&vmi.Status.Conditions, cond)
	if err := cp.Client.Status().Update(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qvirt-launcher-" + name, Labels: map[string]string{
			v1alpha1.AppLabel: v1alpha1.LauncherApp, v1alpha1.VMINameLabel: name, v1alpha1.VMIUIDLabel: string(vmi.UID)}},
		Spec: corev1.PodSpec{NodeName: evictNode, Containers: []corev1.Container{{Name: "compute", Image: "launcher"}}},
	}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	return vmi, pod
}

func sampleYAML(t *testing.T, name string) string {
	t.Helper()
	data, err := yaml.Marshal(sample(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// evict posts an Eviction for pod, as kubectl drain does.
func evict(pod *corev1.Pod, dryRun bool) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
	if dryRun {
		ev.DeleteOptions = &metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cp.Client.SubResource("eviction").Create(ctx, pod, ev)
}

func evacuationNode(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) string {
	t.Helper()
	got := &v1alpha1.VirtualMachineInstance{}
	if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(vmi), got); err != nil {
		t.Fatal(err)
	}
	return got.Status.EvacuationNodeName
}

// TestEvictionWebhook: an eviction of a launcher pod goes through kube-apiserver to the webhook,
// which answers per the instance's evictionStrategy (else the cluster's) as KubeVirt's does: 429
// with the evacuation marked (status.evacuationNodeName) for migratable LiveMigrate and
// LiveMigrateIfPossible instances and for External; 429 without a mark for a LiveMigrate instance
// that cannot migrate; through for None and for a LiveMigrateIfPossible instance that cannot
// migrate. A repeated eviction says how the evacuation stands, failed migrations included.
func TestEvictionWebhook(t *testing.T) {
	startWebhook(t)
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "evict-"}}
	if err := cp.Client.Create(context.Background(), nsObj); err != nil {
		t.Fatal(err)
	}
	ns := nsObj.Name
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), nsObj) })
	t.Cleanup(func() { store.Set(config.Default()) })
	strategy := func(s v1alpha1.EvictionStrategy) *v1alpha1.EvictionStrategy { return &s }
	cases := []struct {
		name       string
		strategy   *v1alpha1.EvictionStrategy
		cluster    v1alpha1.EvictionStrategy
		migratable bool
		refused    string // "" when the eviction goes through
		marked     bool
	}{
		{"none", strategy(v1alpha1.EvictionStrategyNone), "", true, "", false},
		{"unset", nil, "", true, "", false},
		{"livemigrate", strategy(v1alpha1.EvictionStrategyLiveMigrate), "", true, "Eviction triggered evacuation of VMI " + ns + "/livemigrate", true},
		{"livemigrate-stuck", strategy(v1alpha1.EvictionStrategyLiveMigrate), "", false,
			"has evictionStrategy LiveMigrate but is not live-migratable: interface \"default\" uses the bridge binding", false},
		{"ifpossible", strategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible), "", true, "Eviction triggered evacuation", true},
		{"ifpossible-stuck", strategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible), "", false, "", false},
		{"external", strategy(v1alpha1.EvictionStrategyExternal), "", false, "for evacuation by an external controller", true},
		{"cluster-default", nil, v1alpha1.EvictionStrategyLiveMigrate, true, "Eviction triggered evacuation", true},
		{"own-beats-cluster", strategy(v1alpha1.EvictionStrategyNone), v1alpha1.EvictionStrategyLiveMigrate, true, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.EvictionStrategy = c.cluster
			store.Set(cfg)
			vmi, pod := evictee(t, ns, c.name, c.strategy, c.migratable)
			if err := evict(pod, true); (err == nil) != (c.refused == "") {
				t.Fatalf("dry-run eviction: %v", err)
			}
			if got := evacuationNode(t, vmi); got != "" {
				t.Fatalf("a dry-run eviction marked the instance for evacuation off %q", got)
			}
			err := evict(pod, false)
			switch {
			case c.refused == "" && err != nil:
				t.Fatalf("eviction refused: %v", err)
			case c.refused != "" && (!apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), c.refused)):
				t.Fatalf("want 429 saying %q, got %v", c.refused, err)
			}
			want := ""
			if c.marked {
				want = evictNode
			}
			if got := evacuationNode(t, vmi); got != want {
				t.Fatalf("status.evacuationNodeName = %q, want %q", got, want)
			}
			if c.refused == "" {
				return
			}
			// kubectl drain retries: still refused, now saying how the evacuation stands.
			if err := evict(pod, false); !apierrors.IsTooManyRequests(err) {
				t.Fatalf("repeated eviction: want 429, got %v", err)
			} else if c.marked && !strings.Contains(err.Error(), "Evacuation in progress for VMI "+ns+"/"+c.name) {
				t.Fatalf("repeated eviction does not say the evacuation is under way: %v", err)
			}
		})
	}

	t.Run("failed migrations named", func(t *testing.T) {
		store.Set(config.Default())
		vmi, pod := evictee(t, ns, "twice", strategy(v1alpha1.EvictionStrategyLiveMigrate), true)
		if err := evict(pod, false); !apierrors.IsTooManyRequests(err) {
			t.Fatalf("eviction: want 429, got %v", err)
		}
		for _, reason := range []string{"target pod failed", "the guest dirtied memory faster than the link"} {
			failedEvacuation(t, vmi, reason)
		}
		err := evict(pod, false)
		if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "2 migration(s) off node "+evictNode+" failed before") ||
			!strings.Contains(err.Error(), "the guest dirtied memory faster than the link") || !strings.Contains(err.Error(), "next migration off node") {
			t.Fatalf("want a refusal naming both failures, the last one's reason and the backoff, got %v", err)
		}
	})

	t.Run("not a launcher pod", func(t *testing.T) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "plain", Labels: map[string]string{v1alpha1.VMINameLabel: "livemigrate"}},
			Spec: corev1.PodSpec{NodeName: evictNode, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
		if err := cp.Client.Create(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
		if err := evict(pod, false); err != nil {
			t.Fatalf("eviction of a pod that is no launcher refused: %v", err)
		}
	})
}

// failedEvacuation records an evacuation migration of vmi that failed with reason, as the
// migration reconciler leaves one; successive ones are a second apart.
func failedEvacuation(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, reason string) {
	t.Helper()
	ctx := context.Background()
	m := &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: vmi.Namespace, GenerateName: vmi.Name + "-evacuation-",
			Annotations: map[string]string{v1alpha1.EvacuationMigrationAnnotation: evictNode}},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name},
	}
	if err := cp.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Status.Phase = v1alpha1.MigrationFailed
	m.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{
		{Phase: v1alpha1.MigrationFailed, PhaseTransitionTimestamp: metav1.Now()}}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{Type: migration.ConditionFailed, Status: metav1.ConditionTrue,
		Reason: migration.ReasonMigrationFailed, Message: reason})
	if err := cp.Client.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // creation timestamps have whole seconds: keep the order
}

// TestEvictionBeforeTheCacheCatchesUp: an eviction that reaches the webhook before the manager's
// cache holds the new launcher pod, or the instance's Running status, is still refused. The
// webhook reads both from kube-apiserver; with the cache, CI saw the LiveMigrate eviction of a
// just-created launcher pod go through (the guest would have stopped).
func TestEvictionBeforeTheCacheCatchesUp(t *testing.T) {
	startWebhook(t)
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "evict-lag-"}}
	if err := cp.Client.Create(context.Background(), nsObj); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), nsObj) })
	store.Set(config.Default())
	lm := v1alpha1.EvictionStrategyLiveMigrate
	vmi, pod := evictee(t, nsObj.Name, "fresh", &lm, true)
	a := &admission.EvictionAdmitter{Reader: cp.Client, Client: emptyCache(), Config: store}
	ev, err := json.Marshal(&policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}})
	if err != nil {
		t.Fatal(err)
	}
	req := ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Operation: admissionv1.Create, SubResource: "eviction", Namespace: pod.Namespace, Name: pod.Name,
		Object: runtime.RawExtension{Raw: ev},
	}}
	resp := a.Handle(context.Background(), req)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusTooManyRequests {
		t.Fatalf("eviction of a launcher pod the cache has not seen: allowed=%v result=%+v, want 429", resp.Allowed, resp.Result)
	}
	if got := evacuationNode(t, vmi); got != evictNode {
		t.Fatalf("status.evacuationNodeName = %q, want %q", got, evictNode)
	}
}

// emptyCache is the manager's client the moment a pod was created: its reads come from a cache
// that holds nothing yet, its writes go to kube-apiserver.
func emptyCache() client.Client {
	return laggingCache{Client: cp.Client, cache: fake.NewClientBuilder().WithScheme(cp.Client.Scheme()).Build()}
}

type laggingCache struct {
	client.Client
	cache client.Reader
}

func (c laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.cache.Get(ctx, key, obj, opts...)
}

func (c laggingCache) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.cache.List(ctx, list, opts...)
}
