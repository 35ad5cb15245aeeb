package testutil

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Metrics are a scrape's metric families by name.
type Metrics map[string]*dto.MetricFamily

// ParseMetrics parses Prometheus' text format.
func ParseMetrics(raw []byte) (Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return families, nil
}

// APIServerMetrics scrapes kube-apiserver's /metrics.
func APIServerMetrics(ctx context.Context, cs kubernetes.Interface) (Metrics, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	return ParseMetrics(raw)
}

// ScrapeWithToken scrapes a qvirt component's /metrics (HTTPS, its certificate self-signed) as
// a scraper with token does.
func ScrapeWithToken(url, token string) (Metrics, error) {
	code, body := GetWithToken(url, token)
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %.300s", url, code, body)
	}
	return ParseMetrics([]byte(body))
}

// Hist is a histogram's sum, count and cumulative buckets (upper bound -> count).
type Hist struct {
	Sum, Count float64
	Buckets    map[float64]float64
}

// Since is what h gained after before.
func (h Hist) Since(before Hist) Hist {
	out := Hist{Sum: h.Sum - before.Sum, Count: h.Count - before.Count, Buckets: map[float64]float64{}}
	for le, n := range h.Buckets {
		out.Buckets[le] = n - before.Buckets[le]
	}
	return out
}

// Add is h and o together: what two sources (replicas, label sets) observed.
func (h Hist) Add(o Hist) Hist {
	out := Hist{Sum: h.Sum + o.Sum, Count: h.Count + o.Count, Buckets: map[float64]float64{}}
	for _, x := range []Hist{h, o} {
		for le, n := range x.Buckets {
			out.Buckets[le] += n
		}
	}
	return out
}

// Mean is the mean observation, 0 without one.
func (h Hist) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / h.Count
}

// Quantile estimates the q-quantile (0..1) by linear interpolation within its bucket, as
// Prometheus' histogram_quantile does; an observation beyond the last finite bound reads as that
// bound.
func (h Hist) Quantile(q float64) float64 {
	if h.Count == 0 {
		return 0
	}
	bounds := make([]float64, 0, len(h.Buckets))
	for le := range h.Buckets {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	rank := q * h.Count
	prevBound, prevCount := 0.0, 0.0
	for _, le := range bounds {
		n := h.Buckets[le]
		if n >= rank {
			if le > 1e300 { // +Inf
				return prevBound
			}
			if n == prevCount {
				return le
			}
			return prevBound + (le-prevBound)*(rank-prevCount)/(n-prevCount)
		}
		prevBound, prevCount = le, n
	}
	return prevBound
}

// Histograms sums histogram family name's series by the values of keys (joined by a space),
// keeping only series whose labels match every entry of where.
func (m Metrics) Histograms(name string, where map[string]string, keys ...string) map[string]Hist {
	out := map[string]Hist{}
	for _, s := range m[name].GetMetric() {
		labels := labelMap(s)
		if !matches(labels, where) {
			continue
		}
		var parts []string
		for _, k := range keys {
			parts = append(parts, labels[k])
		}
		key := strings.Join(parts, " ")
		h := out[key]
		if h.Buckets == nil {
			h.Buckets = map[float64]float64{}
		}
		hist := s.GetHistogram()
		h.Sum += hist.GetSampleSum()
		h.Count += float64(hist.GetSampleCount())
		for _, b := range hist.GetBucket() {
			h.Buckets[b.GetUpperBound()] += float64(b.GetCumulativeCount())
		}
		out[key] = h
	}
	return out
}

// Counter sums counter family name's series whose labels match every entry of where.
func (m Metrics) Counter(name string, where map[string]string) float64 {
	var total float64
	for _, s := range m[name].GetMetric() {
		if matches(labelMap(s), where) {
			total += s.GetCounter().GetValue()
		}
	}
	return total
}

func labelMap(s *dto.Metric) map[string]string {
	labels := map[string]string{}
	for _, l := range s.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	return labels
}

func matches(labels, where map[string]string) bool {
	for k, v := range where {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// ServiceAccountToken creates ServiceAccount ns/name, binds it to clusterRole (by a
// ClusterRoleBinding of the same name, which the caller removes) unless that is "", and returns a
// token for it valid for an hour.
func ServiceAccountToken(ctx context.Context, cs kubernetes.Interface, ns, name, clusterRole string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create ServiceAccount %s/%s: %w", ns, name, err)
	}
	if clusterRole != "" {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("bind ServiceAccount %s/%s to %s: %w", ns, name, clusterRole, err)
		}
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token of ServiceAccount %s/%s: %w", ns, name, err)
	}
	return tr.Status.Token, nil
}

// GetWithToken GETs url over TLS without verifying the server (a metrics endpoint's certificate
// is self-signed unless --metrics-cert-dir names one), with bearer token when not "". It returns
// the status code and body, or 0 and the error.
func GetWithToken(url, token string) (int, string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // self-signed
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
