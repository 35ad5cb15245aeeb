// Package provider runs a virtual node of a local qvirt cluster: a virtual-kubelet node whose pods
// are host processes. No kubelet can run on the machines local mode targets (cgroup v1, no container
// runtime), so this provider stands in for one:
//
//   - Each pod gets its own network namespace, wired by the standard CNI plugins (bridge, host-local,
//     loopback from containernetworking/plugins, run through libcni): every pod has an IP in the node's
//     PodCIDR, routable from the host and from the pods of the other nodes (the host forwards between
//     the nodes' bridges).
//   - Each container is a host process started in the pod's network namespace, a PID namespace of
//     its own (its first process is qvirt-pod-init, which mounts the namespace's /proc and drops to
//     the container's user) and a mount namespace of its own where the local cluster's state is
//     hidden (Options.HiddenPaths) and the container's volumes are bind-mounted at their mountPath
//     (emptyDir from the pod's state directory, laid out as the kubelet's
//     pods/<uid>/volumes/kubernetes.io~empty-dir/<name>; hostPath from the host) and its
//     termination-message file at terminationMessagePath. The thread that starts it enters those
//     namespaces first (see exec.go).
//   - There is no image: Options.Images maps an image name to the host binary that runs for it. A
//     container's command[0] becomes that binary's argv[0] (so busybox-style multi-call binaries work).
//   - The provider does what virtual-kubelet leaves to providers and a kubelet would do: env
//     resolution (downward API, ConfigMap/Secret refs, $(VAR) expansion), restarts with back-off per
//     restartPolicy, restartCount/lastState, the pod phase, termination messages, SIGTERM then SIGKILL
//     after the grace period on deletion, and deleting the pod object with grace 0 once its processes
//     are gone.
//
// Run registers the node and serves until its context ends; then it stops every pod's processes and
// removes the namespaces, veths, IPAM reservations and the bridge it made, and restores ip_forward.
// Cleanup does the same for the leftovers of a run that crashed. Root only.
package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/launcher/imagepull"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	vkslog "github.com/virtual-kubelet/virtual-kubelet/log/slog"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
)

// Options configure one virtual node.
type Options struct {
	// NodeName is the Node object's name and its kubernetes.io/hostname label.
	NodeName string
	// Config reaches the cluster's kube-apiserver with rights over nodes, leases, pods, pod status,
	// events, and reads of ConfigMaps, Secrets and Services.
	Config *rest.Config
	// StateDir holds this node's network namespaces, IPAM and CNI state, pod volumes and logs. One
	// per node; Cleanup(StateDir) removes what a crashed run left in it.
	StateDir string
	// Images maps an image reference, exactly as pods name it, to the host binary that runs for it.
	Images map[string]string
	// PodCIDR is this node's pod subnet (an IPv4 prefix such as 10.244.1.0/24). Its first address
	// goes to the bridge and is the node's InternalIP.
	PodCIDR string
	// Bridge is the name of this node's Linux bridge (at most 15 bytes). Nodes need distinct bridges
	// and distinct PodCIDRs.
	Bridge string
	// CNIBinDir holds the bridge, host-local and loopback plugin binaries (see BuildCNIPlugins).
	CNIBinDir string
	// MultusBinDir holds Multus's thin plugin (see multus.Build): pods with Multus's annotations
	// are attached through it, with the NetworkAttachmentDefinitions they name besides the pod
	// network, and their secondary networks' plugins are CNIBinDir's. Empty: the node runs no
	// Multus and such pods fail to start.
	MultusBinDir string
	// MultusKubeconfig is the kubeconfig file Multus reads pods and NetworkAttachmentDefinitions
	// and writes pods' network-status annotations with; required with MultusBinDir.
	MultusKubeconfig string
	// Log receives the provider's and virtual-kubelet's logs.
	Log logr.Logger

	// Capacity overrides or extends the node's capacity (default: the host's CPUs and memory, 110
	// pods, and DefaultDeviceCapacity of each qvirt device resource).
	Capacity corev1.ResourceList
	// Labels are added to the node's labels.
	Labels map[string]string
	// Env is added to every container's environment before the container's own envFrom and env,
	// as the kubelet adds service variables: for example KUBERNETES_SERVICE_HOST and
	// KUBERNETES_SERVICE_PORT pointing at the apiserver's bridge address, since no kube-proxy makes
	// the kubernetes Service's ClusterIP reachable.
	Env map[string]string
	// HostPathRoots redirect hostPath volumes: a hostPath under a key is taken from under its value
	// instead, so that nodes sharing one host keep apart what real nodes keep apart (each node's
	// /var/run/qvirt, where launchers and the node agent meet). Others are the host's own paths.
	HostPathRoots map[string]string
	// RestartBackoff is the first delay before a container is restarted; it doubles up to
	// MaxRestartBackoff and resets after a container ran for 10 minutes. Default 1 s.
	RestartBackoff time.Duration
	// ImagePullBackoff is the first delay before an image volume whose pull failed is pulled again;
	// it doubles up to MaxImagePullBackoff. Default 10 s, as the kubelet's.
	ImagePullBackoff time.Duration
	// ShutdownGrace caps each pod's termination grace period when Run ends. Default 10 s.
	ShutdownGrace time.Duration
	// InitBinary is qvirt-pod-init (local/podinit): each container starts as it, in a PID namespace
	// of its own, as a kubelet's containers do.
	InitBinary string
	// HiddenPaths are host directories each container sees empty (a read-only tmpfs over them), as a
	// real container sees its image's root rather than the host's: the local cluster's state, which
	// holds every pod's volumes and sockets. A container's own volumes and binary are bound after,
	// so they stay reachable even from under a hidden path.
	HiddenPaths []string

	// ImageCache is the node's cache of the images of image volumes (corev1.ImageVolumeSource),
	// which the provider pulls and unpacks itself as a kubelet would. It belongs to root (the
	// provider) and should sit under a hidden path. Pods with image volumes fail without it.
	ImageCache string
	// ImageCacheMaxBytes caps the cache's unpacked size: past it, the least recently used images
	// that no pod of this node uses are removed. Zero means no cap.
	ImageCacheMaxBytes int64
	// InsecureRegistries may be reached over plain HTTP (host:port, as image references name them).
	InsecureRegistries []string
}

