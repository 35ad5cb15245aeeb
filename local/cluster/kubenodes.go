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

// startKubeNodes registers Options.Nodes real kubelet nodes (containerd, runc, the kubelet) under
// the supervisor: each with its own directory, cgroup root, CNI bridge and pod range, and
// kubelet port (10250+2(i-1), its health port one above). Their sandbox image is pushed to the
// local registry first.
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
	step("real nodes run ordinary pods; qvirt-handler does not run on them yet, so VMs stay Pending (issue 14 item 4)")
	return nil
}
