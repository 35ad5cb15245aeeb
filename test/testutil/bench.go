package testutil

import (
	"context"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ReportGoal reports a benchmark's figure and the goal it is held to (issue 16's), as unit+"-goal":
// the figures print sorted by unit, so each goal prints beside its figure.
func ReportGoal(b *testing.B, value float64, unit string, goal float64) {
	b.ReportMetric(value, unit)
	b.ReportMetric(goal, unit+"-goal")
}

// LiveHeap is the heap in use after a full collection: what a benchmark's process holds.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// DrainWatch hands every event of w to see until w ends or ctx is done, then stops w.
func DrainWatch(ctx context.Context, w watch.Interface, see func(watch.Event)) {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			see(ev)
		}
	}
}

// APIRequests is the API server's apiserver_request_total by "VERB resource[/subresource]", with
// the response code added when it is not a success ("PATCH virtualmachineinstances/status 409"),
// summed over the other labels: the requests it served from every client since it started.
func APIRequests(ctx context.Context, cfg *rest.Config) (map[string]float64, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	families, err := APIServerMetrics(ctx, cs)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		labels := labelMap(m)
		key := labels["verb"] + " " + labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		if code := labels["code"]; code != "" && code[0] != '2' {
			key += " " + code
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out, nil
}

// Sum is the total of counts.
func Sum(counts map[string]float64) float64 {
	var t float64
	for _, v := range counts {
		t += v
	}
	return t
}
