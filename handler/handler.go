// Package handler assembles qvirt-handler, the node agent (a DaemonSet on a real cluster): a
// controller-runtime manager whose cache holds only its node's instances and launcher pods, the
// instance reconciler that drives the launchers (handler/vmisync) and the node's other duties.
package handler

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crhandler "sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/handler/deviceplugin"
	"github.com/qvirt/qvirt/handler/metrics"
	"github.com/qvirt/qvirt/handler/migproxy"
	"github.com/qvirt/qvirt/handler/nodeagent"
	"github.com/qvirt/qvirt/handler/streams"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/launcher"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Options configure the node agent.
type Options struct {
	// NodeName is the node this agent serves (the pod's spec.nodeName, from the downward API).
	NodeName string
	// PodsDir is the kubelet's pods directory (podlayout.KubeletPodsDir, a hostPath of the agent's
	// pod), where each launcher pod's own sockets volume is.
	PodsDir string
	// CPUManagerState is the kubelet's CPU manager checkpoint (nodeagent.CPUManagerStateFile),
	// whose policy the agent publishes in the Node's cpumanager label; "" leaves the label alone.
	CPUManagerState string
	// Namespace is the install namespace holding the qvirt-config ConfigMap.
	Namespace string
	// QEMU is the emulator the capability probe runs (the launchers' is in their image); from PATH
	// when empty.
	QEMU string
	// HeartbeatInterval is how often the Node's heartbeat is renewed; 30 s when zero.
	HeartbeatInterval time.Duration
	// Registry receives the per-instance metrics collector; controller-runtime's registry, served
	// on the manager's /metrics, when nil.
	Registry prometheus.Registerer
	// Streams configures the mTLS server of consoles, VNC, the QMP shell and pause/unpause for
	// qvirt-api; off when Streams.Addr is "" or "0".
	Streams StreamsOptions
	// LauncherLimits bound the instance reconciler's calls to launchers in time and size; the
	// production limits when zero (tests shorten them).
	LauncherLimits launcher.ClientOptions
	// DevicePlugin serves the kubelet device plugin for devices.qvirt.io/kvm and /tun: on real
	// nodes only (local mode has no kubelet).
	DevicePlugin bool
	Migration    MigrationOptions
	// Certs yields this node agent's certificate, which names its node (certs.HandlerNodeSpec),
	// and the trust bundle, for the stream server and both ends of the migration tunnel. When
	// nil, Setup requests one from qvirt-controller (certs.NodeCertificate: a key made in
	// memory, a CertificateSigningRequest with the agent's pod-bound token) with the bundle of
	// ConfigMap certs.BundleConfigMap in Namespace, and the manager's readiness waits for it.
	Certs certs.Provider
}

// MigrationOptions are the node agent's migration endpoint (handler/migproxy): mutual TLS between
// node agents, each with the certificate of its own node (Options.Certs).
type MigrationOptions struct {
	// Addr is the endpoint's listen address; off when "" or "0" (the node can then be neither
	// source nor target of a migration).
	Addr string
	// AdvertiseAddress is host:port where other node agents reach the endpoint; the listener's
	// address when empty.
	AdvertiseAddress string
}

// StreamsOptions are the stream server's listener (see handler/streams); its certificate is
// Options.Certs.
type StreamsOptions struct {
	Addr string
	// AdvertiseAddress is host:port where qvirt-api reaches the server, published on the Node
	// (NodeStreamsAddressAnnotation); required when the server is on.
	AdvertiseAddress   string
	AllowedClientNames []string
}

// CacheOptions restrict the cache to one node: instances whose status.nodeName is the node (a CRD
// selectable field, so the API server filters), launcher pods scheduled there and the
// configuration ConfigMap's namespace. Nothing cluster-wide is listed or watched.
func CacheOptions(nodeName, namespace string) cache.Options {
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.VirtualMachineInstance{}: {Field: fields.OneTermEqualSelector("status.nodeName", nodeName)},
			&corev1.Pod{}: {
				Field: fields.OneTermEqualSelector("spec.nodeName", nodeName),
				Label: labels.SelectorFromSet(labels.Set{v1alpha1.AppLabel: v1alpha1.LauncherApp}),
			},
			&corev1.ConfigMap{}: {Namespaces: map[string]cache.Config{namespace: {}}},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
	}
}

// targetCacheOptions select the instances migrating to the node: a second cache, since one
// informer takes one field selector.
func targetCacheOptions(mgr ctrl.Manager, nodeName string) cache.Options {
	return cache.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{
			&v1alpha1.VirtualMachineInstance{}: {Field: fields.OneTermEqualSelector("status.migrationState.targetNode", nodeName)},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
	}
}

