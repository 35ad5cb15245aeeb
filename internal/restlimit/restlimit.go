// Package restlimit sets how many requests a component may send kube-apiserver: client-go's token
// bucket (rest.Config's QPS and Burst), which controller-runtime sets to 20 a second with bursts
// of 30 when they are unset. A limit below what a burst of new instances asks for is a queue in
// front of every start: at 100 instances created in ten seconds qvirt-controller's writes (a pod,
// status patches and events per instance) waited seconds for tokens. So that the queue, and the
// API server's answer times, show, a component whose limits are applied also exports on /metrics
// the wait for tokens (rest_client_rate_limiter_duration_seconds) and each request's latency
// (rest_client_request_duration_seconds), by verb, as Kubernetes' own controllers do.
//
// Its client also asks for no compression, as kube-controller-manager's and kube-scheduler's do
// (kubernetes#80919): kube-apiserver gzips a watch list and every event after it on the stream for
// a client that accepts gzip, which costs the API server and the component CPU on every event to
// save bandwidth on what is, between a control plane and its nodes, a fast network. In
// BenchmarkStartup's profiles the decompression alone was about 7% of each qvirt-handler's CPU.
package restlimit

import (
	"flag"
	"fmt"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Flags are a component's --kube-api-qps and --kube-api-burst.
type Flags struct {
	qps   float64
	burst int
}

// Register adds --kube-api-qps and --kube-api-burst to fs with the component's defaults.
func Register(fs *flag.FlagSet, qps float64, burst int) *Flags {
	f := &Flags{}
	fs.Float64Var(&f.qps, "kube-api-qps", qps, "requests a second this component may send kube-apiserver on average")
	fs.IntVar(&f.burst, "kube-api-burst", burst, "requests this component may send kube-apiserver at once, beyond --kube-api-qps")
	return f
}

// Apply sets cfg's limits and turns its compression off, or says which flag is wrong.
func (f *Flags) Apply(cfg *rest.Config) error {
	if f.qps <= 0 || f.qps > 1e6 {
		return fmt.Errorf("--kube-api-qps %v: want a number above 0 and at most 1000000", f.qps)
	}
	if f.burst < 1 || float64(f.burst) < f.qps {
		return fmt.Errorf("--kube-api-burst %d: want at least 1 and at least --kube-api-qps (%v)", f.burst, f.qps)
	}
	cfg.QPS, cfg.Burst = float32(f.qps), f.burst
	cfg.DisableCompression = true
	metrics.RegisterRESTClientMetrics(metrics.MetricRequestLatency, metrics.MetricRateLimiterLatency)
	return nil
}
