package cluster

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/local/supervise"
)

// ControllerReplicas is how many qvirt-controller processes local mode runs, as config/'s
// Deployment runs two pods: one leads, all serve the webhooks.
const ControllerReplicas = 2

// ControllerOptions run the qvirt-controller replicas as host processes.
type ControllerOptions struct {
	// Binary is qvirt-controller.
	Binary    string
	Namespace string
	// Address is where kube-apiserver reaches the webhooks (a bridge address: it refuses loopback
	// endpoints). Replica i (from 1) serves them on every host address at WebhookPort+i-1 and
	// /readyz on 127.0.0.1:ProbePort+i-1.
	Address                net.IP
	WebhookPort, ProbePort int
	// PprofPort, when set, serves Go's /debug/pprof/ from replica i on 127.0.0.1:PprofPort+i-1.
	PprofPort int
	// MetricsPort, when set, serves replica i's /metrics (for qvirt-metrics-reader's tokens) on
	// 127.0.0.1:MetricsPort+i-1.
	MetricsPort int
	// ShutdownDelay is each replica's --shutdown-delay (2s when zero).
	ShutdownDelay time.Duration
}

// ControllerName is replica i's component name (from 1): qvirt-controller, qvirt-controller-2, ...
func ControllerName(i int) string {
	if i == 1 {
		return "qvirt-controller"
	}
	return "qvirt-controller-" + strconv.Itoa(i)
}

func (o ControllerOptions) probe(i int) string { return "127.0.0.1:" + strconv.Itoa(o.ProbePort+i-1) }

// Controller is replica i (from 1) of qvirt-controller: the admin kubeconfig, leader election,
// the webhook served with Secret qvirt-webhook-cert (which the leader issues); ready when its
// webhook serves.
func (cp *ControlPlane) Controller(o ControllerOptions, i int) supervise.Component {
	delay := o.ShutdownDelay
	if delay == 0 {
		delay = 2 * time.Second
	}
	return supervise.Component{Name: ControllerName(i), Path: o.Binary,
		Args: []string{"--namespace=" + o.Namespace, "--leader-elect", "--webhook-port=" + strconv.Itoa(o.WebhookPort+i-1),
			"--shutdown-delay=" + delay.String(), "--metrics-bind-address=" + cmp.Or(pprofAddress(o.MetricsPort, i), "0"),
			"--health-probe-bind-address=" + o.probe(i), "--pprof-bind-address=" + pprofAddress(o.PprofPort, i)},
		Env:   []string{"KUBECONFIG=" + filepath.Clean(cp.Kubeconfig)},
		Ready: supervise.HTTPReady("http://"+o.probe(i)+"/readyz", nil)}
}

// StartControllers starts the replicas and keeps the webhook Service's endpoints (one
// EndpointSlice per replica, since each has its own port) ready exactly while the replica's
// /readyz answers, as the EndpointSlice controller does for pods. kube-apiserver, with
// --enable-aggregator-routing, sends each webhook call to a ready endpoint: a replica that stops
// (SIGTERM: not ready, then it drains for its shutdown delay) gets no more calls.
func (cp *ControlPlane) StartControllers(ctx, bg context.Context, sup *supervise.Supervisor, c client.Client, o ControllerOptions) error {
	pub := &endpointPublisher{c: c, o: o, ready: map[int]bool{}, serving: make(chan struct{})}
	// The first replica cannot become ready before the others are listed: its readiness needs the
	// certificate it issues as leader, nothing else.
	go pub.run(bg)
	for i := 1; i <= ControllerReplicas; i++ {
		if err := sup.Start(ctx, cp.Controller(o, i)); err != nil {
			return err
		}
	}
	// Started means the webhooks answer through their Service, as a rollout waits for ready
	// endpoints.
	select {
	case <-pub.serving:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for a ready webhook endpoint: %w", ctx.Err())
	}
}

// How often the endpoint publisher probes each replica's /readyz, as a kubelet's readiness probe
// (whose default period is 10 s). Each probe costs the replica a TLS handshake (its webhook
// server's started check dials itself), so probing every 100 ms made most of an idle controller's
// CPU. While every replica is ready a second still takes a stopping one out of the endpoints well
// within its shutdown delay (2 s); while one is not, a starting replica is published at once.
const (
	readinessPeriod         = time.Second
	readinessPeriodNotReady = 100 * time.Millisecond
)

// endpointPublisher writes replica i's readiness into EndpointSlice qvirt-controller-webhook-i.
type endpointPublisher struct {
	c     client.Client
	o     ControllerOptions
	ready map[int]bool
	// serving is closed once a replica was first published ready.
	serving chan struct{}
}

func (p *endpointPublisher) run(ctx context.Context) {
	hc := &http.Client{Timeout: time.Second}
	for {
		allReady := true
		for i := 1; i <= ControllerReplicas; i++ {
			ready := probeOK(ctx, hc, "http://"+p.o.probe(i)+"/readyz")
			allReady = allReady && ready
			if was, ok := p.ready[i]; ok && was == ready {
				continue
			}
			if err := p.publish(ctx, i, ready); err != nil {
				log.FromContext(ctx).Error(err, "publish the webhook endpoint", "replica", i, "ready", ready)
				allReady = false
				continue
			}
			p.ready[i] = ready
			if ready && !isClosed(p.serving) {
				close(p.serving)
			}
		}
		period := readinessPeriod
		if !allReady {
			period = readinessPeriodNotReady
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func probeOK(ctx context.Context, hc *http.Client, url string) bool {
	if hc == nil {
		hc = &http.Client{Timeout: time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (p *endpointPublisher) publish(ctx context.Context, i int, ready bool) error {
	slice := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"name": fmt.Sprintf("%s-%d", certs.WebhookService, i), "namespace": p.o.Namespace,
			"labels": map[string]any{"kubernetes.io/service-name": certs.WebhookService}},
		"addressType": "IPv4",
		"endpoints": []any{map[string]any{"addresses": []any{p.o.Address.String()},
			"conditions": map[string]any{"ready": ready, "serving": ready}}},
		"ports": []any{map[string]any{"name": "webhook", "port": int64(p.o.WebhookPort + i - 1), "protocol": "TCP"}}}}
	return applyAll(ctx, p.c, []*unstructured.Unstructured{slice})
}
