package cluster

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/install"
	"github.com/qvirt/qvirt/local/kubenode"
	"github.com/qvirt/qvirt/local/multus"
	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/local/registry"
)

// kubeNodeDir is real node i's state directory; apart from the virtual nodes', whose cleanup
// is another.
func kubeNodeDir(dir string, i int) string { return filepath.Join(dir, "kubenodes", NodeName(i)) }

// kubeProxyDir is the host's kube-proxy's, which serves every real node.
func kubeProxyDir(dir string) string { return filepath.Join(dir, "kube-proxy") }

// kubeNodesCIDR covers every real node's pod range (10.245.i.0/24).
const kubeNodesCIDR = "10.245.0.0/16"

// startKubeNodes registers Options.Nodes real kubelet nodes (containerd, runc, the kubelet) under
// the supervisor: each with its own directory, cgroup root, CNI bridge and pod range, and
// kubelet port (10250+2(i-1), its health port one above); and kube-proxy for them all. Their
// sandbox image is pushed to the local registry first.
func (c *Cluster) startKubeNodes(ctx context.Context, cniBin string) error {
	step := func(format string, args ...any) { fmt.Fprintf(c.opts.Progress, "local up: "+format+"\n", args...) }
	if c.opts.NodeBin == "" {
		return fmt.Errorf("--runtime %s: no directory with the kubelet and containerd (hack/build-node.sh)", RuntimeContainerd)
	}
	pause, err := registry.PushPause(ctx, c.Registry)
	if err != nil {
		return err
	}
	for i := 1; i <= c.opts.Nodes; i++ {
		opts := kubenode.Options{Name: NodeName(i), Dir: kubeNodeDir(c.opts.Dir, i), Bin: c.opts.NodeBin, CNIBin: cniBin,
			MultusBin: c.multusBin, MultusKubeconfig: c.Kubeconfig,
			PKIDir: filepath.Join(c.opts.Dir, "pki"), Server: c.cp.Server, NodeIP: apiAddress,
			KubeletPort: 10250 + 2*(i-1), PodCIDR: "10.245." + strconv.Itoa(i) + ".0/24", Bridge: "qvirt-k" + strconv.Itoa(i),
			Registry: c.Registry, SandboxImage: pause}
		step("starting real node %s: containerd and the kubelet (logs in %s)", opts.Name, filepath.Join(c.opts.Dir, "logs"))
		node, err := kubenode.New(opts)
		if err != nil {
			return err
		}
		c.kubeNodes = append(c.kubeNodes, opts)
		for _, comp := range node.Components() {
			if err := c.sup.Start(ctx, comp); err != nil {
				return err
			}
		}
	}
	proxy, err := kubenode.NewProxy(kubenode.ProxyOptions{Dir: kubeProxyDir(c.opts.Dir), Bin: c.opts.NodeBin,
		PKIDir: filepath.Join(c.opts.Dir, "pki"), Server: c.cp.Server, NodeName: NodeName(1), NodeIP: apiAddress,
		ClusterCIDR: kubeNodesCIDR, HealthzPort: 10256, MetricsPort: 10249})
	if err != nil {
		return err
	}
	if err := c.sup.Start(ctx, proxy); err != nil {
		return err
	}
	return nil
}

