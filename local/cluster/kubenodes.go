package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/qvirt/qvirt/local/kubenode"
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
	step("real nodes run ordinary pods; local up runs qvirt's components as host processes, not on them, so VMs stay Pending: install qvirt on them with config/default (README, Install on a cluster)")
	return nil
}
