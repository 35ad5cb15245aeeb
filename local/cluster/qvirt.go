package cluster

import (
	"path/filepath"
	"strconv"

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
