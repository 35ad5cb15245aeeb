// Package kubenode runs a real Kubernetes node on this machine: containerd with runc and the
// kubelet built from upstream (hack/build-node.sh), joined to local mode's control plane. It is
// `qvirtctl local up --runtime containerd`'s node, next to the virtual nodes of local/provider.
//
// Everything a node owns lives under its own state directory (containerd's root, state and
// socket, the kubelet's root directory and certificates, CNI configuration and IPAM state, pod
// logs) and its own cgroup root, and it listens on its own ports, so that more than one can run
// on a host (the test runs two). Each node runs in a mount namespace of its own in which its
// kubelet directory is /var/lib/kubelet (mountns.go), so that hostPath volumes written for real
// nodes (qvirt-handler's kubelet pods and device-plugins directories) reach that node's. What the
// kubelet and containerd hard-code elsewhere (/run/containerd/{runc,s}, /var/lib/cni/results,
// /var/log/containers) is shared: container and shim names there are unique per node. One
// kube-proxy (proxy.go) serves the host's nodes. The containerd configuration is version 3;
// containerd 2.4 migrates it to its version 4 at start and says so in its log.
package kubenode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/qvirt/qvirt/local/multus"
	"github.com/qvirt/qvirt/local/pki"
	"github.com/qvirt/qvirt/local/supervise"
)

// Options place one real node.
type Options struct {
	// Name is the node's name; its kubelet authenticates as system:node:Name.
	Name string
	// Dir is the node's state directory (keep it short: containerd's sockets live under it).
	Dir string
	// Bin holds kubelet, containerd and containerd-shim-runc-v2 (hack/build-node.sh's output).
	Bin string
	// Runc is the OCI runtime; /usr/sbin/runc (Debian's) when empty.
	Runc string
	// CNIBin holds the bridge, host-local and loopback plugins.
	CNIBin string
	// MultusBin holds Multus's thin plugin (multus.Build): when set, the node's pods are attached
	// through Multus, which adds the secondary networks their annotations ask for, reading them
	// with MultusKubeconfig. Empty: the node's pods have the pod network alone.
	MultusBin, MultusKubeconfig string
	// PKIDir is the cluster's (local/pki): its CA ca.{crt,key} issues the kubelet's client
	// certificate and verifies the API server's requests to the kubelet.
	PKIDir string
	// Server is the API server's URL.
	Server string
	// NodeIP is the address the kubelet serves on and reports as the node's InternalIP; it must
	// not be loopback (the API server reaches the kubelet there for logs and exec).
	NodeIP net.IP
	// KubeletPort is the kubelet's API port (10250 when zero); its health port is one above.
	KubeletPort int
	// PodCIDR is the range of this node's pod addresses; Bridge the CNI bridge they hang off.
	PodCIDR, Bridge string
	// Registry is the plain-HTTP registry (host:port) containerd may pull from; SandboxImage the
	// pause image there.
	Registry, SandboxImage string
}

func (o *Options) defaults() {
	if o.Runc == "" {
		o.Runc = "/usr/sbin/runc"
	}
	if o.KubeletPort == 0 {
		o.KubeletPort = 10250
	}
}

func (o *Options) check() error {
	var errs []error
	for flag, v := range map[string]string{"Name": o.Name, "Dir": o.Dir, "Bin": o.Bin, "CNIBin": o.CNIBin, "PKIDir": o.PKIDir,
		"Server": o.Server, "PodCIDR": o.PodCIDR, "Bridge": o.Bridge, "Registry": o.Registry, "SandboxImage": o.SandboxImage} {
		if v == "" {
			errs = append(errs, fmt.Errorf("kubenode: %s is empty", flag))
		}
	}
	if o.MultusBin != "" && o.MultusKubeconfig == "" {
		errs = append(errs, errors.New("kubenode: MultusKubeconfig is empty, but MultusBin is set"))
	}
	if o.NodeIP == nil || o.NodeIP.IsLoopback() {
		errs = append(errs, fmt.Errorf("kubenode: NodeIP %v: want a non-loopback address (the API server reaches the kubelet there)", o.NodeIP))
	}
	if len(filepath.Join(o.Dir, "containerd", "containerd.sock.ttrpc")) > 100 {
		errs = append(errs, fmt.Errorf("kubenode: Dir %q is too long for containerd's unix sockets", o.Dir))
	}
	for _, b := range []string{"kubelet", "containerd", "containerd-shim-runc-v2"} {
		if _, err := os.Stat(filepath.Join(o.Bin, b)); err != nil {
			errs = append(errs, fmt.Errorf("kubenode: %w (build it with hack/build-node.sh)", err))
		}
	}
	if _, err := os.Stat(o.Runc); err != nil {
		errs = append(errs, fmt.Errorf("kubenode: %w (install Debian's runc)", err))
	}
	errs = append(errs, checkUtilLinux())
	return errors.Join(errs...)
}

