package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/local/gobuild"
)

// CNIPluginsVersion is the containernetworking/plugins release BuildCNIPlugins builds.
const CNIPluginsVersion = "v1.10.0"

const cniModule = "github.com/containernetworking/plugins"

// Names inside a node's state directory.
const (
	netnsDir     = "netns"     // one bind-mounted network namespace per pod, named by pod UID
	podsDir      = "pods"      // per pod UID, as the kubelet's: emptyDir volumes, termination-message files, pid files
	logsDir      = "logs"      // per pod: <namespace>_<name>_<uid>/<container>.log; kept by Cleanup
	ipamDir      = "ipam"      // host-local's reservations
	cniCacheDir  = "cni-cache" // libcni's cached results, which DEL needs
	bridgeFile   = "bridge"    // the bridge's name, so Cleanup can remove it after a crash
	ipForwardOld = "ip_forward.orig"
	podIfName    = "eth0"
)

// cniPlugins are the pod network's (bridge, host-local, loopback) and, for the secondary networks
// that NetworkAttachmentDefinitions describe, those KubeVirt's examples use (ptp, macvlan, static).
var cniPlugins = []string{"plugins/main/bridge", "plugins/ipam/host-local", "plugins/main/loopback",
	"plugins/main/ptp", "plugins/main/macvlan", "plugins/ipam/static"}

// BuildCNIPlugins builds cniPlugins of containernetworking/plugins CNIPluginsVersion with the go
// command into cacheRoot/<version> (for example
// ~/.cache/qvirt/cni), unless they are there already, and returns that directory for
// Options.CNIBinDir (local/gobuild; the Go module proxy is the only thing it reaches).
func BuildCNIPlugins(ctx context.Context, cacheRoot string) (string, error) {
	dir := filepath.Join(cacheRoot, CNIPluginsVersion)
	if pluginsPresent(dir) {
		return dir, nil
	}
	var pkgs []string
	for _, p := range cniPlugins {
		pkgs = append(pkgs, cniModule+"/"+p)
	}
	if err := gobuild.Build(ctx, cniModule, CNIPluginsVersion, dir+"/", nil, pkgs...); err != nil {
		return "", fmt.Errorf("the CNI plugins: %w", err)
	}
	return dir, nil
}

func pluginsPresent(dir string) bool {
	for _, p := range cniPlugins {
		if _, err := os.Stat(filepath.Join(dir, filepath.Base(p))); err != nil {
			return false
		}
	}
	return true
}

// network runs one node's CNI configuration: a bridge with host-local IPAM over the node's
// PodCIDR, and loopback. Safe for concurrent use (libcni and the plugins lock their own state).
type network struct {
	cni *libcni.CNIConfig
	pod *libcni.NetworkConfigList
	lo  *libcni.NetworkConfigList
	// multus wraps pod for pods with Multus's annotations; nil when the node runs no Multus.
	multus     *libcni.NetworkConfigList
	multusPods string
	gateway    netip.Prefix
	bridge     string
	netnsDir   string
}

