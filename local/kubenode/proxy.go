package kubenode

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/qvirt/qvirt/local/pki"
	"github.com/qvirt/qvirt/local/supervise"
)

// ProxyOptions place the host's kube-proxy, which makes Services' cluster IPs work for every
// real node on it (they share the host's network namespace): without it a pod cannot reach the
// API server at the `kubernetes` Service, as in-cluster clients (qvirt-controller, qvirt-api,
// qvirt-handler) do.
type ProxyOptions struct {
	// Dir is kube-proxy's state directory (configuration, certificate).
	Dir string
	// Bin holds kube-proxy (hack/build-node.sh's output).
	Bin string
	// PKIDir is the cluster's: its CA issues kube-proxy's client certificate (system:kube-proxy,
	// which Kubernetes' bootstrap RBAC binds to system:node-proxier).
	PKIDir string
	// Server is the API server's URL.
	Server string
	// NodeName is the node kube-proxy reports as (its events and topology hints).
	NodeName string
	// NodeIP is where node ports answer; no other host address gets them.
	NodeIP net.IP
	// ClusterCIDR covers every node's pod range: traffic from outside it to a Service is
	// masqueraded.
	ClusterCIDR string
	// HealthzPort and MetricsPort are kube-proxy's, on loopback.
	HealthzPort, MetricsPort int
}

// proxyTables are the nftables tables kube-proxy's nftables mode owns; nothing else on the host
// uses these names.
var proxyTables = []string{"ip kube-proxy", "ip6 kube-proxy"}

// NewProxy writes kube-proxy's configuration and certificate and returns it as a component to
// supervise. It runs in nftables mode (the `nft` command, Debian's nftables package) and leaves the
// host's conntrack sysctls alone (a shared host, not a dedicated node).
func NewProxy(opts ProxyOptions) (supervise.Component, error) {
	if err := opts.check(); err != nil {
		return supervise.Component{}, err
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return supervise.Component{}, err
	}
	ca, err := pki.LoadOrCreateCA(opts.PKIDir, "ca")
	if err != nil {
		return supervise.Component{}, err
	}
	if err := ca.Issue(opts.Dir, "kube-proxy", pki.Leaf{CommonName: "system:kube-proxy", Client: true}); err != nil {
		return supervise.Component{}, err
	}
	kubeconfig := filepath.Join(opts.Dir, "kube-proxy.kubeconfig")
	if err := writeClientKubeconfig(kubeconfig, opts.Server, filepath.Join(opts.PKIDir, "ca.crt"),
		filepath.Join(opts.Dir, "kube-proxy.crt"), filepath.Join(opts.Dir, "kube-proxy.key")); err != nil {
		return supervise.Component{}, err
	}
	healthz := net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.HealthzPort))
	cfg := map[string]any{
		"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
		"clientConnection": map[string]any{"kubeconfig": kubeconfig},
		"mode":             "nftables", "hostnameOverride": opts.NodeName, "clusterCIDR": opts.ClusterCIDR,
		"bindAddress": opts.NodeIP.String(), "healthzBindAddress": healthz,
		"metricsBindAddress": net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.MetricsPort)),
		"nodePortAddresses":  []string{opts.NodeIP.String() + "/32"},
		// Zero: leave the host's conntrack table size and timeouts as they are.
		"conntrack": map[string]any{"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
	}
	file := filepath.Join(opts.Dir, "kube-proxy.json")
	if err := writeJSON(file, cfg); err != nil {
		return supervise.Component{}, err
	}
	return supervise.Component{Name: "kube-proxy", Path: filepath.Join(opts.Bin, "kube-proxy"),
		Args: []string{"--config=" + file, "--v=1"}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		Ready: supervise.HTTPReady("http://"+healthz+"/livez", nil)}, nil
}

func (o *ProxyOptions) check() error {
	var errs []error
	for flag, v := range map[string]string{"Dir": o.Dir, "Bin": o.Bin, "PKIDir": o.PKIDir, "Server": o.Server,
		"NodeName": o.NodeName, "ClusterCIDR": o.ClusterCIDR} {
		if v == "" {
			errs = append(errs, fmt.Errorf("kube-proxy: %s is empty", flag))
		}
	}
	if o.NodeIP == nil {
		errs = append(errs, errors.New("kube-proxy: NodeIP is empty"))
	}
	if _, _, err := net.ParseCIDR(o.ClusterCIDR); o.ClusterCIDR != "" && err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy: ClusterCIDR: %w", err))
	}
	if _, err := os.Stat(filepath.Join(o.Bin, "kube-proxy")); err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy: %w (build it with hack/build-node.sh)", err))
	}
	if _, err := exec.LookPath("nft"); err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy: %w (install Debian's nftables)", err))
	}
	return errors.Join(errs...)
}

// CleanupProxy removes the nftables tables kube-proxy left once it has stopped.
func CleanupProxy() error {
	var errs []error
	for _, t := range proxyTables {
		out, err := exec.Command("nft", "delete", "table", t).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No such file or directory") {
			errs = append(errs, fmt.Errorf("nft delete table %s: %w: %s", t, err, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}

// writeClientKubeconfig writes a kubeconfig that reaches server with a client certificate.
func writeClientKubeconfig(file, server, caFile, certFile, keyFile string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["qvirt-local"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	cfg.Contexts["qvirt-local"] = &clientcmdapi.Context{Cluster: "qvirt-local", AuthInfo: "user"}
	cfg.CurrentContext = "qvirt-local"
	return clientcmd.WriteToFile(*cfg, file)
}
