package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/nodeagent"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/local/kubenode"
	"github.com/qvirt/qvirt/local/multus"
	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/local/storage"
	"github.com/qvirt/qvirt/local/supervise"
)

// Local mode's fixed layout. The API server, the webhook and the node agents' endpoints listen on
// the address of a bridge of their own (pods reach the host there: nothing routes to 127.0.0.1).
const (
	Namespace     = "qvirt-system"
	LauncherImage = "qvirt-launcher:local"
	apiBridge     = "qvirt-api"
)

var apiAddress = net.IPv4(10, 243, 0, 1)

// Options configure Up.
type Options struct {
	// Dir is the state directory: kubeconfig, pki/, logs/, nodes/, components.json.
	Dir string
	// Nodes is how many virtual nodes to register (1 or more).
	Nodes int
	// Emulation runs guests under TCG; without it KVM must really work (the node agent's check
	// guest decides) or Up refuses.
	Emulation bool
	// EmulationIfNeeded falls back to emulation, saying so on Progress, when the check guest
	// finds KVM unusable, instead of refusing.
	EmulationIfNeeded bool
	// Runtime is what runs the nodes' pods: RuntimeVirtual (the default, virtual-kubelet nodes
	// whose pods are host processes) or RuntimeContainerd (real kubelet nodes with containerd and
	// runc, local/kubenode; NodeBin holds their binaries).
	Runtime string
	NodeBin string
	// Repo is the source tree (its config/ is installed).
	Repo string
	// Tools holds the control-plane binaries; Bin qvirt-controller, qvirt-handler and
	// qvirt-launcher; CNICache where the CNI plugins are built.
	Tools, Bin, CNICache string
	// GuestDir, when set, holds the test guest (test/guest/build.sh's output), from which the local
	// registry is seeded with the demo images.
	GuestDir string
	// InsecureRegistries are registries besides the local one (host:port, as image references
	// name them) that the virtual nodes may reach over plain HTTP: a private registry of one's own
	// without TLS, reached with a VMI's imagePullSecret.
	InsecureRegistries []string
	// Ports place the control plane (zero: its defaults) and qvirt-controller's webhook (9443
	// when zero) and probe (9441 when zero); replica i uses the port i-1 above these.
	Ports Ports
	// Profiling serves Go's /debug/pprof/ from every qvirt-controller replica and node agent, on
	// loopback (PprofAddresses says where).
	Profiling bool
	// Progress receives one line per step.
	Progress io.Writer
	// Log receives the virtual nodes' logs.
	Log logr.Logger
}

// Node runtimes (Options.Runtime).
const (
	RuntimeVirtual    = "virtual"
	RuntimeContainerd = "containerd"
)

// Ports are the TCP ports a local cluster listens on.
type Ports struct {
	APIServer, Etcd, ControllerManager, Scheduler, Webhook, ControllerProbe int
	// Registry is the local registry's (5000 when zero). Node i's stream server listens on
	// Streams+i (8186+i when zero). API is qvirt-api's (8443 when zero).
	Registry, Streams, API int
}

// RegistryAddress is where launchers reach the local registry (plain HTTP) when Ports.Registry is
// zero; the demo VM's image names it.
const RegistryAddress = "10.243.0.1:5000"

// Cluster is a running local cluster.
type Cluster struct {
	opts Options
	sup  *supervise.Supervisor
	cp   *ControlPlane
	// client is the cluster admin's.
	client client.Client
	nodes  []string
	// kubeNodes are the real kubelet nodes' (Runtime containerd).
	kubeNodes []kubenode.Options
	stopNodes context.CancelFunc
	nodesDone chan error
	// multusBin holds Multus's thin plugin, which virtual nodes attach secondary networks with.
	multusBin  string
	Kubeconfig string
	// Registry is the local registry's host:port; Images what Up seeded it with (when GuestDir was
	// set).
	Registry string
	Images   registry.Images
	// registryDone reports the registry's end once stopNodes cancelled it.
	registryDone chan error
	// storageDone reports the provisioner's end once stopNodes cancelled it.
	storageDone chan error
}

// VolumesDir is where local mode's provisioner keeps the volumes of claims (local/storage): under
// the state directory, hidden from pods but for the volumes each pod is given.
func VolumesDir(dir string) string { return filepath.Join(dir, "volumes") }

// NodeName is the name of virtual node i (from 1).
func NodeName(i int) string { return fmt.Sprintf("qvirt-node-%d", i) }

// nodeStateDir is virtual node i's state: its pods with their volumes, network namespaces, logs.
func nodeStateDir(dir string, i int) string { return filepath.Join(dir, "nodes", NodeName(i)) }

