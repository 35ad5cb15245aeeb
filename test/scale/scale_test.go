// Package scale runs qvirt's control plane at KubeVirt's scale test: thousands of VMIs over a
// hundred nodes against a real etcd, kube-apiserver, kube-scheduler and qvirt-controller. The
// nodes are played by this one process (nodes.go), as KubeVirt's KWOK test plays them: no process,
// network namespace or CNI call per pod, launchers that report Running without starting QEMU.
package scale

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
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
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

var (
	scaleVMIs   = flag.Int("scale.vmis", 8000, "how many VMIs BenchmarkControlPlane creates")
	scaleNodes  = flag.Int("scale.nodes", 100, "how many nodes this process plays")
	heapProfile = flag.String("scale.heapprofile", "", "write this process's heap profile here once every VMI is Running (the controller's caches, by allocation site, beside the node stand-ins' and the benchmark's own)")
)

// installNamespace holds qvirt-config, as qvirt-system does in a real install.
const installNamespace = "qvirt-system"

// BenchmarkControlPlane creates -scale.vmis VMIs (8000) as fast as the API server takes them, on
// -scale.nodes nodes (100) played by this process, and reports: the time until every one is
// Running (s-to-running) and the rate (vmis-per-min); qvirt-controller's live heap per VMI
// (controller-KB-per-vmi; goal 10, KubeVirt measured about 173); the requests qvirt-controller
// sent per VMI, split into reads of one object (controller-gets-per-vmi: polling, goal 0) and
// writes (controller-writes-per-vmi), and the lists and watches it opened during the run
// (controller-lists-watches-in-run: its informers' re-watches, not per VMI); the API server's requests per VMI from
// every client (apiserver-requests-per-vmi); then the time to delete them all (s-to-deleted).
// qvirt-controller runs in this process (the same controllers.Setup its main runs, webhooks
// apart), so its heap is measured after a full collection; the node stand-ins keep no objects.
// One iteration is the whole procedure; run it with -benchtime=1x.
func BenchmarkControlPlane(b *testing.B) {
	// The reconcilers' logs would be 8,000 VMIs' worth of noise.
	ctrl.SetLogger(logr.Discard())
	for range b.N {
		benchControlPlane(b, *scaleVMIs, *scaleNodes)
	}
}

func benchControlPlane(b *testing.B, vmis, nodes int) {
	ctx, cancel := context.WithCancel(context.Background())
	cp, err := envtest.Start()
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	defer func() {
		cancel() // the stand-ins' watches end before the API server does
		_ = cp.Stop()
	}()
	startScheduler(b, cp)
	if err := setupInstall(ctx, cp.Client); err != nil {
		b.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "scale-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}

	fast := rest.CopyConfig(cp.Config)
	fast.QPS = -1 // no client-side limit: as fast as the API server takes them
	world, err := client.NewWithWatch(fast, client.Options{Scheme: cp.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	stand := &standIns{c: world, ns: ns.Name}
	if err := stand.registerNodes(ctx, nodes); err != nil {
		b.Fatal(err)
	}
	if err := stand.start(ctx); err != nil {
		b.Fatal(err)
	}

	requests := &requestCounter{}
	stopController := startController(b, cp, requests)
	defer stopController()
	time.Sleep(2 * time.Second) // the controller's informers have synced: the baseline is empty caches
	heapBefore := testutil.LiveHeap()
	requests.reset()
	apiBefore := apiserverRequests(ctx, b, cp.Config)

	start := time.Now()
	createAll(ctx, b, world, ns.Name, vmis)
	created := time.Since(start)
	stand.waitRunning(b, vmis, 30*time.Minute)
	toRunning := time.Since(start)

	time.Sleep(3 * time.Second) // the last status writes reach the controller's cache
	heapAfter := testutil.LiveHeap()
	writeHeapProfile(b, *heapProfile)
	apiAfter := apiserverRequests(ctx, b, cp.Config)
	counts := requests.snapshot()

	b.ReportMetric(toRunning.Seconds(), "s-to-running")
	b.ReportMetric(float64(vmis)/toRunning.Minutes(), "vmis-per-min")
	b.ReportMetric(created.Seconds(), "s-to-created")
	testutil.ReportGoal(b, float64(int64(heapAfter)-int64(heapBefore))/1024/float64(vmis), "controller-KB-per-vmi", 10)
	testutil.ReportGoal(b, float64(counts.get)/float64(vmis), "controller-gets-per-vmi", 0)
	b.ReportMetric(float64(counts.write)/float64(vmis), "controller-writes-per-vmi")
	b.ReportMetric(float64(counts.list+counts.watch), "controller-lists-watches-in-run")
	b.ReportMetric((apiAfter-apiBefore)/float64(vmis), "apiserver-requests-per-vmi")

	start = time.Now()
	deleteAll(ctx, b, world, ns.Name)
	waitNoVMIs(ctx, b, world, ns.Name, 30*time.Minute)
	b.ReportMetric(time.Since(start).Seconds(), "s-to-deleted")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d VMIs on %d nodes: created in %s, all Running after %s, all deleted after %s; controller heap %d -> %d bytes; controller requests %+v",
		vmis, nodes, created.Round(time.Millisecond), toRunning.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), heapBefore, heapAfter, counts)
}

// startScheduler runs the kube-scheduler built with the control plane against it until the
// benchmark ends.
func startScheduler(b *testing.B, cp *envtest.ControlPlane) {
	b.Helper()
	assets, err := envtest.Assets()
	if err != nil {
		b.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(b.TempDir(), "kube-scheduler.log"))
	if err != nil {
		b.Fatal(err)
	}
	kc := cp.Kubeconfig
	cmd := exec.Command(filepath.Join(assets, "kube-scheduler"), "--kubeconfig="+kc,
		"--authentication-kubeconfig="+kc, "--authorization-kubeconfig="+kc,
		"--secure-port=0", "--leader-elect=false")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		b.Fatalf("start kube-scheduler: %v", err)
	}
	b.Cleanup(func() {
		if b.Failed() {
			if log, err := os.ReadFile(logFile.Name()); err == nil {
				b.Logf("kube-scheduler's log:\n%s", log[max(0, len(log)-4000):])
			}
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logFile.Close()
	})
}

// setupInstall makes the install namespace with a configuration for nodes without KVM (the
// stand-ins advertise none).
func setupInstall(ctx context.Context, c client.Client) error {
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNamespace}}); err != nil {
		return fmt.Errorf("install namespace: %w", err)
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: installNamespace},
		Data:       map[string]string{"useEmulation": "true"},
	}
	if err := c.Create(ctx, cm); err != nil {
		return fmt.Errorf("configmap %s: %w", config.ConfigMapName, err)
	}
	return nil
}