func newNetwork(opts Options) (*network, error) {
	gw, err := gatewayOf(opts.PodCIDR)
	if err != nil {
		return nil, err
	}
	if !pluginsPresent(opts.CNIBinDir) {
		return nil, fmt.Errorf("CNIBinDir %s: a plugin of %v is missing (see BuildCNIPlugins)", opts.CNIBinDir, cniPlugins)
	}
	podConf, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0",
		"name":       "qvirt-" + opts.NodeName,
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      opts.Bridge,
			"isGateway":   true,
			"ipMasq":      false,
			"hairpinMode": true,
			"ipam": map[string]any{
				"type":    "host-local",
				"dataDir": filepath.Join(opts.StateDir, ipamDir),
				"ranges":  [][]map[string]string{{{"subnet": gw.Masked().String(), "gateway": gw.Addr().String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
			},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("pod network config: %w", err)
	}
	pod, err := libcni.ConfListFromBytes(podConf)
	if err != nil {
		return nil, fmt.Errorf("pod network config: %w", err)
	}
	lo, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.0.0","name":"qvirt-lo","plugins":[{"type":"loopback"}]}`))
	if err != nil {
		return nil, fmt.Errorf("loopback network config: %w", err)
	}
	n := &network{
		cni:        libcni.NewCNIConfigWithCacheDir([]string{opts.CNIBinDir}, filepath.Join(opts.StateDir, cniCacheDir), nil),
		pod:        pod,
		lo:         lo,
		gateway:    gw,
		bridge:     opts.Bridge,
		netnsDir:   filepath.Join(opts.StateDir, netnsDir),
		multusPods: filepath.Join(opts.StateDir, multusPodsDir),
	}
	if opts.MultusBinDir == "" {
		return n, nil
	}
	if n.multus, err = multusConf(opts, pod); err != nil {
		return nil, err
	}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{opts.MultusBinDir, opts.CNIBinDir}, filepath.Join(opts.StateDir, cniCacheDir), nil)
	return n, os.MkdirAll(n.multusPods, 0o700)
}

// podNetwork is the configuration that attaches pod, and the CNI_ARGS it runs with: Multus's for
// a pod with its annotations, the node's pod network otherwise. A pod attached through Multus is
// recorded (by UID) so that its DEL goes through Multus too.
func (n *network) podNetwork(pod *corev1.Pod, adding bool) (*libcni.NetworkConfigList, [][2]string, error) {
	mark := filepath.Join(n.multusPods, string(pod.UID))
	if adding && usesMultus(pod) {
		if n.multus == nil {
			return nil, nil, fmt.Errorf("the pod asks for Multus networks (%s) but this node runs no Multus", strings.Join(multusAnnotations, ", "))
		}
		if err := os.WriteFile(mark, []byte(pod.Namespace+"/"+pod.Name), 0o600); err != nil {
			return nil, nil, fmt.Errorf("record the pod's Multus attachment: %w", err)
		}
	}
	if _, err := os.Stat(mark); err != nil {
		return n.pod, nil, nil
	}
	if n.multus == nil {
		return nil, nil, fmt.Errorf("the pod was attached through Multus, but this node runs no Multus now (MultusBinDir)")
	}
	return n.multus, podArgs(pod), nil
}

// releaseMultusPods runs Multus's DEL for the pods an earlier run attached through it and did not
// detach (it crashed), so that their secondary networks' IPAM releases their addresses before
// Cleanup removes Multus's cache, which the DEL needs.
func releaseMultusPods(ctx context.Context, opts Options) error {
	entries, err := os.ReadDir(filepath.Join(opts.StateDir, multusPodsDir))
	if errors.Is(err, os.ErrNotExist) || err == nil && len(entries) == 0 {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pods attached through Multus: %w", err)
	}
	n, err := newNetwork(opts)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		id, err := os.ReadFile(filepath.Join(n.multusPods, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ns, name, _ := strings.Cut(string(id), "/")
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: k8stypes.UID(e.Name())}}
		if err := n.del(ctx, pod); err != nil {
			errs = append(errs, fmt.Errorf("pod %s/%s: %w", ns, name, err))
		}
	}
	return errors.Join(errs...)
}

// ensureBridge makes the bridge with its gateway address now, rather than at the first pod, so the
// node's InternalIP answers from the start.
func (n *network) ensureBridge(_ context.Context) error {
	br, err := netlink.LinkByName(n.bridge)
	if err != nil {
		if !errors.As(err, new(netlink.LinkNotFoundError)) {
			return fmt.Errorf("bridge %s: %w", n.bridge, err)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name = n.bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("add bridge %s: %w", n.bridge, err)
		}
		if br, err = netlink.LinkByName(n.bridge); err != nil {
			return fmt.Errorf("bridge %s: %w", n.bridge, err)
		}
	}
	addr, err := netlink.ParseAddr(n.gateway.String())
	if err != nil {
		return fmt.Errorf("bridge address %s: %w", n.gateway, err)
	}
	if err := netlink.AddrReplace(br, addr); err != nil {
		return fmt.Errorf("address %s on bridge %s: %w", n.gateway, n.bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("bring up bridge %s: %w", n.bridge, err)
	}
	return nil
}

// add creates the pod's network namespace and attaches it, returning the pod's IPv4 address.
func (n *network) add(ctx context.Context, p *corev1.Pod) (nsPath string, ip netip.Addr, err error) {
	uid := string(p.UID)
	if err := checkSysctls(p); err != nil {
		return "", netip.Addr{}, err
	}
	nsPath = filepath.Join(n.netnsDir, uid)
	if err := newNetNS(nsPath); err != nil {
		return "", netip.Addr{}, err
	}
	defer func() {
		if err != nil {
			_ = n.del(context.WithoutCancel(ctx), p)
		}
	}()
	if err := setSysctls(nsPath, p); err != nil {
		return "", netip.Addr{}, err
	}
	rt := &libcni.RuntimeConf{ContainerID: uid, NetNS: nsPath, IfName: "lo"}
	if _, err := n.cni.AddNetworkList(ctx, n.lo, rt); err != nil {
		return "", netip.Addr{}, fmt.Errorf("cni add loopback: %w", err)
	}
	conf, args, err := n.podNetwork(p, true)
	if err != nil {
		return "", netip.Addr{}, err
	}
	rt.IfName, rt.Args = podIfName, args
	res, err := n.cni.AddNetworkList(ctx, conf, rt)
	if err != nil {
		return "", netip.Addr{}, fmt.Errorf("cni add %s: %w", conf.Name, err)
	}
	ip, err = podIPOf(res)
	return nsPath, ip, err
}

// podIPOf is the IPv4 address the bridge plugin's result gives eth0.
func podIPOf(res types.Result) (netip.Addr, error) {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("cni result: %w", err)
	}
	for _, ipc := range r.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP.To4()); ok && ipc.Address.IP.To4() != nil {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("cni result has no IPv4 address: %v", r.IPs)
}