// nodeImageCache is virtual node i's image cache, where its provider keeps the images of the
// launcher pods' image volumes (the kubelet's image store on a real node). It is root's and, under
// Dir, hidden from every pod.
func nodeImageCache(dir string, i int) string {
	return filepath.Join(nodeStateDir(dir, i), "images")
}

// LauncherDir is where virtual node i's agent reaches vmi's launcher: the sockets volume of the
// VMI's active launcher pod on that node.
func LauncherDir(dir string, i int, vmi *v1alpha1.VirtualMachineInstance) (launcher.Dir, error) {
	return podsockets.Running(provider.PodsDir(nodeStateDir(dir, i)), NodeName(i), vmi)
}

// nodeImageCacheBytes caps each virtual node's image cache: room for the demo images many times
// over, while a long-lived local cluster does not fill the disk with images no VM uses.
const nodeImageCacheBytes = 8 << 30

// Up brings the whole cluster up: control plane, qvirt's API and controller, then each virtual
// node with its node agent. What a crashed earlier run left in Dir is cleaned first.
func Up(ctx context.Context, opts Options) (_ *Cluster, retErr error) {
	if opts.Nodes < 1 {
		return nil, fmt.Errorf("--nodes: want at least 1, got %d", opts.Nodes)
	}
	switch opts.Runtime {
	case "", RuntimeVirtual, RuntimeContainerd:
	default:
		return nil, fmt.Errorf("--runtime %q: want %s or %s", opts.Runtime, RuntimeVirtual, RuntimeContainerd)
	}
	if len(opts.Dir) > 40 || !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("--state-dir %q: want an absolute path of at most 40 bytes (unix socket paths live under it)", opts.Dir)
	}
	// Launchers run unprivileged (uid 107) and must reach their node's socket directory.
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	step := func(format string, args ...any) { fmt.Fprintf(opts.Progress, "local up: "+format+"\n", args...) }
	if err := Cleanup(opts.Dir); err != nil {
		return nil, fmt.Errorf("clean up an earlier run: %w", err)
	}
	if !opts.Emulation {
		step("checking that KVM works (a tiny check guest)")
		caps, err := nodeagent.Probe(ctx, nodeagent.ProbeOptions{})
		if err != nil {
			return nil, err
		}
		switch {
		case caps.KVM:
		case opts.EmulationIfNeeded:
			step("KVM does not work here (%s): guests run under software emulation, about 20x slower", caps.KVMReason)
			opts.Emulation = true
		default:
			return nil, fmt.Errorf("KVM does not work on this machine (%s): pass --emulation to run guests under software emulation", caps.KVMReason)
		}
	}
	sup, err := supervise.New(opts.Dir)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, sup: sup}
	defer func() {
		if retErr != nil {
			c.Down()
		}
	}()
	if err := addBridge(apiBridge, apiAddress); err != nil {
		return nil, err
	}
	step("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler (logs in %s)", filepath.Join(opts.Dir, "logs"))
	p := opts.Ports
	if c.cp, err = StartControlPlane(ctx, sup, ControlPlaneOptions{Dir: opts.Dir, Tools: opts.Tools, Address: apiAddress,
		APIServerPort: p.APIServer, EtcdPort: p.Etcd, ControllerManagerPort: p.ControllerManager, SchedulerPort: p.Scheduler}); err != nil {
		return nil, err
	}
	c.Kubeconfig = c.cp.Kubeconfig
	step("installing qvirt's CRDs, configuration and webhook")
	restCfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	sch, err := scheme.New()
	if err != nil {
		return nil, err
	}
	cl, err := client.New(restCfg, client.Options{Scheme: sch})
	if err != nil {
		return nil, err
	}
	c.client = cl
	nodeCtx, stop := context.WithCancel(context.Background())
	c.stopNodes, c.nodesDone = stop, make(chan error, opts.Nodes)
	if err := c.startRegistry(ctx, nodeCtx); err != nil {
		return nil, err
	}
	// Local mode's StorageClass offers ReadWriteMany (every node is this host), so backend-storage
	// claims are made shared, and VMs with persistent EFI variables can migrate.
	cfg := map[string]string{"useEmulation": strconv.FormatBool(opts.Emulation), "launcherImage": LauncherImage,
		"vmStateStorageClass": storage.ClassName}
	if p.Webhook == 0 {
		p.Webhook = 9443
	}
	if p.ControllerProbe == 0 {
		p.ControllerProbe = 9441
	}
	// On real nodes qvirt is installed as on any cluster, from config/default, once they are up.
	if opts.Runtime != RuntimeContainerd {
		if err := c.cp.Install(ctx, cl, InstallOptions{Repo: opts.Repo, Namespace: Namespace, Config: cfg}); err != nil {
			return nil, err
		}
	}
	step("starting the storage provisioner (StorageClass %s, the default; volumes in %s)", storage.ClassName, VolumesDir(opts.Dir))
	if err := c.startStorage(ctx, nodeCtx, restCfg); err != nil {
		return nil, err
	}
	if opts.Runtime == RuntimeContainerd {
		if err := c.upOnKubeNodes(ctx, cfg); err != nil {
			return nil, err
		}
		return c, nil
	}
	step("starting %d qvirt-controller replicas (one leads, all serve the webhooks)", ControllerReplicas)
	if err := c.cp.StartControllers(ctx, nodeCtx, sup, cl, ControllerOptions{Binary: filepath.Join(opts.Bin, "qvirt-controller"),
		Namespace: Namespace, Address: apiAddress, WebhookPort: p.Webhook, ProbePort: p.ControllerProbe,
		PprofPort: c.pprofPort(controllerPprofPort), MetricsPort: c.pprofPort(controllerMetricsPort)}); err != nil {
		return nil, err
	}
	step("starting qvirt-api (the aggregated API of consoles, VNC, QMP and VM actions)")
	if p.API == 0 {
		p.API = 8443
	}
	if err := c.startAPI(ctx, cl, p.API); err != nil {
		return nil, err
	}
	step("building the CNI plugins and Multus (cached after the first time)")
	multusBin := make(chan error, 1)
	go func() {
		var err error
		c.multusBin, err = multus.Build(ctx, opts.CNICache)
		multusBin <- err
	}()
	cniBin, err := provider.BuildCNIPlugins(ctx, opts.CNICache)
	if err = errors.Join(err, <-multusBin); err != nil {
		return nil, err
	}
	// Launcher pods run as an unprivileged user: their binaries must be where it can run them.
	if err := installLauncher(opts.Bin, filepath.Join(opts.Dir, "bin")); err != nil {
		return nil, err
	}
	for i := 1; i <= opts.Nodes; i++ {
		name := NodeName(i)
		step("registering virtual node %s and starting its qvirt-handler", name)
		c.nodes = append(c.nodes, name)
		go func() { c.nodesDone <- provider.Run(nodeCtx, c.nodeOptions(i, restCfg, cniBin)) }()
		if err := c.handlerCredentials(ctx, i); err != nil {
			return nil, err
		}
		if err := sup.Start(ctx, c.handler(i)); err != nil {
			return nil, err
		}
	}
	go c.renewHandlerTokens(nodeCtx)
	return c, nil
}

