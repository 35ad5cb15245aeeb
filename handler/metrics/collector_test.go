package metrics_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/metrics"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/envtest"
	qvtest "github.com/qvirt/qvirt/test/testutil"
)

// These tests run the collector against a real API server (envtest) and a real launcher booting
// the real test guest under TCG, and read the series through a real HTTP /metrics endpoint.

var (
	cp       *envtest.ControlPlane
	guestDir string
)

func TestMain(m *testing.M) {
	var err error
	if guestDir, err = qvtest.GuestDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	envtest.Main(m, &cp)
}

const node = "node-a"

func TestScrapeReportsRunningVMIs(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t)
	socketDir := podsDir(t)

	vm := createVMI(t, ns, "guest", node, v1alpha1.Running)
	l := startLauncher(t, socketDir, vm)
	con := l.console(t)
	con.Expect(t, 0, "QVIRT-GUEST-READY", 3*time.Minute)
	// Disk traffic on the scratch disk, and a NIC whose tap lives in this process's network
	// namespace (the launcher's, since it runs here), brought up in the guest so it transmits.
	tap := fmt.Sprintf("qvm%d", os.Getpid()%100000)
	run(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
	run(t, "ip", "link", "set", tap, "up")
	if err := l.client.HotplugNIC(ctx, machine.NIC{Name: "extra", Tap: tap, MAC: "02:00:00:aa:bb:02", Model: machine.NICVirtio}); err != nil {
		t.Fatalf("hotplug nic: %v", err)
	}
	con.Send(t, `dd if=/dev/vda of=/dev/null bs=4096 count=512 2>/dev/null; dd if=/dev/zero of=/dev/vda bs=4096 count=16 2>/dev/null; sync; `+
		`for i in $(seq 30); do [ -e /sys/class/net/eth0 ] && break; sleep 1; done; ip link set eth0 up; ip addr add 10.213.78.2/30 dev eth0; ping -c 2 -W 1 10.213.78.1 >/dev/null; echo "SETUP-DONE"`)
	con.Expect(t, 0, "SETUP-DONE\r\n", time.Minute)

	// Not scraped: no launcher for this one, so it counts as an error; one on another node; one
	// that has ended.
	createVMI(t, ns, "ghost", node, v1alpha1.Running)
	createVMI(t, ns, "elsewhere", "node-b", v1alpha1.Running)
	createVMI(t, ns, "done", node, v1alpha1.Succeeded)

	c := metrics.NewCollector(cp.Client, node, socketDir, testr.New(t))
	srv := serve(t, c)

	first := scrape(t, srv)
	vmi := map[string]string{"node": node, "namespace": ns, "name": "guest"}
	for _, tc := range []struct {
		metric string
		labels map[string]string
		min    float64
	}{
		{"qvirt_vmi_phase_count", map[string]string{"node": node, "phase": "running"}, 2},
		{"qvirt_vmi_phase_count", map[string]string{"node": node, "phase": "succeeded"}, 1},
		{"qvirt_vmi_vcpu_seconds_total", with(vmi, "id", "0", "state", "running"), 0.5}, // the boot under TCG alone takes seconds
		{"qvirt_vmi_cpu_usage_seconds_total", vmi, 0.5},
		{"qvirt_vmi_cpu_user_usage_seconds_total", vmi, 0.1},
		{"qvirt_vmi_cpu_system_usage_seconds_total", vmi, 0},
		{"qvirt_vmi_memory_resident_bytes", vmi, 32 << 20},
		{"qvirt_vmi_storage_read_traffic_bytes_total", with(vmi, "drive", "scratch"), 1 << 20},
		{"qvirt_vmi_storage_write_traffic_bytes_total", with(vmi, "drive", "scratch"), 64 << 10},
		{"qvirt_vmi_storage_iops_read_total", with(vmi, "drive", "scratch"), 1},
		{"qvirt_vmi_storage_iops_write_total", with(vmi, "drive", "scratch"), 1},
		{"qvirt_vmi_storage_read_times_seconds_total", with(vmi, "drive", "scratch"), 1e-9},
		{"qvirt_vmi_storage_write_times_seconds_total", with(vmi, "drive", "scratch"), 1e-9},
		{"qvirt_vmi_storage_flush_requests_total", with(vmi, "drive", "scratch"), 0},
		{"qvirt_vmi_network_transmit_packets_total", with(vmi, "interface", "extra"), 1},
		{"qvirt_vmi_network_transmit_bytes_total", with(vmi, "interface", "extra"), 42},
		{"qvirt_vmi_network_receive_bytes_total", with(vmi, "interface", "extra"), 0},
		{"qvirt_vmi_network_receive_packets_dropped_total", with(vmi, "interface", "extra"), 0},
		{"qvirt_handler_scrape_errors_total", nil, 1},
	} {
		v, ok := first.value(tc.metric, tc.labels)
		if !ok || v < tc.min {
			t.Errorf("%s%v = %v (present %v), want at least %v", tc.metric, tc.labels, v, ok, tc.min)
		}
	}
	if v, _ := first.value("qvirt_handler_scrape_errors_total", nil); v != 1 {
		t.Errorf("scrape errors %v after one scrape with one missing launcher, want 1", v)
	}
	if cpu, _ := first.value("qvirt_vmi_cpu_usage_seconds_total", vmi); cpu < first.must(t, "qvirt_vmi_vcpu_seconds_total", with(vmi, "id", "0", "state", "running")) {
		t.Errorf("process CPU %v below its vCPU's", cpu)
	}
	for _, name := range []string{"ghost", "elsewhere", "done"} {
		if n := first.seriesOf(name); n != 0 {
			t.Errorf("%d series for VMI %s, want none", n, name)
		}
	}
	if _, ok := first.value("qvirt_vmi_phase_count", map[string]string{"node": "node-b", "phase": "running"}); ok {
		t.Error("phase counted for a VMI of another node")
	}

	// Counters go on between scrapes; the missing launcher counts again.
	con.Send(t, "while :; do :; done & sleep 2; kill $!")
	time.Sleep(2500 * time.Millisecond)
	second := scrape(t, srv)
	vcpu := with(vmi, "id", "0", "state", "running")
	if a, b := first.must(t, "qvirt_vmi_vcpu_seconds_total", vcpu), second.must(t, "qvirt_vmi_vcpu_seconds_total", vcpu); b < a+0.2 {
		t.Errorf("vCPU seconds %v then %v across a 2 s busy loop", a, b)
	}
	if v := second.must(t, "qvirt_handler_scrape_errors_total", nil); v != 2 {
		t.Errorf("scrape errors %v after two scrapes, want 2", v)
	}

	// KubeVirt's qvirt_vmi_phase_count is a gauge named like a summary's count; it keeps that name
	// so recording rules port. Anything else the linter finds is a mistake.
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if p.Metric != "qvirt_vmi_phase_count" {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestScrapeSurvivesAListError(t *testing.T) {
	c := metrics.NewCollector(failingReader{}, node, podsDir(t), testr.New(t))
	got := scrape(t, serve(t, c))
	if v := got.must(t, "qvirt_handler_scrape_errors_total", nil); v != 1 {
		t.Fatalf("scrape errors %v, want 1", v)
	}
}

// BenchmarkScrape measures one /metrics request over HTTP with one running VMI, the VMIs read from
// an informer cache as in the node agent; BenchmarkLauncherStats is the launcher's share of it.
func BenchmarkScrape(b *testing.B) {
	ns := namespace(b)
	dir := podsDir(b)
	vm := createVMI(b, ns, "bench", node, v1alpha1.Running)
	startLauncher(b, dir, vm)
	srv := serve(b, metrics.NewCollector(informerCache(b), node, dir, logr.Discard()))
	b.ResetTimer()
	for b.Loop() {
		resp, err := http.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || n == 0 {
			b.Fatalf("status %d, %d bytes", resp.StatusCode, n)
		}
	}
}

func BenchmarkLauncherStats(b *testing.B) {
	vm := createVMI(b, namespace(b), "bench", node, v1alpha1.Running)
	l := startLauncher(b, podsDir(b), vm)
	b.ResetTimer()
	for b.Loop() {
		if _, err := l.client.Stats(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// informerCache is a started controller-runtime cache of the control plane, as the node agent's.
func informerCache(b *testing.B) cache.Cache {
	c, err := cache.New(cp.Config, cache.Options{Scheme: cp.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		b.Fatal("cache did not start")
	}
	// The VMI informer starts on first use; this list waits for its sync.
	if err := c.List(ctx, &v1alpha1.VirtualMachineInstanceList{}); err != nil {
		b.Fatal(err)
	}
	return c
}

// --- fixtures ---

func namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "metrics-"}}
	if err := cp.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), ns) })
	return ns.Name
}

