package controllers_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers"
	"github.com/qvirt/qvirt/test/testutil"
)

// requestLog records the resources a client listed or watched (the path of each GET).
type requestLog struct {
	mu    sync.Mutex
	reads []string
}

func (l *requestLog) record(req *http.Request) {
	if req.Method != http.MethodGet {
		return
	}
	l.mu.Lock()
	l.reads = append(l.reads, req.URL.Path+"?"+req.URL.RawQuery)
	l.mu.Unlock()
}

// of lists the reads of a resource (its plural name).
func (l *requestLog) of(resource string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reads {
		path, _, _ := strings.Cut(r, "?")
		if strings.HasSuffix(path, "/"+resource) || strings.Contains(path, "/"+resource+"/") {
			out = append(out, r)
		}
	}
	return out
}

// startReplica runs a qvirt-controller replica in the test process, as cmd/qvirt-controller does
// (leader election in namespace, no webhooks), reading through log; cancel stops it and hands its
// lease over.
func startReplica(t *testing.T, namespace string, log *requestLog) (ctrl.Manager, func()) {
	t.Helper()
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(testutil.ObserveRequests(log.record))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: sch, Cache: controllers.CacheOptions(namespace),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		LeaderElection: true, LeaderElectionID: "qvirt-controller.qvirt.io", LeaderElectionNamespace: namespace,
		LeaderElectionReleaseOnCancel: true, RetryPeriod: ptr.To(500 * time.Millisecond),
		// Two replicas in one process register the same controller names.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: namespace}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica stopped with %v", err)
		}
	}
	t.Cleanup(func() {
		if ctx.Err() == nil {
			stop()
		}
	})
	return mgr, stop
}

func elected(mgr ctrl.Manager) bool {
	select {
	case <-mgr.Elected():
		return true
	default:
		return false
	}
}

// A replica that does not lead lists and watches no launcher pod, instance, VM, migration or
// node: it only waits to lead. Once the leader steps down it takes over, with the field indexes
// its reconcilers need (the VMI controller finds a VMI's pods by one).
func TestStandbyReplicaWatchesNoWorkloads(t *testing.T) {
	ctx := context.Background()
	c := cp.Client
	for _, ns := range []string{"standby-system", "standby-demo"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	var leaderLog, standbyLog requestLog
	leader, stopLeader := startReplica(t, "standby-system", &leaderLog)
	eventually(t, 30*time.Second, "the first replica to lead", func() bool { return elected(leader) })
	standby, _ := startReplica(t, "standby-system", &standbyLog)
	newVMI := func(name string) {
		t.Helper()
		vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "standby-demo"},
			Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("128Mi"))}}}}
		if err := c.Create(ctx, vmi); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the launcher pod of VMI "+name, func() bool {
			var pods corev1.PodList
			_ = c.List(ctx, &pods, client.InNamespace("standby-demo"), client.MatchingLabels{v1alpha1.VMINameLabel: name})
			return len(pods.Items) == 1
		})
	}
	newVMI("first")
	// The standby has had the time to start whatever it would watch: its cache synced what it holds
	// (the configuration) before it ever tried for the lease.
	eventually(t, 30*time.Second, "the standby to try for the lease", func() bool { return len(standbyLog.of("leases")) > 0 })
	if elected(standby) {
		t.Fatal("both replicas lead")
	}
	workloads := []string{"pods", "virtualmachineinstances", "virtualmachines", "virtualmachineinstancemigrations", "nodes"}
	for _, res := range workloads {
		if got := standbyLog.of(res); len(got) > 0 {
			t.Errorf("the standby replica read %s: %v", res, got)
		}
		if res != "nodes" && len(leaderLog.of(res)) == 0 {
			t.Errorf("the leader never read %s (the test's log misses reads)", res)
		}
	}
	if got := standbyLog.of("configmaps"); len(got) == 0 {
		t.Error("the standby does not follow the configuration its webhooks read")
	}
	stopLeader()
	eventually(t, 30*time.Second, "the standby to lead", func() bool { return elected(standby) })
	newVMI("second")
	for _, res := range []string{"pods", "virtualmachineinstances"} {
		if len(standbyLog.of(res)) == 0 {
			t.Errorf("the new leader created a launcher pod without reading %s", res)
		}
	}
}
