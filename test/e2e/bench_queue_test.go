package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// Where a start waits. The phase clock says how long each milestone took; these say what the
// time went to inside the first one (create to pod created), from the servers' own histograms
// over the starts: kube-apiserver's latency per request kind for instances and pods, its
// priority-and-fairness queueing, each admission webhook's latency, the VMI reconciler's work
// queue (time an instance waited for a worker) and reconcile time, and qvirt-controller's requests
// as it saw them: their latency by verb and their wait for a rate-limit token.

// queueScrape is one reading of kube-apiserver's and every qvirt-controller replica's metrics.
type queueScrape struct {
	api         testutil.Metrics
	controllers []testutil.Metrics
}

// queueFigures reads the metrics now; the returned func reads them again and reports the
// difference.
func queueFigures(ctx context.Context, b *testing.B, ns string) (report func()) {
	b.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", lc.Kubeconfig)
	if err != nil {
		b.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	token := metricsToken(ctx, b, cs, ns)
	read := func() queueScrape {
		api, err := testutil.APIServerMetrics(ctx, cs)
		if err != nil {
			b.Fatal(err)
		}
		s := queueScrape{api: api}
		for name, addr := range lc.ControllerMetricsAddresses() {
			m, err := testutil.ScrapeWithToken("https://"+addr+"/metrics", token)
			if err != nil {
				b.Fatalf("metrics of %s: %v", name, err)
			}
			s.controllers = append(s.controllers, m)
		}
		return s
	}
	before := read()
	return func() { reportQueue(b, before, read()) }
}

func reportQueue(b *testing.B, before, after queueScrape) {
	for _, res := range []string{"virtualmachineinstances", "pods"} {
		where := map[string]string{"resource": res}
		grew := histDelta(after.api, before.api, "apiserver_request_duration_seconds", where, "verb", "subresource")
		for key, h := range grew {
			if verb, _, _ := strings.Cut(key, " "); verb == "WATCH" || h.Count == 0 {
				continue
			}
			reportMS(b, "apiserver-"+metricName(key+" "+res), h)
		}
	}
	for key, h := range histDelta(after.api, before.api, "apiserver_flowcontrol_request_wait_duration_seconds", map[string]string{"execute": "true"}, "priority_level") {
		if h.Count > 0 {
			reportMS(b, "apf-wait-"+metricName(key), h)
		}
	}
	for key, h := range histDelta(after.api, before.api, "apiserver_admission_webhook_admission_duration_seconds", nil, "name", "operation") {
		if h.Count > 0 {
			reportMS(b, "webhook-"+metricName(key), h)
		}
	}
	var wait, work, limiter testutil.Hist
	requests := map[string]testutil.Hist{}
	for i := range after.controllers {
		now, was := after.controllers[i], before.controllers[i]
		vmi := map[string]string{"name": "vmi"}
		wait = wait.Add(histDelta(now, was, "workqueue_queue_duration_seconds", vmi)[""])
		work = work.Add(histDelta(now, was, "workqueue_work_duration_seconds", vmi)[""])
		limiter = limiter.Add(histDelta(now, was, "rest_client_rate_limiter_duration_seconds", nil)[""])
		for verb, h := range histDelta(now, was, "rest_client_request_duration_seconds", nil, "verb") {
			requests[verb] = requests[verb].Add(h)
		}
	}
	reportMS(b, "vmi-queue-wait", wait)
	reportMS(b, "vmi-reconcile", work)
	reportMS(b, "controller-token-wait", limiter)
	for verb, h := range requests {
		if h.Count > 0 && verb != "WATCH" {
			reportMS(b, "controller-"+metricName(verb), h)
		}
	}
	b.ReportMetric(work.Count/benchVMIs, "vmi-reconciles-per-vmi")
}

// histDelta is what each of name's histograms (summed by keys) gained from before to after.
func histDelta(after, before testutil.Metrics, name string, where map[string]string, keys ...string) map[string]testutil.Hist {
	was := before.Histograms(name, where, keys...)
	out := map[string]testutil.Hist{}
	for key, h := range after.Histograms(name, where, keys...) {
		out[key] = h.Since(was[key])
	}
	return out
}

// reportMS reports a histogram's mean and P95 in milliseconds.
func reportMS(b *testing.B, name string, h testutil.Hist) {
	b.ReportMetric(h.Mean()*1000, name+"-mean-ms")
	b.ReportMetric(h.Quantile(0.95)*1000, name+"-p95-ms")
}

// metricName makes label values a benchmark unit: lower case, no spaces or slashes.
func metricName(s string) string {
	return strings.ToLower(strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == '/' }), "-"))
}

// metricsToken returns a token of a ServiceAccount in ns bound to config/rbac's
// qvirt-metrics-reader, as a Prometheus scraper's; the binding goes when the benchmark ends.
func metricsToken(ctx context.Context, b *testing.B, cs kubernetes.Interface, ns string) string {
	b.Helper()
	raw, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "config", "rbac", "metrics_reader_role.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(raw, &role); err != nil {
		b.Fatalf("config/rbac/metrics_reader_role.yaml: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	name := ns + "-metrics"
	token, err := testutil.ServiceAccountToken(ctx, cs, ns, name, role.Name)
	b.Cleanup(func() {
		_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	if err != nil {
		b.Fatal(err)
	}
	return token
}