// upOnKubeNodes starts the real nodes and installs qvirt on them as an administrator does
// (local/install: make images, make push to the local registry, kubectl apply -k of
// config/default), with qvirt-config's data cfg: qvirt-controller, qvirt-api and the
// qvirt-handler DaemonSet run as pods on the nodes, from the images.
func (c *Cluster) upOnKubeNodes(ctx context.Context, cfg map[string]string) error {
	step := func(format string, args ...any) { fmt.Fprintf(c.opts.Progress, "local up: "+format+"\n", args...) }
	step("building the CNI plugins and Multus (cached after the first time)")
	cniBin, err := provider.BuildCNIPlugins(ctx, c.opts.CNICache)
	if err != nil {
		return err
	}
	if c.multusBin, err = multus.Build(ctx, c.opts.CNICache); err != nil {
		return err
	}
	if err := c.startKubeNodes(ctx, cniBin); err != nil {
		return err
	}
	step("building qvirt's images, pushing them to %s and applying config/default (kubectl apply -k %s)", c.Registry, installDir(c.opts.Dir))
	config := maps.Clone(cfg)
	delete(config, "launcherImage") // the pushed launcher image's digest
	started := time.Now()
	in, err := install.Apply(ctx, install.Options{Repo: c.opts.Repo, Registry: c.Registry, Kubectl: filepath.Join(c.opts.Tools, "kubectl"),
		Kubeconfig: c.Kubeconfig, Dir: installDir(c.opts.Dir), Config: config})
	if err != nil {
		return err
	}
	step("qvirt runs on the real nodes (%.0fs): launcher image %s", time.Since(started).Seconds(), in.Images["qvirt-launcher"])
	return c.installMultusCRD(ctx)
}

// installMultusCRD applies Multus's NetworkAttachmentDefinition CRD, as a cluster's Multus
// install does: the real nodes run Multus.
func (c *Cluster) installMultusCRD(ctx context.Context) error {
	objs, err := readObjects(filepath.Join(c.opts.Repo, multusCRD))
	if err == nil {
		err = applyAll(ctx, c.client, objs)
	}
	if err == nil {
		err = waitServed(ctx, c.client, objs)
	}
	if err != nil {
		return fmt.Errorf("install the NetworkAttachmentDefinition CRD: %w", err)
	}
	return nil
}

// installDir holds the overlay local up applies on real nodes: `kubectl delete -k` of it
// uninstalls.
func installDir(dir string) string { return filepath.Join(dir, "install") }

// kubeNodesPowerOff bounds how long Down waits for the guests on real nodes to power off.
const kubeNodesPowerOff = 2 * time.Minute

// powerOffOnKubeNodes powers the guests on real nodes off before their nodes go: stopping a
// kubelet and containerd leaves the pods' processes running, and the node's clean-up would then
// kill QEMU with the guest's writes unflushed. qvirt-controller is scaled to zero first, so that no
// VM is restarted into a new pod; then every launcher pod is deleted, which the kubelet turns into
// SIGTERM and the launcher into an ACPI shutdown within the pod's grace period. The VMs stay
// defined: the next local up applies the install again, with its replicas.
func (c *Cluster) powerOffOnKubeNodes() {
	if len(c.kubeNodes) == 0 || c.client == nil {
		return
	}
	log := c.opts.Log.WithName("down")
	ctx, cancel := context.WithTimeout(context.Background(), kubeNodesPowerOff)
	defer cancel()
	deploy := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: install.Namespace, Name: "qvirt-controller"}}
	scale := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"replicas":0}}`))
	if err := c.client.Patch(ctx, deploy, scale); client.IgnoreNotFound(err) != nil {
		log.Error(err, "scale qvirt-controller to zero")
	}
	launchers := client.MatchingLabels{v1alpha1.AppLabel: v1alpha1.LauncherApp}
	var pods corev1.PodList
	if err := c.client.List(ctx, &pods, launchers); err != nil {
		log.Error(err, "list launcher pods")
		return
	}
	for i := range pods.Items {
		if err := c.client.Delete(ctx, &pods.Items[i]); client.IgnoreNotFound(err) != nil {
			log.Error(err, "delete launcher pod", "pod", pods.Items[i].Name)
		}
	}
	n, started := len(pods.Items), time.Now()
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		return c.client.List(ctx, &pods, launchers) == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		log.Error(err, "guests still running at the deadline; their nodes' clean-up stops them", "pods", len(pods.Items))
		return
	}
	fmt.Fprintf(c.opts.Progress, "local down: %d guests on the real nodes powered off (their launcher pods ended) in %.1fs\n", n, time.Since(started).Seconds())
}
