// Package cluster brings up a whole qvirt on one machine (`qvirtctl local up`): etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler built from the tools module, kept
// running by local/supervise, with certificates from local/pki, in a state directory that holds
// everything the cluster made.
package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/qvirt/qvirt/local/pki"
	"github.com/qvirt/qvirt/local/supervise"
)

// ControlPlaneOptions place the control plane.
type ControlPlaneOptions struct {
	// Dir is the state directory: pki/, etcd/, logs/, kubeconfig.
	Dir string
	// Tools holds etcd, kube-apiserver, kube-controller-manager and kube-scheduler.
	Tools string
	// Address is where pods reach the API server (the pod bridge's address); the API server also
	// answers on 127.0.0.1.
	Address net.IP
	// APIServerPort, EtcdPort (and EtcdPort+1 for its peer URL), ControllerManagerPort and
	// SchedulerPort; 6443, 12379, 10257 and 10259 when zero.
	APIServerPort, EtcdPort, ControllerManagerPort, SchedulerPort int
	// ServiceCIDR is the Services' range; 10.96.0.0/16 when empty.
	ServiceCIDR string
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	opts ControlPlaneOptions
	// Kubeconfig is the cluster-admin kubeconfig (Dir/kubeconfig).
	Kubeconfig string
	// Server is the API server's URL at Address.
	Server string
}

func (o *ControlPlaneOptions) defaults() {
	if o.APIServerPort == 0 {
		o.APIServerPort = 6443
	}
	if o.EtcdPort == 0 {
		o.EtcdPort = 12379
	}
	if o.ControllerManagerPort == 0 {
		o.ControllerManagerPort = 10257
	}
	if o.SchedulerPort == 0 {
		o.SchedulerPort = 10259
	}
	if o.ServiceCIDR == "" {
		o.ServiceCIDR = "10.96.0.0/16"
	}
}

func (cp *ControlPlane) pki(name string) string { return filepath.Join(cp.opts.Dir, "pki", name) }

// StartControlPlane writes the certificates and kubeconfigs and starts the four components under
// sup, each started once the one before is ready.
func StartControlPlane(ctx context.Context, sup *supervise.Supervisor, opts ControlPlaneOptions) (*ControlPlane, error) {
	opts.defaults()
	cp := &ControlPlane{opts: opts, Kubeconfig: filepath.Join(opts.Dir, "kubeconfig"),
		Server: "https://" + net.JoinHostPort(opts.Address.String(), strconv.Itoa(opts.APIServerPort))}
	if err := cp.writePKI(); err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	for _, kc := range []struct{ file, user string }{
		{cp.Kubeconfig, "admin"}, {filepath.Join(opts.Dir, "controller-manager.kubeconfig"), "controller-manager"},
		{filepath.Join(opts.Dir, "scheduler.kubeconfig"), "scheduler"},
	} {
		if err := cp.writeKubeconfig(kc.file, kc.user); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kc.file, err)
		}
	}
	steps := []supervise.Component{cp.etcd(), cp.apiserver(), cp.controllerManager(), cp.scheduler()}
	for _, c := range steps {
		if err := sup.Start(ctx, c); err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// writePKI makes the CAs once and the leaf certificates on every start (the address may change).
func (cp *ControlPlane) writePKI() error {
	dir := filepath.Join(cp.opts.Dir, "pki")
	ca, err := pki.LoadOrCreateCA(dir, "ca")
	if err != nil {
		return err
	}
	front, err := pki.LoadOrCreateCA(dir, "front-proxy-ca")
	if err != nil {
		return err
	}
	// etcd has a CA of its own: a certificate of the cluster CA (every Kubernetes client holds
	// one) must not open the database, which bypasses all of the API server's authorisation.
	etcdCA, err := pki.LoadOrCreateCA(dir, "etcd-ca")
	if err != nil {
		return err
	}
	svcIP, err := firstServiceIP(cp.opts.ServiceCIDR)
	if err != nil {
		return err
	}
	leaves := []struct {
		ca   *pki.CA
		name string
		leaf pki.Leaf
	}{
		{ca, "apiserver", pki.Leaf{CommonName: "kube-apiserver", Server: true,
			DNSNames: []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
			IPs:      []net.IP{net.IPv4(127, 0, 0, 1), cp.opts.Address, svcIP}}},
		{ca, "admin", pki.Leaf{CommonName: "qvirt-admin", Organizations: []string{"system:masters"}, Client: true}},
		{ca, "controller-manager", pki.Leaf{CommonName: "system:kube-controller-manager", Client: true}},
		{ca, "scheduler", pki.Leaf{CommonName: "system:kube-scheduler", Client: true}},
		// The API server's identity towards kubelets (logs, exec, port-forward on real nodes).
		{ca, "apiserver-kubelet-client", pki.Leaf{CommonName: "kube-apiserver-kubelet-client", Organizations: []string{"system:masters"}, Client: true}},
		{front, "front-proxy-client", pki.Leaf{CommonName: "front-proxy-client", Client: true}},
		// Server and client: etcd presents it on its client and peer URLs and to its peer.
		{etcdCA, "etcd-server", pki.Leaf{CommonName: "etcd", Server: true, Client: true,
			DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}},
		{etcdCA, "apiserver-etcd-client", pki.Leaf{CommonName: "kube-apiserver-etcd-client", Client: true}},
	}
	for _, l := range leaves {
		if err := l.ca.Issue(dir, l.name, l.leaf); err != nil {
			return err
		}
	}
	return pki.ServiceAccountKey(dir, "sa")
}

func firstServiceIP(cidr string) (net.IP, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("service CIDR %q: %w", cidr, err)
	}
	ip := n.IP.To4()
	if ip == nil {
		return nil, fmt.Errorf("service CIDR %q: IPv4 only", cidr)
	}
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+1), nil
}