// Device resources every node offers, so launcher pods that request them schedule.
const (
	ResourceKVM = corev1.ResourceName("devices.qvirt.io/kvm")
	ResourceTun = corev1.ResourceName("devices.qvirt.io/tun")
	// DefaultDeviceCapacity is how many of each device resource a node offers.
	DefaultDeviceCapacity = 1000
	// MaxRestartBackoff caps the delay between restarts of a crashing container.
	MaxRestartBackoff = 5 * time.Minute
	// MaxImagePullBackoff caps the delay between pulls of an image that failed, as the kubelet's.
	MaxImagePullBackoff = 5 * time.Minute
	// syncWorkers is how many pods virtual-kubelet syncs concurrently.
	syncWorkers = 4
)

// podRetryLimiter delays only a pod whose sync failed, doubling from 5 ms up to a minute.
func podRetryLimiter() workqueue.TypedRateLimiter[any] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[any](5*time.Millisecond, time.Minute)
}

func (o *Options) validate() error {
	switch {
	case o.NodeName == "":
		return errors.New("provider options: NodeName is empty")
	case o.Config == nil:
		return errors.New("provider options: Config is nil")
	case o.StateDir == "" || !filepath.IsAbs(o.StateDir):
		return fmt.Errorf("provider options: StateDir %q is not an absolute path", o.StateDir)
	case o.Bridge == "" || len(o.Bridge) > 15:
		return fmt.Errorf("provider options: Bridge %q must be 1 to 15 bytes", o.Bridge)
	case o.CNIBinDir == "":
		return errors.New("provider options: CNIBinDir is empty")
	case o.MultusBinDir != "" && o.MultusKubeconfig == "":
		return errors.New("provider options: MultusKubeconfig is empty, but MultusBinDir is set")
	case !filepath.IsAbs(o.InitBinary):
		return fmt.Errorf("provider options: InitBinary %q is not an absolute path (qvirt-pod-init)", o.InitBinary)
	}
	for _, h := range o.HiddenPaths {
		if !filepath.IsAbs(h) {
			return fmt.Errorf("provider options: HiddenPaths: %q is not an absolute path", h)
		}
	}
	if _, err := gatewayOf(o.PodCIDR); err != nil {
		return fmt.Errorf("provider options: PodCIDR: %w", err)
	}
	if o.RestartBackoff <= 0 {
		o.RestartBackoff = time.Second
	}
	if o.ImagePullBackoff <= 0 {
		o.ImagePullBackoff = 10 * time.Second
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 10 * time.Second
	}
	return nil
}

