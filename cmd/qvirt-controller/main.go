// Command qvirt-controller is the cluster-wide brain: it turns VirtualMachines into
// VirtualMachineInstances, VMIs into launcher pods and migrations into target pods, and serves the
// admission webhooks (KubeVirt's defaults, validation). Configuration comes from the ConfigMap
// qvirt-config in its namespace.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/controllers"
	"github.com/qvirt/qvirt/controllers/nodehealth"
	"github.com/qvirt/qvirt/internal/drain"
	"github.com/qvirt/qvirt/internal/metricsauth"
	"github.com/qvirt/qvirt/internal/restlimit"
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
		certSecret  = flag.String("webhook-cert-secret", certs.WebhookSecret, "Secret in --namespace with the webhook server's certificate, which the leader issues and rotates and every replica serves with; unused when --webhook-cert-dir is set")
		certDir     = flag.String("webhook-cert-dir", "", "directory with tls.crt and tls.key for the webhook server, instead of --webhook-cert-secret")
		drainDelay  = flag.Duration("shutdown-delay", 0, "on SIGTERM, fail /readyz and keep serving the webhooks this long before stopping, so the webhook Service stops routing here first")
		nodeTimeout = flag.Duration("node-heartbeat-timeout", nodehealth.DefaultTimeout, "how long a node agent may go without a heartbeat before its instances are failed")
		pprofAddr   = flag.String("pprof-bind-address", "", "address of Go's /debug/pprof/ profiles, unauthenticated: bind it to loopback (empty disables it)")
	)
	// KubeVirt's virt-controller's: a burst of new instances costs a pod, status writes and
	// events each, all from the leader.
	apiLimit := restlimit.Register(flag.CommandLine, 200, 400)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := run(apiLimit, metricsauth.ServerOptions(*metricsAddr, *metricsCert), *probeAddr, *pprofAddr, *leaderElect, *namespace, *webhooks, *webhookPort, *certSecret, *certDir, *nodeTimeout, *drainDelay); err != nil {
		ctrl.Log.Error(err, "qvirt-controller failed")
		os.Exit(1)
	}
}

func run(apiLimit *restlimit.Flags, metrics server.Options, probeAddr, pprofAddr string, leaderElect bool, namespace string, webhooks bool, webhookPort int, certSecret, certDir string, nodeTimeout, drainDelay time.Duration) error {
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	cfg := ctrl.GetConfigOrDie()
	if err := apiLimit.Apply(cfg); err != nil {
		return err
	}
	hookOpts := webhook.Options{Port: webhookPort, CertDir: certDir}
	var serving *certs.Source
	if webhooks && certDir == "" && certSecret != "" {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		// Every replica, leader or not, serves the webhooks with the Secret's current
		// certificate (read at each handshake): admission does not wait for a leader.
		serving = certs.NewSource(cs, namespace, certSecret)
		// Until the leader has issued the certificate the handshake fails, and so does /readyz
		// (the webhook server's started check dials it): the replica stays out of the endpoints.
		hookOpts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.GetCertificate = certs.GetCertificate(serving) }}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  sch,
		Cache:                   controllers.CacheOptions(namespace),
		Metrics:                 metrics,
		HealthProbeBindAddress:  probeAddr,
		PprofBindAddress:        pprofAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "qvirt-controller.qvirt.io",
		LeaderElectionNamespace: namespace,
		// The process ends as soon as the manager stops, so handing the lease over at once is
		// safe; the other replica leads without waiting for the lease to expire.
		LeaderElectionReleaseOnCancel: true,
		WebhookServer:                 webhook.NewServer(hookOpts),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if serving != nil {
		if err := mgr.Add(serving); err != nil {
			return err
		}
	}
	ctx, stopping := drain.OnSignal(ctrl.Log, drainDelay)
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: namespace, Webhooks: webhooks, NodeHeartbeatTimeout: nodeTimeout}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	ready := healthz.Ping
	if webhooks {
		ready = controllers.WebhookReady(mgr.GetWebhookServer().StartedChecker())
	}
	if err := mgr.AddReadyzCheck("readyz", stopping.Ready(ready)); err != nil {
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