// Node is a configured node: Components are what to run, in order.
type Node struct {
	opts Options
}

// New writes the node's configuration, certificates and directories and prepares its cgroup
// root. Start its Components, containerd first, under a supervisor.
func New(opts Options) (*Node, error) {
	opts.defaults()
	if err := opts.check(); err != nil {
		return nil, err
	}
	n := &Node{opts: opts}
	for _, d := range []string{n.path("containerd"), n.path("kubelet"), n.path("pods-logs"), n.path("cni", "net.d"), n.path("cni", "ipam"),
		n.path("certs.d", opts.Registry), n.path("pki")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	// Cleanup after a crash finds the node by its directory alone.
	if err := writeJSON(n.path(optionsFile), opts); err != nil {
		return nil, err
	}
	if err := saveSysctls(n.path("sysctls.json")); err != nil {
		return nil, err
	}
	steps := []func() error{n.writePKI, n.writeKubeconfig, n.writeContainerdConfig, n.writeRegistryHosts,
		n.writeCNIConfig, n.writeKubeletConfig, func() error { return createCgroupRoot(n.CgroupRoot()) }, n.createMountNamespace}
	for _, step := range steps {
		if err := step(); err != nil {
			return nil, fmt.Errorf("node %s: %w", opts.Name, err)
		}
	}
	return n, nil
}

// optionsFile, in a node's directory, records its Options for CleanupDir.
const optionsFile = "node.json"

// CleanupDir is Cleanup of the node whose directory is dir (nothing when New never ran there).
func CleanupDir(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, optionsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var opts Options
	if err := json.Unmarshal(data, &opts); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, optionsFile), err)
	}
	return Cleanup(opts)
}

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.opts.Dir}, elem...)...)
}

// CgroupRoot is the node's own cgroup root (the kubelet's cgroupRoot): its pods' cgroups sit
// under it, apart from any other node's.
func (n *Node) CgroupRoot() string { return "/qvirt-" + n.opts.Name }

// ContainerdSocket is the node's CRI endpoint.
func (n *Node) ContainerdSocket() string { return n.path("containerd", "containerd.sock") }

// Components are containerd and the kubelet, in the order to start them, both in the node's
// mount namespace.
func (n *Node) Components() []supervise.Component {
	o := n.opts
	// containerd finds the runc shim, and the shim runc, on PATH.
	path := "PATH=" + o.Bin + ":" + filepath.Dir(o.Runc) + ":/usr/sbin:/usr/bin:/sbin:/bin"
	containerd := supervise.Component{Name: "containerd-" + o.Name, Path: filepath.Join(o.Bin, "containerd"),
		Args: []string{"--config=" + n.path("containerd.toml")}, Env: []string{path}, Via: n.inNamespace(),
		Ready: func(context.Context) error { return dialUnix(n.ContainerdSocket()) }}
	health := "http://127.0.0.1:" + strconv.Itoa(o.KubeletPort+1) + "/healthz"
	kubelet := supervise.Component{Name: "kubelet-" + o.Name, Path: filepath.Join(o.Bin, "kubelet"),
		Args: []string{"--config=" + n.path("kubelet.json"), "--kubeconfig=" + n.path("kubelet.kubeconfig"),
			"--root-dir=" + KubeletRootDir, "--cert-dir=" + filepath.Join(KubeletRootDir, "pki"),
			"--hostname-override=" + o.Name, "--node-ip=" + o.NodeIP.String(), "--v=1"},
		Env: []string{path}, Via: n.inNamespace(),
		Ready: supervise.HTTPReady(health, nil)}
	return []supervise.Component{containerd, kubelet}
}