func (cp *ControlPlane) writeKubeconfig(file, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["qvirt-local"] = &clientcmdapi.Cluster{Server: cp.Server, CertificateAuthority: cp.pki("ca.crt")}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: cp.pki(user + ".crt"), ClientKey: cp.pki(user + ".key")}
	cfg.Contexts["qvirt-local"] = &clientcmdapi.Context{Cluster: "qvirt-local", AuthInfo: user}
	cfg.CurrentContext = "qvirt-local"
	return clientcmd.WriteToFile(*cfg, file)
}

// etcd listens on loopback, which any process of the host shares, so it serves only clients
// with a certificate of its own CA (the API server's), on both its client and peer URLs.
func (cp *ControlPlane) etcd() supervise.Component {
	p := cp.pki
	url := cp.etcdURL()
	peer := "https://127.0.0.1:" + strconv.Itoa(cp.opts.EtcdPort+1)
	return supervise.Component{Name: "etcd", Path: filepath.Join(cp.opts.Tools, "etcd"),
		Args: []string{"--name=qvirt-local", "--data-dir=" + filepath.Join(cp.opts.Dir, "etcd"),
			"--listen-client-urls=" + url, "--advertise-client-urls=" + url,
			"--cert-file=" + p("etcd-server.crt"), "--key-file=" + p("etcd-server.key"),
			"--client-cert-auth", "--trusted-ca-file=" + p("etcd-ca.crt"),
			"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
			"--peer-cert-file=" + p("etcd-server.crt"), "--peer-key-file=" + p("etcd-server.key"),
			"--peer-client-cert-auth", "--peer-trusted-ca-file=" + p("etcd-ca.crt"),
			"--initial-cluster=qvirt-local=" + peer, "--unsafe-no-fsync"},
		Ready: supervise.HTTPReady(url+"/health", cp.etcdClientTLS)}
}

func (cp *ControlPlane) etcdURL() string {
	return "https://127.0.0.1:" + strconv.Itoa(cp.opts.EtcdPort)
}

// etcdClientTLS is the API server's etcd client identity, for etcd's readiness check.
func (cp *ControlPlane) etcdClientTLS() (*tls.Config, error) {
	return clientTLS(cp.pki("apiserver-etcd-client.crt"), cp.pki("apiserver-etcd-client.key"), cp.pki("etcd-ca.crt"))
}

