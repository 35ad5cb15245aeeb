package restlimit

import (
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

func TestApply(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		qps   float32
		burst int
		err   string
	}{
		{nil, 200, 400, ""},
		{[]string{"--kube-api-qps=50", "--kube-api-burst=50"}, 50, 50, ""},
		{[]string{"--kube-api-qps=0"}, 0, 0, "--kube-api-qps 0: want a number above 0"},
		{[]string{"--kube-api-qps=-1"}, 0, 0, "--kube-api-qps -1"},
		{[]string{"--kube-api-burst=0"}, 0, 0, "--kube-api-burst 0: want at least 1"},
		{[]string{"--kube-api-qps=500"}, 0, 0, "--kube-api-burst 400: want at least 1 and at least --kube-api-qps (500)"},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f := Register(fs, 200, 400)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		cfg := &rest.Config{}
		err := f.Apply(cfg)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.err)
		case tc.err == "" && (cfg.QPS != tc.qps || cfg.Burst != tc.burst):
			t.Errorf("%v: QPS %v burst %d, want %v %d", tc.args, cfg.QPS, cfg.Burst, tc.qps, tc.burst)
		}
	}
}

// TestRequestsAreMeasured: once the limits are applied, a request through the config shows on
// controller-runtime's /metrics registry: its latency and its wait for a token. It does not ask
// for a compressed answer.
func TestRequestsAreMeasured(t *testing.T) {
	var accepted []string
	// Over TLS, as to kube-apiserver: without TLS settings client-go uses Go's default transport.
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accepted = append(accepted, r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer srv.Close()
	f := Register(flag.NewFlagSet("test", flag.ContinueOnError), 200, 400)
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	if err := f.Apply(cfg); err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if len(accepted) != 1 || strings.Contains(accepted[0], "gzip") {
		t.Errorf("Accept-Encoding of the requests: %q, want one request not accepting gzip", accepted)
	}
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			counts[mf.GetName()] += m.GetHistogram().GetSampleCount()
		}
	}
	for _, name := range []string{"rest_client_request_duration_seconds", "rest_client_rate_limiter_duration_seconds"} {
		if counts[name] == 0 {
			t.Errorf("%s recorded no request", name)
		}
	}
}