// startController runs qvirt-controller's reconcilers (controllers.Setup, as its main does, without
// the webhooks) with their requests counted, until the returned stop.
func startController(b *testing.B, cp *envtest.ControlPlane, requests *requestCounter) (stop func()) {
	b.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Wrap(testutil.ObserveRequests(requests.count))
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 cp.Scheme,
		Cache:                  controllers.CacheOptions(installNamespace),
		Metrics:                server.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// No node agent beats here: the stand-in nodes must not be declared dead mid-run.
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: installNamespace, NodeHeartbeatTimeout: 24 * time.Hour}); err != nil {
		cancel()
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	return sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("qvirt-controller: %v", err)
		}
	})
}

// createAll creates n small VMIs from 16 goroutines.
func createAll(ctx context.Context, b *testing.B, c client.Client, ns string, n int) {
	b.Helper()
	const creators = 16
	var wg sync.WaitGroup
	errs := make(chan error, creators)
	for w := range creators {
		wg.Go(func() {
			for i := w; i < n; i += creators {
				if err := c.Create(ctx, scaleVMI(ns, fmt.Sprintf("vm-%05d", i))); err != nil {
					errs <- fmt.Errorf("create VMI %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// scaleVMI is a small VMI with a container disk, as the density tests use.
func scaleVMI(ns, name string) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))},
				Devices: v1alpha1.Devices{
					Disks: []v1alpha1.Disk{{Name: "root"}},
				},
			},
			Volumes: []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
				ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "registry.example/qvirt/cirros:latest"},
			}}},
		},
	}
}

// deleteAll deletes every VMI of the namespace one by one from 16 goroutines, as kubectl delete
// --all does (one deletecollection of 8000 VMIs outlives the API server's request timeout).
func deleteAll(ctx context.Context, b *testing.B, c client.Client, ns string) {
	b.Helper()
	var list metav1.PartialObjectMetadataList
	list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("VirtualMachineInstanceList"))
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	const deleters = 16
	var wg sync.WaitGroup
	errs := make(chan error, deleters)
	for w := range deleters {
		wg.Go(func() {
			for i := w; i < len(list.Items); i += deleters {
				vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: list.Items[i].Name, Namespace: ns}}
				if err := c.Delete(ctx, vmi); client.IgnoreNotFound(err) != nil {
					errs <- fmt.Errorf("delete VMI %s: %w", vmi.Name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// waitNoVMIs waits until the namespace holds no VMI.
func waitNoVMIs(ctx context.Context, b *testing.B, c client.Client, ns string, d time.Duration) {
	b.Helper()
	deadline := time.Now().Add(d)
	for {
		var list metav1.PartialObjectMetadataList
		list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("VirtualMachineInstanceList"))
		err := c.List(ctx, &list, client.InNamespace(ns))
		switch {
		case err != nil:
			b.Fatal(err)
		case len(list.Items) == 0:
			return
		case time.Now().After(deadline):
			b.Fatalf("%d VMIs left after %s", len(list.Items), d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// writeHeapProfile writes the live heap's profile to path, if one is asked for.
func writeHeapProfile(b *testing.B, path string) {
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatalf("-scale.heapprofile: %v", err)
	}
	err = pprof.Lookup("heap").WriteTo(f, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatalf("-scale.heapprofile %s: %v", path, err)
	}
}
