package cluster

import (
	"path/filepath"
	"strconv"

	"github.com/qvirt/qvirt/local/pki"
	"github.com/qvirt/qvirt/local/supervise"
)

// ControllerOptions run qvirt-controller as a host process.
type ControllerOptions struct {
	// Binary is qvirt-controller.
	Binary    string
	Namespace string
	// WebhookPort is where the webhook listens on every host address; ProbePort serves /readyz
	// on 127.0.0.1.
	WebhookPort, ProbePort int
}

// Controller is the qvirt-controller component: the admin kubeconfig, the webhook certificate
// Install wrote, ready when its webhook serves.
func (cp *ControlPlane) Controller(o ControllerOptions) supervise.Component {
	probe := "127.0.0.1:" + strconv.Itoa(o.ProbePort)
	return supervise.Component{Name: "qvirt-controller", Path: o.Binary,
		Args: []string{"--namespace=" + o.Namespace, "--webhook-port=" + strconv.Itoa(o.WebhookPort),
			"--webhook-cert-dir=" + cp.WebhookCertDir(), "--metrics-bind-address=0",
			"--health-probe-bind-address=" + probe},
		Env:   []string{"KUBECONFIG=" + filepath.Clean(cp.Kubeconfig)},
		Ready: httpReady("http://"+probe+"/readyz", nil)}
}

// streamsCA signs the node agents' stream server certificates and qvirt-api's client certificate
// (both ways of the mutual TLS between them).
const streamsCA = "qvirt-streams-ca"

func (c *Cluster) pkiPath(name string) string { return filepath.Join(c.opts.Dir, "pki", name) }

// streamCerts issues the node agents' server certificate (named qvirt-handler, not by address:
// qvirt-api checks the name) and qvirt-api's client certificate, from a CA of their own.
func (c *Cluster) streamCerts() error {
	dir := filepath.Join(c.opts.Dir, "pki")
	ca, err := pki.LoadOrCreateCA(dir, streamsCA)
	if err != nil {
		return err
	}
	if err := ca.Issue(dir, "qvirt-handler", pki.Leaf{CommonName: "qvirt-handler", DNSNames: []string{"qvirt-handler"}, Server: true}); err != nil {
		return err
	}
	return ca.Issue(dir, "qvirt-api-client", pki.Leaf{CommonName: "qvirt-api", Client: true})
}
