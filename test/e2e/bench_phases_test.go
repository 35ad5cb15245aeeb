package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// The milestones of a start, in order: where the time between create and Running goes. Each is
// the moment the benchmark's watch first saw it, so each carries the watch's own delivery delay
// (small, and the same for every milestone).
const (
	phasePodCreated   = "pod-created"   // the VMI controller created the launcher pod
	phaseScheduled    = "scheduled"     // the scheduler bound it to a node
	phasePodRunning   = "pod-running"   // the node started its containers
	phaseVMIScheduled = "vmi-scheduled" // the VMI controller saw the pod running
	phaseRunning      = "running"       // the node agent synced the launcher and the guest runs
)

var phaseOrder = []string{phasePodCreated, phaseScheduled, phasePodRunning, phaseVMIScheduled, phaseRunning}

// phaseClock watches a namespace's VMIs and launcher pods and keeps, per VMI, when each milestone
// was first seen.
type phaseClock struct {
	mu      sync.Mutex
	created map[string]time.Time
	seen    map[string]map[string]time.Time // VMI -> milestone -> first seen
	failed  string                          // the first VMI seen Failed, with its reason
}

func newPhaseClock() *phaseClock {
	return &phaseClock{created: map[string]time.Time{}, seen: map[string]map[string]time.Time{}}
}

// watch starts watches on ns's pods and VMIs; they end with ctx.
func (p *phaseClock) watch(ctx context.Context, b *testing.B, ns string) {
	b.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", lc.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: cl.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	go testutil.DrainWatch(ctx, retryWatch(ctx, b, wc, &corev1.PodList{}, ns), logErrors(b, p.seePod))
	go testutil.DrainWatch(ctx, retryWatch(ctx, b, wc, &v1alpha1.VirtualMachineInstanceList{}, ns), logErrors(b, p.seeVMI))
}

// logErrors logs the error events of a watch before passing every event to see.
func logErrors(b *testing.B, see func(watch.Event)) func(watch.Event) {
	return func(ev watch.Event) {
		if ev.Type == watch.Error {
			b.Logf("phase clock's watch: error event %v", ev.Object)
		}
		see(ev)
	}
}

// retryWatch watches list's kind in ns from now on and, when the API server ends a watch, watches
// again from the last event seen, so that no change is missed. (A plain watch that ended left the
// clock waiting for Running instances it would never see again: a run with all 100 Running failed
// with "15 of 100 VMIs Running".)
func retryWatch(ctx context.Context, b *testing.B, wc client.WithWatch, list client.ObjectList, ns string) watch.Interface {
	b.Helper()
	if err := wc.List(ctx, list, client.InNamespace(ns)); err != nil {
		b.Fatal(err)
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		return wc.Watch(ctx, list.DeepCopyObject().(client.ObjectList), client.InNamespace(ns), &client.ListOptions{Raw: &opts})
	}}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.GetResourceVersion(), lw)
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// create records that name is being created now, and returns that moment.
func (p *phaseClock) create(name string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.created[name] = now
	return now
}

func (p *phaseClock) mark(vmi, phase string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.seen[vmi]
	if m == nil {
		m = map[string]time.Time{}
		p.seen[vmi] = m
	}
	if _, ok := m[phase]; !ok {
		m[phase] = time.Now()
	}
}

func (p *phaseClock) seePod(ev watch.Event) {
	pod, ok := ev.Object.(*corev1.Pod)
	if !ok {
		return
	}
	vmi := pod.Labels[v1alpha1.VMINameLabel]
	if vmi == "" {
		return
	}
	p.mark(vmi, phasePodCreated)
	if pod.Spec.NodeName != "" {
		p.mark(vmi, phaseScheduled)
	}
	if pod.Status.Phase == corev1.PodRunning {
		p.mark(vmi, phasePodRunning)
	}
}

func (p *phaseClock) seeVMI(ev watch.Event) {
	vmi, ok := ev.Object.(*v1alpha1.VirtualMachineInstance)
	if !ok {
		return
	}
	switch vmi.Status.Phase {
	case v1alpha1.Scheduled:
		p.mark(vmi.Name, phaseVMIScheduled)
	case v1alpha1.Running:
		p.mark(vmi.Name, phaseVMIScheduled) // a quick start may skip the Scheduled event
		p.mark(vmi.Name, phaseRunning)
	case v1alpha1.Failed:
		p.mu.Lock()
		if p.failed == "" {
			p.failed = fmt.Sprintf("%s: %s", vmi.Name, vmi.Status.Reason)
		}
		p.mu.Unlock()
	}
}

// waitRunning waits until n VMIs have been seen Running; it fails on the first Failed one.
func (p *phaseClock) waitRunning(b *testing.B, n int, d time.Duration) {
	b.Helper()
	deadline := time.Now().Add(d)
	for {
		p.mu.Lock()
		running, failed := 0, p.failed
		for _, m := range p.seen {
			if _, ok := m[phaseRunning]; ok {
				running++
			}
		}
		p.mu.Unlock()
		switch {
		case failed != "":
			b.Fatalf("VMI %s failed", failed)
		case running >= n:
			return
		case time.Now().After(deadline):
			b.Fatalf("%d of %d VMIs Running after %s", running, n, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// latencies is, per VMI, the time from its creation to Running, sorted.
func (p *phaseClock) latencies() []float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []float64
	for name, at := range p.created {
		if r, ok := p.seen[name][phaseRunning]; ok {
			out = append(out, r.Sub(at).Seconds())
		}
	}
	slices.Sort(out)
	return out
}

// lastRunning is when the last VMI was seen Running.
func (p *phaseClock) lastRunning() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	for _, m := range p.seen {
		if r := m[phaseRunning]; r.After(last) {
			last = r
		}
	}
	return last
}

// report adds, per milestone, the P50 and P95 of the time spent reaching it from the one before
// (from creation, for the first): where the queue is.
func (p *phaseClock) report(b *testing.B) {
	p.mu.Lock()
	defer p.mu.Unlock()
	steps := map[string][]float64{}
	for name, at := range p.created {
		prev := at
		for _, ph := range phaseOrder {
			t, ok := p.seen[name][ph]
			if !ok {
				break
			}
			steps[ph] = append(steps[ph], max(t.Sub(prev).Seconds(), 0))
			prev = t
		}
	}
	for _, ph := range phaseOrder {
		d := steps[ph]
		slices.Sort(d)
		b.ReportMetric(percentile(d, 50), "to-"+ph+"-p50-s")
		b.ReportMetric(percentile(d, 95), "to-"+ph+"-p95-s")
	}
}