// nodeOptions are virtual node i's: its own bridge and pod subnet, and its own /var/run/qvirt.
func (c *Cluster) nodeOptions(i int, restCfg *rest.Config, cniBin string) provider.Options {
	name := NodeName(i)
	dir := nodeStateDir(c.opts.Dir, i)
	cfg := rest.CopyConfig(restCfg)
	// A kubelet's pod status updates are not throttled like a controller's: with client-go's
	// default 5 QPS a burst of launcher pods waits seconds for its status writes.
	cfg.QPS, cfg.Burst = 100, 200
	// Loopback to kube-apiserver: gzipped watch streams would cost both ends CPU for nothing
	// (restlimit says more).
	cfg.DisableCompression = true
	return provider.Options{NodeName: name, Config: cfg, StateDir: dir, CNIBinDir: cniBin,
		// Multus reads pods and NetworkAttachmentDefinitions as the virtual node does.
		MultusBinDir: c.multusBin, MultusKubeconfig: c.Kubeconfig,
		Log: c.opts.Log.WithName(name), PodCIDR: fmt.Sprintf("10.244.%d.0/24", i), Bridge: fmt.Sprintf("qvirt-n%d", i),
		Images:     map[string]string{LauncherImage: filepath.Join(c.opts.Dir, "bin", "qvirt-launcher")},
		InitBinary: filepath.Join(c.opts.Dir, "bin", "qvirt-pod-init"),
		// Pods see none of the cluster's state (PKI, etcd, the nodes' pods, sockets and caches)
		// but their own volumes.
		HiddenPaths: []string{c.opts.Dir},
		ImageCache:  nodeImageCache(c.opts.Dir, i), ImageCacheMaxBytes: nodeImageCacheBytes,
		// The local registry serves plain HTTP on the API bridge.
		InsecureRegistries: append([]string{c.Registry}, c.opts.InsecureRegistries...),
		Env: map[string]string{"KUBERNETES_SERVICE_HOST": apiAddress.String(),
			"KUBERNETES_SERVICE_PORT": strconv.Itoa(c.cp.opts.APIServerPort)},
	}
}