// del detaches the pod (removing its veth and IP reservation) and removes its namespace. It is
// idempotent: what is already gone is not an error.
func (n *network) del(ctx context.Context, p *corev1.Pod) error {
	uid := string(p.UID)
	nsPath := filepath.Join(n.netnsDir, uid)
	netnsArg := nsPath
	if _, err := os.Stat(nsPath); err != nil {
		// Without the namespace, DEL still releases the IP; the veth went with the namespace.
		netnsArg = ""
	}
	var errs []error
	conf, args, err := n.podNetwork(p, false)
	if err != nil {
		return err
	}
	rt := &libcni.RuntimeConf{ContainerID: uid, NetNS: netnsArg, IfName: podIfName, Args: args}
	if err := n.cni.DelNetworkList(ctx, conf, rt); err != nil {
		errs = append(errs, fmt.Errorf("cni del %s: %w", conf.Name, err))
	} else if conf == n.multus {
		_ = os.Remove(filepath.Join(n.multusPods, uid))
	}
	rt.Args = nil
	rt.IfName = "lo"
	if err := n.cni.DelNetworkList(ctx, n.lo, rt); err != nil {
		errs = append(errs, fmt.Errorf("cni del loopback: %w", err))
	}
	if err := removeNetNS(nsPath); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ip_forward is host-wide and the bridge plugin turns it on: the first node of this process
// records the original value (in its state dir, so Cleanup restores it after a crash) and the last
// one restores it.
var ipForward struct {
	sync.Mutex
	users int
	orig  []byte
	file  string
}

const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

func acquireIPForward(stateDir string) error {
	ipForward.Lock()
	defer ipForward.Unlock()
	if ipForward.users > 0 {
		ipForward.users++
		return nil
	}
	orig, err := os.ReadFile(ipForwardPath)
	if err != nil {
		return fmt.Errorf("read ip_forward: %w", err)
	}
	file := filepath.Join(stateDir, ipForwardOld)
	if err := os.WriteFile(file, orig, 0o644); err != nil {
		return fmt.Errorf("record ip_forward: %w", err)
	}
	if err := os.WriteFile(ipForwardPath, []byte("1\n"), 0o644); err != nil {
		return fmt.Errorf("enable ip_forward: %w", err)
	}
	ipForward.users, ipForward.orig, ipForward.file = 1, orig, file
	return nil
}

func releaseIPForward() {
	ipForward.Lock()
	defer ipForward.Unlock()
	ipForward.users--
	if ipForward.users > 0 {
		return
	}
	if err := os.WriteFile(ipForwardPath, ipForward.orig, 0o644); err == nil {
		_ = os.Remove(ipForward.file)
	}
}

// restoreIPForward restores the value a crashed run recorded in stateDir, unless a node of this
// process holds ip_forward now.
func restoreIPForward(stateDir string) error {
	file := filepath.Join(stateDir, ipForwardOld)
	orig, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read recorded ip_forward: %w", err)
	}
	ipForward.Lock()
	defer ipForward.Unlock()
	if ipForward.users > 0 {
		return nil
	}
	if err := os.WriteFile(ipForwardPath, orig, 0o644); err != nil {
		return fmt.Errorf("restore ip_forward: %w", err)
	}
	return os.Remove(file)
}