// socketDir is a short directory of our own: unix socket paths are limited to 107 bytes.
// podsDir is a node's kubelet pods directory.
func podsDir(t testing.TB) string {
	t.Helper()
	return t.TempDir()
}

// podOf is the UID of the launcher pod createVMI records for the VMI named name.
func podOf(name string) types.UID { return types.UID("pod-of-" + name) }

// guestSpec is the test guest with a 16 MiB scratch virtio disk.
func guestSpec(t testing.TB) v1alpha1.VirtualMachineInstanceSpec {
	t.Helper()
	req, err := translate.LoadFile("../../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec := req.Spec
	spec.Domain.Firmware.KernelBoot.Container.Image = "file://" + guestDir
	spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "scratch", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}
	spec.Volumes = []v1alpha1.Volume{{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{
		EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("16Mi")}}}}
	return spec
}

// createVMI creates a VMI and sets its status as the node agent would.
func createVMI(t testing.TB, ns, name, nodeName string, phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	ctx := context.Background()
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: guestSpec(t)}
	if err := cp.Client.Create(ctx, vmi); err != nil {
		t.Fatalf("create VMI %s: %v", name, err)
	}
	vmi.Status.Phase = phase
	vmi.Status.NodeName = nodeName
	vmi.Status.ActivePods = map[types.UID]string{podOf(name): nodeName}
	if err := cp.Client.Status().Update(ctx, vmi); err != nil {
		t.Fatalf("set status of VMI %s: %v", name, err)
	}
	return vmi
}