// gatewayOf is the bridge's address in an IPv4 pod subnet: its first host address.
func gatewayOf(cidr string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("parse %q: %w", cidr, err)
	}
	if !p.Addr().Is4() || p.Bits() > 29 {
		return netip.Prefix{}, fmt.Errorf("%q: want an IPv4 prefix of at most /29", cidr)
	}
	p = p.Masked()
	return netip.PrefixFrom(p.Addr().Next(), p.Bits()), nil
}

// Run registers the node and runs its pods until ctx ends. It then stops the pods' processes
// (SIGTERM, SIGKILL after min(grace, ShutdownGrace)), removes their namespaces, veths and IPAM
// reservations and the bridge, and restores ip_forward. Pod and Node objects stay in the API (the
// control plane usually goes away with the node). It returns the first error that stopped it.
func Run(ctx context.Context, opts Options) (retErr error) {
	if err := opts.validate(); err != nil {
		return err
	}
	log := opts.Log.WithValues("node", opts.NodeName)
	if err := releaseMultusPods(ctx, opts); err != nil {
		// Not fatal: the node can run; the addresses stay reserved in the attachments' IPAM.
		log.Error(err, "release the secondary networks of the last run's pods")
	}
	if err := Cleanup(opts.StateDir); err != nil {
		return fmt.Errorf("clean up the last run's leftovers: %w", err)
	}
	for _, d := range []string{netnsDir, podsDir, logsDir, ipamDir, cniCacheDir} {
		if err := os.MkdirAll(filepath.Join(opts.StateDir, d), 0o755); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(opts.StateDir, bridgeFile), []byte(opts.Bridge), 0o644); err != nil {
		return fmt.Errorf("record bridge name: %w", err)
	}
	if err := acquireIPForward(opts.StateDir); err != nil {
		return err
	}
	net, err := newNetwork(opts)
	if err != nil {
		releaseIPForward()
		return err
	}
	images, err := openImageStore(opts, log)
	if err != nil {
		releaseIPForward()
		return err
	}
	// Teardown runs on every exit from here on, after the controllers stopped.
	p := newPods(opts, net, images, log)
	p.cpu, err = newCPUGroups(opts.StateDir, nodeCapacity(opts)[corev1.ResourceCPU])
	if err != nil {
		log.Error(err, "pods run without CPU shares: each of their processes competes with the host's as an equal")
	}
	defer func() {
		p.shutdown(context.WithoutCancel(ctx))
		if err := errors.Join(teardownState(opts.StateDir), removeCPUGroups(opts.StateDir)); err != nil && retErr == nil {
			retErr = err
		}
		releaseIPForward()
	}()
	if err := net.ensureBridge(ctx); err != nil {
		return err
	}
	return serve(ctx, opts, p, net, log)
}

// openImageStore opens the node's image cache, verifying what it holds; nil without one. An image
// that fails verification is only removed (and pulled again when a pod needs it), so it does not
// stop the node.
func openImageStore(opts Options, log logr.Logger) (*imagepull.Store, error) {
	if opts.ImageCache == "" {
		return nil, nil
	}
	s, err := imagepull.OpenStore(imagepull.StoreOptions{Dir: opts.ImageCache, Insecure: opts.InsecureRegistries, MaxBytes: opts.ImageCacheMaxBytes})
	if s == nil {
		return nil, fmt.Errorf("image cache: %w", err)
	}
	if err != nil {
		log.Error(err, "image cache: entries that failed verification could not all be removed", "dir", opts.ImageCache)
	}
	return s, nil
}