func (cp *ControlPlane) apiserver() supervise.Component {
	p := cp.pki
	return supervise.Component{Name: "kube-apiserver", Path: filepath.Join(cp.opts.Tools, "kube-apiserver"),
		Args: []string{
			"--etcd-servers=" + cp.etcdURL(),
			"--etcd-cafile=" + p("etcd-ca.crt"),
			"--etcd-certfile=" + p("apiserver-etcd-client.crt"), "--etcd-keyfile=" + p("apiserver-etcd-client.key"),
			"--bind-address=0.0.0.0", "--secure-port=" + strconv.Itoa(cp.opts.APIServerPort),
			"--advertise-address=" + cp.opts.Address.String(),
			"--service-cluster-ip-range=" + cp.opts.ServiceCIDR,
			"--tls-cert-file=" + p("apiserver.crt"), "--tls-private-key-file=" + p("apiserver.key"),
			"--client-ca-file=" + p("ca.crt"),
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file=" + p("sa.pub"), "--service-account-signing-key-file=" + p("sa.key"),
			"--authorization-mode=Node,RBAC", "--allow-privileged=true",
			// The aggregation layer, for qvirt-api.
			"--enable-aggregator-routing=true",
			"--requestheader-client-ca-file=" + p("front-proxy-ca.crt"),
			"--requestheader-allowed-names=front-proxy-client",
			"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
			"--requestheader-extra-headers-prefix=X-Remote-Extra-",
			"--proxy-client-cert-file=" + p("front-proxy-client.crt"), "--proxy-client-key-file=" + p("front-proxy-client.key"),
			// The virtual nodes report the digest of a launcher pod's images in its status
			// (volumeMounts[].volumeStatus.image.imageRef); without the gate it is dropped.
			"--feature-gates=ImageVolumeWithDigest=true",
			// Real kubelet nodes (local/kubenode): reach them at their InternalIP (the host name
			// maps to 127.0.0.1 here), as a client of the cluster CA they trust.
			"--kubelet-preferred-address-types=InternalIP",
			"--kubelet-client-certificate=" + p("apiserver-kubelet-client.crt"), "--kubelet-client-key=" + p("apiserver-kubelet-client.key"),
		},
		Ready: supervise.HTTPReady("https://127.0.0.1:"+strconv.Itoa(cp.opts.APIServerPort)+"/readyz", cp.adminTLS)}
}

func (cp *ControlPlane) controllerManager() supervise.Component {
	kc := filepath.Join(cp.opts.Dir, "controller-manager.kubeconfig")
	return supervise.Component{Name: "kube-controller-manager", Path: filepath.Join(cp.opts.Tools, "kube-controller-manager"),
		Args: []string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(cp.opts.ControllerManagerPort),
			"--service-account-private-key-file=" + cp.pki("sa.key"), "--root-ca-file=" + cp.pki("ca.crt"),
			"--use-service-account-credentials=true", "--leader-elect=false"},
		Ready: supervise.HTTPReady("https://127.0.0.1:"+strconv.Itoa(cp.opts.ControllerManagerPort)+"/healthz", insecureTLS)}
}

func (cp *ControlPlane) scheduler() supervise.Component {
	kc := filepath.Join(cp.opts.Dir, "scheduler.kubeconfig")
	return supervise.Component{Name: "kube-scheduler", Path: filepath.Join(cp.opts.Tools, "kube-scheduler"),
		Args: []string{"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(cp.opts.SchedulerPort), "--leader-elect=false"},
		Ready: supervise.HTTPReady("https://127.0.0.1:"+strconv.Itoa(cp.opts.SchedulerPort)+"/healthz", insecureTLS)}
}

// adminTLS authenticates as the cluster admin and verifies the API server.
func (cp *ControlPlane) adminTLS() (*tls.Config, error) {
	return clientTLS(cp.pki("admin.crt"), cp.pki("admin.key"), cp.pki("ca.crt"))
}

// clientTLS presents the certificate in certFile and keyFile and trusts the CA in caFile.
func clientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no PEM certificate", caFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool}, nil
}

// insecureTLS is for the health endpoints of the controller manager and scheduler, which serve
// self-signed certificates on loopback: only "ok" is read from them.
func insecureTLS() (*tls.Config, error) {
	return &tls.Config{InsecureSkipVerify: true}, nil //nolint:gosec // loopback health check only
}