// writePKI issues the kubelet's client certificate (system:node:NAME in system:nodes, what the
// Node authorizer and NodeRestriction expect) from the cluster CA.
func (n *Node) writePKI() error {
	ca, err := pki.LoadOrCreateCA(n.opts.PKIDir, "ca")
	if err != nil {
		return err
	}
	return ca.Issue(n.path("pki"), "kubelet-client", pki.Leaf{CommonName: "system:node:" + n.opts.Name,
		Organizations: []string{"system:nodes"}, Client: true})
}

func (n *Node) writeKubeconfig() error {
	return writeClientKubeconfig(n.path("kubelet.kubeconfig"), n.opts.Server, filepath.Join(n.opts.PKIDir, "ca.crt"),
		n.path("pki", "kubelet-client.crt"), n.path("pki", "kubelet-client.key"))
}

// writeContainerdConfig writes containerd's configuration (version 3, containerd 2.x). Why the
// settings that are not containerd's defaults:
//   - restrict_oom_score_adj: root on these machines lacks CAP_SYS_RESOURCE in its bounding set,
//     so runc cannot lower a container's oom_score_adj below containerd's own; without it every
//     container fails with "can't get final child's PID from pipe: EOF".
//   - device_ownership_from_security_context: a device a device plugin hands a container belongs
//     to the container's user, not to the host's owner. qvirt's launcher runs as uid 107 and gets
//     /dev/net/tun (and /dev/kvm) from qvirt-handler's device plugin; on a host where that node is
//     root's and 0600 (no udev rule making it 0666, as here) QEMU could not open it otherwise.
//     KubeVirt asks the same of containerd for its non-root launchers.
//   - the sandbox image comes from the local registry: no internet registry is reachable.
//   - the gRPC, ttrpc and stream server addresses are the node's own, so nodes coexist.
//   - pod network namespaces are bind-mounted under the node's state, not the host's
//     /var/run/netns: a node stopped with its pods left there an empty file per pod, which
//     nothing removed.
func (n *Node) writeContainerdConfig() error {
	o := n.opts
	q := strconv.Quote
	binDirs := q(o.CNIBin)
	if o.MultusBin != "" {
		binDirs = q(o.MultusBin) + ", " + binDirs
	}
	toml := strings.Join([]string{
		"version = 3",
		"root = " + q(n.path("containerd", "root")),
		"state = " + q(n.path("containerd", "state")),
		"[grpc]", "  address = " + q(n.ContainerdSocket()),
		"[ttrpc]", "  address = " + q(n.ContainerdSocket()+".ttrpc"),
		"[plugins.'io.containerd.cri.v1.images']", "  snapshotter = 'overlayfs'",
		"[plugins.'io.containerd.cri.v1.images'.pinned_images]", "  sandbox = " + q(o.SandboxImage),
		"[plugins.'io.containerd.cri.v1.images'.registry]", "  config_path = " + q(n.path("certs.d")),
		"[plugins.'io.containerd.cri.v1.runtime']", "  restrict_oom_score_adj = true", "  device_ownership_from_security_context = true",
		"  netns_mounts_under_state_dir = true",
		"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]", "  runtime_type = 'io.containerd.runc.v2'",
		"[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]",
		"  BinaryName = " + q(o.Runc), "  SystemdCgroup = false",
		"[plugins.'io.containerd.cri.v1.runtime'.cni]",
		"  bin_dirs = [" + binDirs + "]", "  conf_dir = " + q(n.path("cni", "net.d")),
		"[plugins.'io.containerd.grpc.v1.cri']", "  stream_server_address = '127.0.0.1'", "  stream_server_port = '0'",
		"",
	}, "\n")
	return os.WriteFile(n.path("containerd.toml"), []byte(toml), 0o644)
}

// writeRegistryHosts lets containerd pull from the local registry over plain HTTP.
func (n *Node) writeRegistryHosts() error {
	r := n.opts.Registry
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+r, "http://"+r)
	return os.WriteFile(n.path("certs.d", r, "hosts.toml"), []byte(hosts), 0o644)
}

