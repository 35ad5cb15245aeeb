// Command qvirt-handler is the node agent: it runs on every node (a DaemonSet), sets up the guests'
// networks in their launcher pods, drives the launchers over their sockets and keeps the status of
// the instances on its node true.
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/handler"
	"github.com/qvirt/qvirt/handler/nodeagent"
	"github.com/qvirt/qvirt/internal/metricsauth"
	"github.com/qvirt/qvirt/internal/restlimit"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

func main() {
	opts := handler.Options{}
	flag.StringVar(&opts.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	flag.StringVar(&opts.PodsDir, "pods-dir", podlayout.KubeletPodsDir, "the kubelet's pods directory, where each launcher pod's sockets volume is")
	flag.StringVar(&opts.CPUManagerState, "cpu-manager-state", nodeagent.CPUManagerStateFile,
		"the kubelet's CPU manager state file, whose policy the Node's cpumanager label shows; empty leaves the label to the administrator")
	flag.StringVar(&opts.Namespace, "namespace", envOr("POD_NAMESPACE", "qvirt-system"), "install namespace holding ConfigMaps qvirt-config and "+certs.BundleConfigMap)
	flag.BoolVar(&opts.DevicePlugin, "device-plugin", true, "serve the kubelet device plugin for devices.qvirt.io/kvm and /tun (off in local mode)")
	flag.StringVar(&opts.Streams.Addr, "streams-bind-address", ":8186", "address of the mTLS stream server for qvirt-api (0 disables it); its certificate names this node, from qvirt-controller (a CertificateSigningRequest of signer "+certs.HandlerSignerName+"), with the CA bundle of ConfigMap "+certs.BundleConfigMap+" in --namespace")
	flag.StringVar(&opts.Streams.AdvertiseAddress, "streams-advertise-address", "", "host:port where qvirt-api reaches the stream server (default $POD_IP and the bind address's port)")
	allowed := flag.String("streams-allowed-client-names", "qvirt-api", "comma-separated client certificate names accepted (empty: any the CA signed)")
	flag.StringVar(&opts.Migration.Addr, "migration-bind-address", ":8187", "address of the mTLS migration endpoint other node agents send guests to, with the stream server's certificate (0 disables migrations to and from this node)")
	flag.StringVar(&opts.Migration.AdvertiseAddress, "migration-advertise-address", "", "host:port where other node agents reach the migration endpoint (default $POD_IP and the bind address's port)")
	metricsAddr := flag.String("metrics-bind-address", ":8443", "address of the Prometheus /metrics endpoint, HTTPS for scrapers bound to ClusterRole qvirt-metrics-reader (0 disables it)")
	metricsCert := flag.String("metrics-cert-dir", "", "directory with tls.crt and tls.key for /metrics (empty: a self-signed certificate)")
	probeAddr := flag.String("health-probe-bind-address", ":8444", "address of /healthz and /readyz")
	pprofAddr := flag.String("pprof-bind-address", "", "address of Go's /debug/pprof/ profiles, unauthenticated: bind it to loopback (empty disables it)")
	// A node agent writes its own node's instances' status only.
	apiLimit := restlimit.Register(flag.CommandLine, 50, 100)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	if opts.Streams.AdvertiseAddress == "" && os.Getenv("POD_IP") != "" {
		if _, port, err := net.SplitHostPort(opts.Streams.Addr); err == nil {
			opts.Streams.AdvertiseAddress = net.JoinHostPort(os.Getenv("POD_IP"), port)
		}
	}
	if opts.Migration.AdvertiseAddress == "" && os.Getenv("POD_IP") != "" {
		if _, port, err := net.SplitHostPort(opts.Migration.Addr); err == nil {
			opts.Migration.AdvertiseAddress = net.JoinHostPort(os.Getenv("POD_IP"), port)
		}
	}
	if *allowed != "" {
		opts.Streams.AllowedClientNames = strings.Split(*allowed, ",")
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	if err := run(opts, apiLimit, metricsauth.ServerOptions(*metricsAddr, *metricsCert), *probeAddr, *pprofAddr); err != nil {
		ctrl.Log.Error(err, "qvirt-handler failed")
		os.Exit(1)
	}
}

func run(opts handler.Options, apiLimit *restlimit.Flags, metrics server.Options, probeAddr, pprofAddr string) error {
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	if err := apiLimit.Apply(cfg); err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 sch,
		Cache:                  handler.CacheOptions(opts.NodeName, opts.Namespace),
		Metrics:                metrics,
		HealthProbeBindAddress: probeAddr,
		PprofBindAddress:       pprofAddr,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := handler.Setup(ctx, mgr, opts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
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