// handler is node i's qvirt-handler, as its DaemonSet pod would run (here a host process, with
// its pod's identity: handlerauth.go).
func (c *Cluster) handler(i int) supervise.Component {
	name := NodeName(i)
	probe := "127.0.0.1:" + strconv.Itoa(9450+i)
	streams := net.JoinHostPort(apiAddress.String(), strconv.Itoa(c.streamsPort(i)))
	// Other node agents send migrating guests here; 1000 above the stream server's port.
	migration := net.JoinHostPort(apiAddress.String(), strconv.Itoa(c.streamsPort(i)+1000))
	return supervise.Component{Name: "qvirt-handler-" + name, Path: filepath.Join(c.opts.Bin, "qvirt-handler"),
		Args: []string{"--node-name=" + name, "--pods-dir=" + provider.PodsDir(nodeStateDir(c.opts.Dir, i)), "--namespace=" + Namespace,
			// A virtual node has no CPU manager: the host's kubelet checkpoint, if any, is not its.
			"--device-plugin=false", "--cpu-manager-state=",
			"--streams-bind-address=" + streams, "--streams-advertise-address=" + streams,
			"--migration-bind-address=" + migration, "--migration-advertise-address=" + migration,
			"--metrics-bind-address=127.0.0.1:" + strconv.Itoa(9550+i), "--health-probe-bind-address=" + probe,
			"--pprof-bind-address=" + pprofAddress(c.pprofPort(handlerPprofPort), i)},
		Env:   []string{"KUBECONFIG=" + HandlerKubeconfig(c.opts.Dir, i)},
		Ready: supervise.HTTPReady("http://"+probe+"/readyz", nil)}
}

// Down stops the nodes (their pods get SIGTERM: guests power off gracefully), then every
// component in reverse order, and removes the API bridge. Logs and the state stay in Dir.
func (c *Cluster) Down() {
	c.powerOffOnKubeNodes()
	if c.stopNodes != nil {
		c.stopNodes()
		for range c.nodes {
			<-c.nodesDone
		}
	}
	if c.registryDone != nil {
		<-c.registryDone
	}
	if c.storageDone != nil {
		<-c.storageDone
	}
	c.sup.Stop(30 * time.Second)
	for _, n := range c.kubeNodes {
		if err := kubenode.Cleanup(n); err != nil {
			c.opts.Log.Error(err, "clean up real node", "node", n.Name)
		}
	}
	if len(c.kubeNodes) > 0 {
		if err := kubenode.CleanupProxy(); err != nil {
			c.opts.Log.Error(err, "clean up kube-proxy")
		}
	}
	_ = delBridge(apiBridge)
}

// Cleanup removes what a crashed run left in dir: components still running (by the PID
// recorded, checked against its binary), the nodes' namespaces and links, the API bridge.
func Cleanup(dir string) error {
	states, err := supervise.ReadStates(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, st := range states {
		if st.PID != 0 && supervise.Alive(st.PID, st.Path) {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
		}
	}
	var errs []error
	nodes, _ := filepath.Glob(filepath.Join(dir, "nodes", "*"))
	for _, n := range nodes {
		errs = append(errs, provider.Cleanup(n))
	}
	kubeNodes, _ := filepath.Glob(filepath.Join(dir, "kubenodes", "*"))
	for _, n := range kubeNodes {
		errs = append(errs, kubenode.CleanupDir(n))
	}
	if _, err := os.Stat(kubeProxyDir(dir)); err == nil {
		errs = append(errs, kubenode.CleanupProxy())
	}
	errs = append(errs, delBridge(apiBridge))
	return errors.Join(errs...)
}

func addBridge(name string, ip net.IP) error {
	_ = delBridge(name)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("create bridge %s: %w", name, err)
	}
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(24, 32)}}); err != nil {
		return fmt.Errorf("address %s on %s: %w", ip, name, err)
	}
	return netlink.LinkSetUp(br)
}

func delBridge(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if _, ok := l.(*netlink.Bridge); !ok {
		return fmt.Errorf("%s is not a bridge: left alone", name)
	}
	return netlink.LinkDel(l)
}

// streamsPort is node i's stream server port, on the API bridge's address (the node bridges only
// get their address with their first pod).
func (c *Cluster) streamsPort(i int) int {
	base := c.opts.Ports.Streams
	if base == 0 {
		base = 8186
	}
	return base + i
}