// Setup probes the node's capabilities and registers the node agent's parts with mgr, whose cache
// must be CacheOptions(opts.NodeName, opts.Namespace): the instance reconciler, the Node's
// heartbeat and labels, the metrics collector on the manager's /metrics and, when asked, the
// device plugin.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	if opts.NodeName == "" {
		return fmt.Errorf("node name: required (flag --node-name or env NODE_NAME)")
	}
	if opts.PodsDir == "" {
		return fmt.Errorf("pods directory: required (flag --pods-dir)")
	}
	//lint:ignore SA1019 the reconcilers record with the core/v1 Events API, as qvirt-controller's
	rec := mgr.GetEventRecorderFor("qvirt-handler")
	// The configuration starts at the defaults and follows the ConfigMap once the cache has it;
	// the node agent only reads the migration bandwidth from it.
	store := config.NewStore(config.Default())
	if err := (&config.Reconciler{Client: mgr.GetClient(), Namespace: opts.Namespace, Store: store, Recorder: rec}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the configuration reconciler: %w", err)
	}
	targets, err := cache.New(mgr.GetConfig(), targetCacheOptions(mgr, opts.NodeName))
	if err != nil {
		return fmt.Errorf("migration target cache: %w", err)
	}
	if err := mgr.Add(targets); err != nil {
		return err
	}
	if opts.Certs == nil && (streamsOn(opts.Streams) || migrationsOn(opts.Migration)) {
		nc, err := setupNodeCertificate(mgr, opts)
		if err != nil {
			return err
		}
		opts.Certs = nc
	}
	tunnel, err := setupMigrations(mgr, opts)
	if err != nil {
		return err
	}
	r := &vmisync.Reconciler{
		Migrations: tunnel,
		Client:     mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: rec, NodeName: opts.NodeName, PodsDir: opts.PodsDir,
		Targets:         targets,
		Launcher:        opts.LauncherLimits,
		TargetSource:    source.Kind(targets, client.Object(&v1alpha1.VirtualMachineInstance{}), &crhandler.EnqueueRequestForObject{}),
		MigrationConfig: func() config.MigrationConfig { return store.Get().Migrations },
		CPUManagerState: opts.CPUManagerState,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the instance reconciler: %w", err)
	}
	return setupNode(ctx, mgr, opts)
}

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get;list;watch

// setupNodeCertificate adds the node agent's own certificate (requested from qvirt-controller)
// and the trust bundle it is used with, and a readiness check that holds until it is issued.
func setupNodeCertificate(mgr ctrl.Manager, opts Options) (*certs.NodeCertificate, error) {
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	bundle := certs.NewBundleSource(cs, opts.Namespace, certs.BundleConfigMap)
	nc := certs.NewNodeCertificate(cs, opts.NodeName, bundle, 0)
	for _, r := range []manager.Runnable{bundle, nc} {
		if err := mgr.Add(r); err != nil {
			return nil, err
		}
	}
	if err := mgr.AddReadyzCheck("node-certificate", func(*http.Request) error { return nc.Ready() }); err != nil {
		return nil, err
	}
	return nc, nil
}

// setupMigrations starts the migration endpoint when configured; nil when off.
func setupMigrations(mgr ctrl.Manager, opts Options) (vmisync.MigrationTunnel, error) {
	mo := opts.Migration
	if !migrationsOn(mo) {
		return nil, nil
	}
	log := mgr.GetLogger().WithName("migration")
	srv, err := migproxy.Listen(mo.Addr, opts.Certs, log)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(srv); err != nil {
		return nil, err
	}
	adv := mo.AdvertiseAddress
	if adv == "" {
		adv = srv.Addr()
	}
	return &tunnel{Server: srv, Tunnel: migproxy.NewTunnel(opts.Certs, log), address: adv}, nil
}

func migrationsOn(mo MigrationOptions) bool { return mo.Addr != "" && mo.Addr != "0" }

// tunnel is the node's migration endpoint and its outgoing side.
type tunnel struct {
	*migproxy.Server
	*migproxy.Tunnel
	address string
}

func (t *tunnel) Address() string { return t.address }

// setupNode adds what the agent does for its node rather than for one instance.
func setupNode(ctx context.Context, mgr ctrl.Manager, opts Options) error {
	caps, err := nodeagent.Probe(ctx, nodeagent.ProbeOptions{QEMU: opts.QEMU})
	if err != nil {
		return fmt.Errorf("probe the node's capabilities: %w", err)
	}
	mgr.GetLogger().Info("node capabilities", "qemuVersion", caps.QEMUVersion, "kvm", caps.KVM, "kvmReason", caps.KVMReason)
	hb := nodeagent.NewHeartbeat(mgr.GetClient(), opts.NodeName, caps, opts.HeartbeatInterval).WithCPUManagerState(opts.CPUManagerState)
	if streamsOn(opts.Streams) {
		hb.AdvertiseStreams(opts.Streams.AdvertiseAddress)
	}
	if err := mgr.Add(hb); err != nil {
		return err
	}
	collector := metrics.NewCollector(mgr.GetClient(), opts.NodeName, opts.PodsDir, mgr.GetLogger().WithName("metrics"))
	reg := opts.Registry
	if reg == nil {
		reg = crmetrics.Registry
	}
	if err := reg.Register(collector); err != nil {
		return fmt.Errorf("register the metrics collector: %w", err)
	}
	if err := setupStreams(mgr, opts); err != nil {
		return err
	}
	if opts.DevicePlugin {
		if err := mgr.Add(deviceplugin.New(deviceplugin.Options{KVM: caps.KVM})); err != nil {
			return err
		}
	}
	return nil
}

// setupStreams adds the stream server qvirt-api connects to.
func setupStreams(mgr ctrl.Manager, opts Options) error {
	so := opts.Streams
	if !streamsOn(so) {
		return nil
	}
	if _, _, err := net.SplitHostPort(so.AdvertiseAddress); err != nil {
		return fmt.Errorf("stream server: advertise address %q: want host:port where qvirt-api reaches this node: %w", so.AdvertiseAddress, err)
	}
	sopts := streams.Options{
		Reader: mgr.GetClient(), NodeName: opts.NodeName, PodsDir: opts.PodsDir, Certs: opts.Certs,
		AllowedClientNames: so.AllowedClientNames, Addr: so.Addr, Log: mgr.GetLogger().WithName("streams"),
	}
	srv, err := streams.New(sopts)
	if err != nil {
		return fmt.Errorf("stream server: %w", err)
	}
	return mgr.Add(srv)
}

func streamsOn(so StreamsOptions) bool { return so.Addr != "" && so.Addr != "0" }
