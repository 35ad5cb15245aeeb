// Package metrics exposes the VMIs of one node on the node agent's /metrics: per VMI its phase,
// CPU and vCPU time, QEMU's resident memory, block I/O per drive and network traffic per
// interface. The figures come from each launcher's GET /v1/stats (QMP and /proc inside the launcher
// pod), gathered when Prometheus scrapes, so nothing polls between scrapes and a VMI that goes
// away leaves no stale series behind.
//
// A launcher is untrusted and may hang: all launchers are asked at once (one goroutine each, as
// KubeVirt's domain stats collector does), each within launcherTimeout, and the whole scrape
// within scrapeTimeout; a launcher whose previous call has not ended is not asked again until it
// does. So a scrape returns in bounded time whatever the launchers do, with the series of every
// launcher that answered.
//
// Metric and label names follow KubeVirt's kubevirt_vmi_* with the prefix qvirt_ (labels node,
// namespace, name; drive for disks, interface for NICs; id and state for vCPUs), so KubeVirt
// dashboards and recording rules port by renaming the prefix.
package metrics

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

const (
	// scrapeTimeout bounds a whole scrape, listing included: below Prometheus' default scrape
	// timeout (10 s), so a scrape never fails for a launcher.
	scrapeTimeout = 5 * time.Second
	// launcherTimeout bounds one launcher's answer.
	launcherTimeout = 2 * time.Second
	// maxConcurrent launchers are asked at once: more than a node runs (the kubelet's default
	// maxPods is 110), so that hung launchers never queue the others behind them; it only bounds
	// a node with far more.
	maxConcurrent = 256
)

// Collector is a prometheus.Collector for the VMIs of one node. Safe for concurrent scrapes.
type Collector struct {
	reader  client.Reader
	node    string
	podsDir string
	log     logr.Logger
	// scrapeErrors counts VMIs skipped because their launcher did not answer (in time, or at all
	// while an earlier call to it was still pending), and failed lists.
	scrapeErrors atomic.Uint64

	// scrapeTimeout and launcherTimeout are the constants of the same names (tests shorten them).
	scrapeTimeout, launcherTimeout time.Duration

	mu sync.Mutex
	// asking are the VMIs whose launcher a call is pending for: at most one each.
	asking map[types.UID]struct{}
}

// NewCollector returns the collector for node nodeName. reader lists VMIs (the node agent's cache,
// which holds only this node's; VMIs whose status.nodeName is another node are ignored anyway);
// podsDir is the kubelet's pods directory, where the launcher pods' sockets are. log gets one
// line per launcher that failed to answer, at V(1) since the counter already tells.
func NewCollector(reader client.Reader, nodeName, podsDir string, log logr.Logger) prometheus.Collector {
	return &Collector{reader: reader, node: nodeName, podsDir: podsDir, log: log, asking: map[types.UID]struct{}{},
		scrapeTimeout: scrapeTimeout, launcherTimeout: launcherTimeout}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs() {
		ch <- d
	}
}

// Collect implements prometheus.Collector: it lists this node's VMIs, asks the launcher of each
// running one for its stats, and emits what it got within scrapeTimeout. A launcher that does not
// answer in time is skipped and counted in qvirt_handler_scrape_errors_total; it never fails the
// scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	defer func() {
		ch <- prometheus.MustNewConstMetric(scrapeErrorsDesc, prometheus.CounterValue, float64(c.scrapeErrors.Load()))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), c.scrapeTimeout)
	defer cancel()
	vmis, err := c.listVMIs(ctx)
	if err != nil {
		c.scrapeErrors.Add(1)
		c.log.Error(err, "list VMIs for metrics")
		return
	}
	c.collectPhases(ch, vmis)
	results, asked := c.gather(ctx, vmis)
	for got := 0; got < asked; got++ {
		select {
		case r := <-results:
			c.emit(ch, r)
		case <-ctx.Done():
			c.scrapeErrors.Add(uint64(asked - got))
			c.log.Info("scrape deadline reached; the series of launchers that did not answer are left out", "deadline", c.scrapeTimeout, "missing", asked-got)
			return
		}
	}
}

func (c *Collector) emit(ch chan<- prometheus.Metric, r result) {
	if r.err != nil {
		c.scrapeErrors.Add(1)
		c.log.V(1).Info("launcher did not answer for metrics", "vmi", r.vmi.Namespace+"/"+r.vmi.Name, "uid", r.vmi.UID, "error", r.err.Error())
		return
	}
	emitVMI(ch, c.labels(r.vmi), &r.stats)
}