// startStorage runs the provisioner of local mode's default StorageClass until nodeCtx ends.
func (c *Cluster) startStorage(ctx, nodeCtx context.Context, restCfg *rest.Config) error {
	kc, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	if err := storage.Install(ctx, kc, VolumesDir(c.opts.Dir)); err != nil {
		return err
	}
	c.storageDone = make(chan error, 1)
	logCtx := klog.NewContext(nodeCtx, c.opts.Log.WithName("storage"))
	go func() { c.storageDone <- storage.Run(logCtx, kc, VolumesDir(c.opts.Dir)) }()
	return nil
}

// startRegistry serves the local registry on the API bridge until nodeCtx ends, and seeds it with
// the demo images when Options.GuestDir is set.
func (c *Cluster) startRegistry(ctx, nodeCtx context.Context) error {
	port := c.opts.Ports.Registry
	if port == 0 {
		port = 5000
	}
	srv, err := registry.Listen(registry.Options{Addr: net.JoinHostPort(apiAddress.String(), strconv.Itoa(port)),
		StateDir: filepath.Join(c.opts.Dir, "registry"), Log: c.opts.Log.WithName("registry")})
	if err != nil {
		return err
	}
	c.Registry, c.registryDone = srv.Addr(), make(chan error, 1)
	go func() { c.registryDone <- srv.Start(nodeCtx) }()
	if c.opts.GuestDir == "" {
		return nil
	}
	fmt.Fprintf(c.opts.Progress, "local up: seeding the local registry %s with the demo images\n", c.Registry)
	c.Images, err = registry.Seed(ctx, c.Registry, c.opts.GuestDir)
	return err
}

// installLauncher copies qvirt-launcher, qvirt-pod-init (each container's first process) and
// qvirt-pull (which the launcher runs to pull images, when built)
// from bin into dst, readable and executable by everyone.
func installLauncher(bin, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, name := range []string{"qvirt-launcher", "qvirt-pull", "qvirt-pod-init"} {
		data, err := os.ReadFile(filepath.Join(bin, name))
		if errors.Is(err, os.ErrNotExist) && name == "qvirt-pull" {
			continue
		}
		if err != nil {
			return fmt.Errorf("launcher binary: %w", err)
		}
		tmp := filepath.Join(dst, "."+name)
		if err := os.WriteFile(tmp, data, 0o755); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	return nil
}

// Where Options.Profiling serves Go's profiles: replica i of qvirt-controller (from 1) on loopback
// port controllerPprofPort+i-1, node i's agent on handlerPprofPort+i-1.
const (
	controllerPprofPort = 9640
	handlerPprofPort    = 9650
	// With profiling, replica i's /metrics is on controllerMetricsPort+i-1 (node agents always
	// serve theirs).
	controllerMetricsPort = 9660
)

// pprofPort is base when profiling is on, else 0 (off).
func (c *Cluster) pprofPort(base int) int {
	if !c.opts.Profiling {
		return 0
	}
	return base
}

// pprofAddress is component i's profile address from base (from pprofPort); "" when base is 0.
func pprofAddress(base, i int) string {
	if base == 0 {
		return ""
	}
	return "127.0.0.1:" + strconv.Itoa(base+i-1)
}

// ControllerMetricsAddresses are where each qvirt-controller replica serves /metrics (HTTPS, for
// tokens of ServiceAccounts bound to qvirt-metrics-reader), by component name; empty unless
// Options.Profiling.
func (c *Cluster) ControllerMetricsAddresses() map[string]string {
	return c.controllerAddresses(controllerMetricsPort)
}

// controllerAddresses are the replicas' loopback addresses from base, by component name; empty
// unless Options.Profiling.
func (c *Cluster) controllerAddresses(base int) map[string]string {
	out := map[string]string{}
	if !c.opts.Profiling {
		return out
	}
	for i := 1; i <= ControllerReplicas; i++ {
		out[ControllerName(i)] = pprofAddress(base, i)
	}
	return out
}

// PprofAddresses are where each qvirt-controller replica and node agent serves /debug/pprof/, by
// component name (empty unless Options.Profiling).
func (c *Cluster) PprofAddresses() map[string]string {
	out := c.controllerAddresses(controllerPprofPort)
	if !c.opts.Profiling {
		return out
	}
	for i := 1; i <= c.opts.Nodes; i++ {
		out["qvirt-handler-"+NodeName(i)] = pprofAddress(handlerPprofPort, i)
	}
	return out
}