// serve runs virtual-kubelet's node and pod controllers until ctx ends or one of them fails.
func serve(ctx context.Context, opts Options, p *pods, net *network, log logr.Logger) error {
	ctx = vklog.WithLogger(ctx, vkslog.FromSlog(slog.New(logr.ToSlogHandler(log))))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	client, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return fmt.Errorf("client for %s: %w", opts.Config.Host, err)
	}
	p.client = client
	podFactory := informers.NewSharedInformerFactoryWithOptions(client, time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", opts.NodeName).String()
		}))
	// virtual-kubelet's pod controller insists on these informers; the provider's env resolution
	// reads ConfigMaps and Secrets through them too.
	otherFactory := informers.NewSharedInformerFactory(client, time.Minute)
	podInformer := podFactory.Core().V1().Pods()
	p.configMaps = otherFactory.Core().V1().ConfigMaps().Lister()
	p.secrets = otherFactory.Core().V1().Secrets().Lister()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "qvirt-local-node", Host: opts.NodeName})
	p.recorder = recorder

	pc, err := node.NewPodController(node.PodControllerConfig{
		PodClient:                 statusOnlyPods{PodsGetter: client.CoreV1(), pods: podInformer.Lister()},
		PodInformer:               podInformer,
		EventRecorder:             recorder,
		Provider:                  p,
		ConfigMapInformer:         otherFactory.Core().V1().ConfigMaps(),
		SecretInformer:            otherFactory.Core().V1().Secrets(),
		ServiceInformer:           otherFactory.Core().V1().Services(),
		SkipDownwardAPIResolution: true,
		// virtual-kubelet's default limiter also holds each queue to 10 pods a second after a
		// burst of 100, across all of the node's pods; a kubelet has no such limit. Keep only the
		// per-pod retry back-off. (BenchmarkStartup, 100 VMIs on two nodes: P50 0.99 s -> 0.82 s,
		// P95 3.01 s -> 2.90 s, one run each, so within noise at that size; larger bursts exceed
		// the 100.)
		SyncPodsFromKubernetesRateLimiter:    podRetryLimiter(),
		DeletePodsFromKubernetesRateLimiter:  podRetryLimiter(),
		SyncPodStatusFromProviderRateLimiter: podRetryLimiter(),
	})
	if err != nil {
		return fmt.Errorf("pod controller: %w", err)
	}
	nc, err := node.NewNodeController(nodeProvider{}, nodeObject(opts, net.gateway.Addr()), client.CoreV1().Nodes(),
		node.WithNodeEnableLeaseV1(client.CoordinationV1().Leases(corev1.NamespaceNodeLease), 0))
	if err != nil {
		return fmt.Errorf("node controller: %w", err)
	}
	podFactory.Start(ctx.Done())
	otherFactory.Start(ctx.Done())
	defer podFactory.Shutdown()
	defer otherFactory.Shutdown()
	otherFactory.WaitForCacheSync(ctx.Done())

	go func() { _ = nc.Run(ctx) }()
	go func() { _ = pc.Run(ctx, syncWorkers) }()
	go func() {
		select {
		case <-nc.Ready():
		case <-ctx.Done():
			return
		}
		if err := untaintNotReady(ctx, client.CoreV1().Nodes(), opts.NodeName); err != nil {
			log.Error(err, "remove the not-ready taint")
		}
	}()
	log.Info("virtual node serving", "podCIDR", opts.PodCIDR, "bridge", opts.Bridge)
	select {
	case <-ctx.Done():
	case <-nc.Done():
		cancel()
		<-pc.Done()
		return fmt.Errorf("node controller stopped: %w", nc.Err())
	case <-pc.Done():
		cancel()
		<-nc.Done()
		return fmt.Errorf("pod controller stopped: %w", pc.Err())
	}
	<-pc.Done()
	<-nc.Done()
	return nil
}

// untaintNotReady removes the node.kubernetes.io/not-ready taint that kube-apiserver's admission
// puts on every new node. kube-controller-manager's node lifecycle controller would remove it once
// the node is Ready, but the provider also serves control planes without one (tests); with one,
// that controller re-adds the taint if the node ever stops reporting Ready.
func untaintNotReady(ctx context.Context, nodes typedcorev1.NodeInterface, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool {
			return t.Key == corev1.TaintNodeNotReady
		})
		if len(taints) == len(n.Spec.Taints) {
			return nil
		}
		n.Spec.Taints = taints
		_, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// LogPath is where a container's stdout and stderr go (appended across restarts): what `kubectl
// logs` would show, which this provider does not serve.
func LogPath(stateDir, namespace, pod string, uid types.UID, container string) string {
	return filepath.Join(stateDir, logsDir, namespace+"_"+pod+"_"+string(uid), container+".log")
}
