// Command qvirt-controller is the cluster-wide brain: it turns VirtualMachines into
// VirtualMachineInstances, VMIs into launcher pods and migrations into target pods, and serves the
// admission webhooks (KubeVirt's defaults, validation). Configuration comes from the ConfigMap
// qvirt-config in its namespace.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/controllers"
	"github.com/qvirt/qvirt/controllers/nodehealth"
	"github.com/qvirt/qvirt/internal/metricsauth"
)

func main() {
	var (
		metricsAddr = flag.String("metrics-bind-address", ":8080", "address of the Prometheus /metrics endpoint, HTTPS for scrapers bound to ClusterRole qvirt-metrics-reader (0 disables it)")
		metricsCert = flag.String("metrics-cert-dir", "", "directory with tls.crt and tls.key for /metrics (empty: a self-signed certificate)")
		probeAddr   = flag.String("health-probe-bind-address", ":8081", "address of /healthz and /readyz")
		leaderElect = flag.Bool("leader-elect", false, "elect one active controller among the replicas")
		namespace   = flag.String("namespace", envOr("POD_NAMESPACE", "qvirt-system"), "install namespace holding ConfigMap qvirt-config")
		webhooks    = flag.Bool("webhooks", true, "serve the admission webhooks (defaulting and validating)")
		webhookPort = flag.Int("webhook-port", 9443, "port of the webhook server")
		certDir     = flag.String("webhook-cert-dir", "", "directory with tls.crt and tls.key for the webhook server")
		nodeTimeout = flag.Duration("node-heartbeat-timeout", nodehealth.DefaultTimeout, "how long a node agent may go without a heartbeat before its instances are failed")
	)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := run(metricsauth.ServerOptions(*metricsAddr, *metricsCert), *probeAddr, *leaderElect, *namespace, *webhooks, *webhookPort, *certDir, *nodeTimeout); err != nil {
		ctrl.Log.Error(err, "qvirt-controller failed")
		os.Exit(1)
	}
}

func run(metrics server.Options, probeAddr string, leaderElect bool, namespace string, webhooks bool, webhookPort int, certDir string, nodeTimeout time.Duration) error {
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  sch,
		Cache:                   controllers.CacheOptions(namespace),
		Metrics:                 metrics,
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "qvirt-controller.qvirt.io",
		LeaderElectionNamespace: namespace,
		WebhookServer:           webhook.NewServer(webhook.Options{Port: webhookPort, CertDir: certDir}),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: namespace, Webhooks: webhooks, NodeHeartbeatTimeout: nodeTimeout}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	ready := healthz.Ping
	if webhooks {
		ready = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