// writeCNIConfig gives the node's pods a bridge of their own with host-local addresses from
// PodCIDR, its IPAM state under the node's directory.
func (n *Node) writeCNIConfig() error {
	conf := map[string]any{
		"cniVersion": "1.0.0", "name": "qvirt-" + n.opts.Name,
		"plugins": []any{
			map[string]any{"type": "bridge", "bridge": n.opts.Bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "dataDir": n.path("cni", "ipam"),
					"ranges": [][]map[string]string{{{"subnet": n.opts.PodCIDR}}}, "routes": []map[string]string{{"dst": "0.0.0.0/0"}}}},
			map[string]any{"type": "loopback"},
		},
	}
	if err := writeJSON(n.path("cni", "net.d", "10-qvirt.conflist"), conf); err != nil {
		return err
	}
	if n.opts.MultusBin == "" {
		return nil
	}
	// containerd takes the first configuration by name: Multus's, with the pod network as its
	// delegate for eth0.
	m := multus.Config("multus-"+n.opts.Name, multus.Options{Kubeconfig: n.opts.MultusKubeconfig,
		StateDir: n.path("cni", "multus"), CNIBinDir: n.opts.CNIBin, LogFile: n.path("cni", "multus.log")}, conf)
	return writeJSON(n.path("cni", "net.d", "00-multus.conflist"), m)
}

// writeKubeletConfig writes the KubeletConfiguration. Why the settings that are not the kubelet's
// defaults:
//   - failCgroupV1: false. Kubelet 1.35 and later refuse to start on a cgroup v1 host unless told
//     otherwise, and these machines are cgroup v1 only; on a cgroup v2 host the setting does nothing.
//   - cgroupDriver cgroupfs (no systemd here) and a cgroupRoot of the node's own.
//   - makeIPTablesUtilChains: false: its KUBE-FIREWALL chain drops traffic to 127/8 from
//     non-local sources, which breaks the host's other loopback services.
//   - failSwapOn: false and low eviction thresholds: a shared developer machine, not a dedicated node.
//   - the ImageVolumeWithDigest feature (alpha in 1.37): the kubelet reports what it pulled for a
//     launcher pod's containerDisk and kernelBoot image volumes, which qvirt records in the
//     instance's status and checks a migration target against.
//   - the static CPU manager policy, with 100m of CPU kept for the system (the policy needs some;
//     it keeps the first CPU out of exclusive use): a Guaranteed container with whole CPUs gets
//     CPUs of its own, which qvirt's dedicatedCpuPlacement needs (KubeVirt's CPU manager nodes).
//   - x509 client certificates from the cluster CA (the API server's, for logs and exec) and
//     Webhook authorization; no anonymous access, no read-only port.
func (n *Node) writeKubeletConfig() error {
	o := n.opts
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
		"failCgroupV1": false, "cgroupDriver": "cgroupfs", "cgroupRoot": n.CgroupRoot(),
		"failSwapOn": false, "makeIPTablesUtilChains": false,
		"containerRuntimeEndpoint": "unix://" + n.ContainerdSocket(),
		"address":                  o.NodeIP.String(), "port": o.KubeletPort, "readOnlyPort": 0,
		"healthzBindAddress": "127.0.0.1", "healthzPort": o.KubeletPort + 1,
		"podLogsDir": n.path("pods-logs"),
		"authentication": map[string]any{"anonymous": map[string]any{"enabled": false},
			"webhook": map[string]any{"enabled": true}, "x509": map[string]any{"clientCAFile": filepath.Join(o.PKIDir, "ca.crt")}},
		"authorization":               map[string]any{"mode": "Webhook"},
		"evictionHard":                map[string]string{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
		"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
		"rotateCertificates": false, "serverTLSBootstrap": false, "registerNode": true,
		"resolvConf": "/etc/resolv.conf", "clusterDomain": "cluster.local",
		"featureGates":     map[string]bool{"ImageVolumeWithDigest": true},
		"cpuManagerPolicy": "static", "kubeReserved": map[string]string{"cpu": "100m"},
	}
	return writeJSON(n.path("kubelet.json"), cfg)
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// BuildBinaries runs repo's hack/build-node.sh (cached after the first build) and returns the
// directory holding the kubelet, containerd and its runc shim.
func BuildBinaries(repo string) (string, error) {
	cmd := exec.Command(filepath.Join(repo, "hack", "build-node.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build the kubelet and containerd (hack/build-node.sh): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
