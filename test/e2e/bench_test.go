package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/supervise"
)

// benchVMIs is how many instances BenchmarkStartup creates, benchInterval apart: KubeVirt's
// density procedure.
const (
	benchVMIs     = 100
	benchInterval = 100 * time.Millisecond
)

// BenchmarkStartup creates 100 tiny VMIs (the demo guest with a masquerade interface, under
// emulation) 100 ms apart on the two-node cluster and reports the time from each creation to
// phase Running: p50-s, p95-s and total-s (first creation to last Running). It also reports the
// peak resident memory of qvirt's components during the run: qvirt-controller, each node's
// qvirt-handler, and per launcher (qvirt-launcher alone, QEMU apart). One iteration is the whole
// procedure (it takes minutes), so run it with -benchtime=1x.
func BenchmarkStartup(b *testing.B) {
	for range b.N {
		benchStartup(b)
	}
}

func benchStartup(b *testing.B) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}
	if err := cl.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	defer deleteBenchNamespace(b, ns)

	mem := newMemWatch()
	stopMem := mem.run(500 * time.Millisecond)
	created := make(map[string]time.Time, benchVMIs)
	var mu sync.Mutex
	first := time.Now()
	for i := range benchVMIs {
		vmi := benchVMI(ns.Name, fmt.Sprintf("b%03d", i))
		mu.Lock()
		created[vmi.Name] = time.Now()
		mu.Unlock()
		if err := cl.Create(ctx, vmi); err != nil {
			b.Fatalf("create VMI %d: %v", i, err)
		}
		time.Sleep(benchInterval)
	}
	runningAt := waitAllRunning(b, ns.Name, 10*time.Minute)
	stopMem()

	var lat []float64
	var last time.Time
	for name, t := range runningAt {
		lat = append(lat, t.Sub(created[name]).Seconds())
		if t.After(last) {
			last = t
		}
	}
	slices.Sort(lat)
	b.ReportMetric(percentile(lat, 50), "p50-s")
	b.ReportMetric(percentile(lat, 95), "p95-s")
	b.ReportMetric(last.Sub(first).Seconds(), "total-s")
	for _, m := range mem.report() {
		b.ReportMetric(m.mib, m.name+"-MiB")
	}
	b.ReportMetric(0, "ns/op") // the procedure is not a per-op cost
}

// benchVMI is a tiny instance of the demo guest: 64 MiB, no grace period (the run ends by deleting
// them all).
func benchVMI(ns, name string) *v1alpha1.VirtualMachineInstance {
	kb := &v1alpha1.KernelBootContainer{Image: lc.Images.KernelBoot, KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd.img"}
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Domain: v1alpha1.DomainSpec{
				Memory:   &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))},
				Firmware: &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{KernelArgs: "console=ttyS0 quiet panic=-1", Container: kb}},
				Devices: v1alpha1.Devices{
					AutoattachGraphicsDevice: ptr.To(false),
					Interfaces:               []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}},
				},
			},
			Networks: []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}},
		},
	}
}

// waitAllRunning watches the namespace's VMIs until every one has been seen Running, and returns
// when each was first seen so (polled every 100 ms: the figures carry up to 0.1 s of it).
func waitAllRunning(b *testing.B, ns string, d time.Duration) map[string]time.Time {
	b.Helper()
	seen := map[string]time.Time{}
	deadline := time.Now().Add(d)
	for len(seen) < benchVMIs {
		var list v1alpha1.VirtualMachineInstanceList
		if err := cl.List(context.Background(), &list, client.InNamespace(ns)); err == nil {
			now := time.Now()
			for _, v := range list.Items {
				if _, ok := seen[v.Name]; !ok && v.Status.Phase == v1alpha1.Running {
					seen[v.Name] = now
				}
				if v.Status.Phase == v1alpha1.Failed {
					b.Fatalf("VMI %s failed: %s", v.Name, v.Status.Reason)
				}
			}
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d VMIs Running after %s", len(seen), benchVMIs, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return seen
}

func percentile(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[max(i-1, 0)]
}

func deleteBenchNamespace(b *testing.B, ns *corev1.Namespace) {
	ctx := context.Background()
	_ = cl.DeleteAllOf(ctx, &v1alpha1.VirtualMachineInstance{}, client.InNamespace(ns.Name))
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var pods corev1.PodList
		if err := cl.List(ctx, &pods, client.InNamespace(ns.Name)); err == nil && len(pods.Items) == 0 {
			break
		}
		time.Sleep(time.Second)
	}
	if err := cl.Delete(ctx, ns); err != nil {
		b.Logf("delete namespace %s: %v", ns.Name, err)
	}
}

// memWatch samples the resident memory of qvirt's processes and keeps each one's peak.
type memWatch struct {
	mu   sync.Mutex
	peak map[string]float64 // component -> MiB
}

type memFigure struct {
	name string
	mib  float64
}

func newMemWatch() *memWatch { return &memWatch{peak: map[string]float64{}} }

func (m *memWatch) run(every time.Duration) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			m.sample()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(done); <-finished }
}

// sample reads VmRSS of the supervised qvirt components and of every launcher and QEMU process.
func (m *memWatch) sample() {
	states, _ := supervise.ReadStates(dir)
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range states {
		if s.PID == 0 || !strings.HasPrefix(s.Name, "qvirt-") {
			continue
		}
		m.keep(s.Name, rssMiB(s.PID))
	}
	launcherExe := filepath.Join(dir, "bin", "qvirt-launcher")
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	var launchers, qemus []float64
	for _, p := range procs {
		exe, err := os.Readlink(p)
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		switch {
		case exe == launcherExe:
			launchers = append(launchers, rssMiB(pid))
		case strings.HasSuffix(exe, "/qemu-system-x86_64") && strings.Contains(cmdline(pid), dir):
			qemus = append(qemus, rssMiB(pid))
		}
	}
	m.keep("launcher-max", maxOf(launchers))
	m.keep("qemu-max", maxOf(qemus))
}

func (m *memWatch) keep(name string, mib float64) {
	if mib > m.peak[name] {
		m.peak[name] = mib
	}
}

func (m *memWatch) report() []memFigure {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []memFigure
	for name, mib := range m.peak {
		out = append(out, memFigure{name, mib})
	}
	slices.SortFunc(out, func(a, b memFigure) int { return strings.Compare(a.name, b.name) })
	return out
}

func maxOf(xs []float64) float64 {
	var m float64
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// rssMiB is a process's resident memory in MiB (0 when it is gone).
func rssMiB(pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

func cmdline(pid int) string {
	data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return string(data)
}