func (c *Collector) listVMIs(ctx context.Context) ([]*v1alpha1.VirtualMachineInstance, error) {
	var list v1alpha1.VirtualMachineInstanceList
	if err := c.reader.List(ctx, &list); err != nil {
		return nil, err
	}
	var out []*v1alpha1.VirtualMachineInstance
	for i := range list.Items {
		if list.Items[i].Status.NodeName == c.node {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// collectPhases emits qvirt_vmi_phase_count for the phases present on this node. KubeVirt's
// recording rules select phase="running": phases are lower case.
func (c *Collector) collectPhases(ch chan<- prometheus.Metric, vmis []*v1alpha1.VirtualMachineInstance) {
	counts := map[string]int{}
	for _, vmi := range vmis {
		counts[strings.ToLower(string(vmi.Status.Phase))]++
	}
	for phase, n := range counts {
		ch <- prometheus.MustNewConstMetric(phaseCountDesc, prometheus.GaugeValue, float64(n), c.node, phase)
	}
}

type result struct {
	vmi   *v1alpha1.VirtualMachineInstance
	stats protocol.Stats
	err   error
}

// gather asks the launcher of each running VMI for its stats, all at once (at most maxConcurrent),
// and delivers the results on the returned channel; asked is how many will come. The channel has
// room for all, so a call ending after the scrape gave up never blocks. A VMI whose launcher is
// still busy with a call of an earlier scrape is not asked (and counted as an error): a hung
// launcher holds one goroutine at most, however often Prometheus scrapes.
func (c *Collector) gather(ctx context.Context, vmis []*v1alpha1.VirtualMachineInstance) (_ <-chan result, asked int) {
	out := make(chan result, len(vmis))
	sem := make(chan struct{}, maxConcurrent)
	for _, vmi := range vmis {
		if vmi.Status.Phase != v1alpha1.Running {
			continue
		}
		if !c.claim(vmi.UID) {
			c.scrapeErrors.Add(1)
			c.log.V(1).Info("launcher still busy with an earlier metrics call; not asked", "vmi", vmi.Namespace+"/"+vmi.Name, "uid", vmi.UID)
			continue
		}
		asked++
		go func() {
			defer c.release(vmi.UID)
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				out <- result{vmi: vmi, err: ctx.Err()}
				return
			}
			defer func() { <-sem }()
			st, err := c.stats(ctx, vmi)
			out <- result{vmi: vmi, stats: st, err: err}
		}()
	}
	return out, asked
}

// claim marks a call to uid's launcher pending; false when one already is.
func (c *Collector) claim(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, busy := c.asking[uid]; busy {
		return false
	}
	c.asking[uid] = struct{}{}
	return true
}

func (c *Collector) release(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.asking, uid)
}

// stats asks vmi's launcher, within launcherTimeout and the scrape's ctx.
func (c *Collector) stats(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (protocol.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, c.launcherTimeout)
	defer cancel()
	dir, err := podsockets.Running(c.podsDir, c.node, vmi)
	if err != nil {
		return protocol.Stats{}, err
	}
	cl := launcher.NewClient(dir.Command())
	defer cl.Close()
	return cl.Stats(ctx)
}

func (c *Collector) labels(vmi *v1alpha1.VirtualMachineInstance) []string {
	return []string{c.node, vmi.Namespace, vmi.Name}
}

// emitVMI sends one VMI's series; base is its node, namespace and name label values.
func emitVMI(ch chan<- prometheus.Metric, base []string, st *protocol.Stats) {
	counter := func(d *prometheus.Desc, v float64, extra ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append(base[:len(base):len(base)], extra...)...)
	}
	counter(cpuUsageDesc, st.CPU.Total().Seconds())
	counter(cpuUserDesc, st.CPU.User.Seconds())
	counter(cpuSystemDesc, st.CPU.System.Seconds())
	for _, v := range st.VCPUs {
		// KubeVirt reports libvirt's vCPU state; a vCPU QEMU lists is online, i.e. "running" there.
		counter(vcpuSecondsDesc, v.Time.Total().Seconds(), strconv.Itoa(v.ID), "running")
	}
	ch <- prometheus.MustNewConstMetric(memoryResidentDesc, prometheus.GaugeValue, float64(st.MemoryResidentBytes), base...)
	for i := range st.Disks {
		for _, m := range diskMetrics {
			counter(m.desc, m.value(&st.Disks[i]), st.Disks[i].Name)
		}
	}
	for i := range st.Interfaces {
		for _, m := range nicMetrics {
			counter(m.desc, m.value(&st.Interfaces[i]), st.Interfaces[i].Name)
		}
	}
}