type runningLauncher struct {
	dir    launcher.Dir
	client *launcher.Client
}

// startLauncher serves a launcher at the VMI's socket directory and starts its guest; cleanup
// kills QEMU (by its PID) and stops serving.
func startLauncher(t testing.TB, podsDir string, vmi *v1alpha1.VirtualMachineInstance) *runningLauncher {
	t.Helper()
	dir := launcher.VMIDir(qvtest.PodSocketDir(t, podsDir, podOf(vmi.Name)), vmi.UID)
	if err := os.MkdirAll(string(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	l := launcher.New(string(dir), launcher.HostResolver{SpareRootPorts: 1}, launcher.Options{Log: logFor(t)})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = launcher.Serve(ctx, dir.Command(), l, logFor(t))
	}()
	t.Cleanup(func() {
		_ = l.Kill(context.Background())
		waitCtx, done := context.WithTimeout(context.Background(), 10*time.Second)
		_, _ = l.Wait(waitCtx)
		done()
		cancel()
		<-served
	})
	r := &runningLauncher{dir: dir, client: launcher.NewClient(dir.Command())}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := r.client.Sync(context.Background(), qvtest.SyncRequest(t, vmi, nil))
		if err == nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("sync the launcher: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // the socket is not listening yet
	}
}

func (r *runningLauncher) console(t *testing.T) *qvtest.Console {
	return qvtest.AttachConsole(t, r.dir.Serial())
}

// logFor logs to the test; benchmarks log nothing.
func logFor(t testing.TB) logr.Logger {
	if tt, ok := t.(*testing.T); ok {
		return testr.New(tt)
	}
	return logr.Discard()
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}

// serve exposes the collector on a real HTTP /metrics endpoint, on a pedantic registry that
// checks every metric against its description.
func serve(t testing.TB, c prometheus.Collector) *httptest.Server {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	t.Cleanup(srv.Close)
	return srv
}

type families map[string]*dto.MetricFamily

func scrape(t *testing.T, srv *httptest.Server) families {
	t.Helper()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d: %s", resp.StatusCode, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	t.Logf("scraped %d bytes", len(body))
	if testing.Verbose() && os.Getenv("SHOW_METRICS") != "" {
		t.Logf("%s", body)
	}
	return fams
}

// value is the sample of metric whose labels include all of want.
func (f families) value(metric string, want map[string]string) (float64, bool) {
	fam, ok := f[metric]
	if !ok {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		if hasLabels(m, want) {
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func (f families) must(t *testing.T, metric string, want map[string]string) float64 {
	t.Helper()
	v, ok := f.value(metric, want)
	if !ok {
		t.Fatalf("no %s%v", metric, want)
	}
	return v
}

// seriesOf counts the series whose name label is vmi.
func (f families) seriesOf(vmi string) int {
	n := 0
	for _, fam := range f {
		for _, m := range fam.GetMetric() {
			if hasLabels(m, map[string]string{"name": vmi}) {
				n++
			}
		}
	}
	return n
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, lp := range m.GetLabel() {
		have[lp.GetName()] = lp.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func with(base map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// failingReader is a cache that cannot list.
type failingReader struct{}

func (failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("cache not synced")
}

func (failingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("cache not synced")
}
