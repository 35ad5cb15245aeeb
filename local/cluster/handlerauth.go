package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A node agent runs here as a host process, not as its DaemonSet's pod, but with the identity
// that pod has on a real node: a token of ServiceAccount qvirt-handler that kube-apiserver
// binds to the node (here to the Node object itself, as no pod runs the agent), so its user info
// carries authentication.kubernetes.io/node-name. With it the agent gets config/handler's RBAC,
// the own-node admission policy applies to it, and qvirt-controller certifies it for its own
// node only, exactly as on a real cluster. The token lives in the node's state directory (hidden
// from pods) and is renewed as a kubelet renews a projected token; client-go reads the file again
// within a minute.
const (
	handlerServiceAccount = "qvirt-handler"
	handlerTokenLifetime  = time.Hour
	handlerTokenRenewal   = 20 * time.Minute
	nodeRegisterTimeout   = 30 * time.Second
)

func handlerTokenFile(dir string, i int) string {
	return filepath.Join(nodeStateDir(dir, i), "handler.token")
}

// HandlerKubeconfig is the kubeconfig node i's agent runs with (its node-bound token).
func HandlerKubeconfig(dir string, i int) string {
	return filepath.Join(nodeStateDir(dir, i), "handler.kubeconfig")
}

// handlerCredentials writes node i's agent its token and a kubeconfig using it, once its
// virtual node has registered its Node.
func (c *Cluster) handlerCredentials(ctx context.Context, i int) error {
	var node corev1.Node
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, nodeRegisterTimeout, true, func(ctx context.Context) (bool, error) {
		return c.client.Get(ctx, client.ObjectKey{Name: NodeName(i)}, &node) == nil, nil
	})
	if err != nil {
		return fmt.Errorf("node %s did not register within %s: %w", NodeName(i), nodeRegisterTimeout, err)
	}
	if err := c.writeHandlerToken(ctx, i, &node); err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["qvirt-local"] = &clientcmdapi.Cluster{Server: c.cp.Server, CertificateAuthority: c.cp.pki("ca.crt")}
	cfg.AuthInfos[handlerServiceAccount] = &clientcmdapi.AuthInfo{TokenFile: handlerTokenFile(c.opts.Dir, i)}
	cfg.Contexts["qvirt-local"] = &clientcmdapi.Context{Cluster: "qvirt-local", AuthInfo: handlerServiceAccount}
	cfg.CurrentContext = "qvirt-local"
	return clientcmd.WriteToFile(*cfg, HandlerKubeconfig(c.opts.Dir, i))
}

// writeHandlerToken requests a token of qvirt-handler bound to node and replaces node i's token
// file with it in one rename, so a reader never sees half a token.
func (c *Cluster) writeHandlerToken(ctx context.Context, i int, node *corev1.Node) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: handlerServiceAccount}}
	tr := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(handlerTokenLifetime / time.Second)),
		BoundObjectRef:    &authnv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID},
	}}
	if err := c.client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return fmt.Errorf("token of %s/%s bound to node %s: %w", Namespace, handlerServiceAccount, node.Name, err)
	}
	file := handlerTokenFile(c.opts.Dir, i)
	tmp := file + ".new"
	if err := os.WriteFile(tmp, []byte(tr.Status.Token), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// renewHandlerTokens renews every node agent's token until ctx ends; a failure is reported on
// Progress and retried at the next round (a token outlives two rounds).
func (c *Cluster) renewHandlerTokens(ctx context.Context) {
	t := time.NewTicker(handlerTokenRenewal)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i := range c.nodes {
			var node corev1.Node
			err := c.client.Get(ctx, client.ObjectKey{Name: NodeName(i + 1)}, &node)
			if err == nil {
				err = c.writeHandlerToken(ctx, i+1, &node)
			}
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(c.opts.Progress, "local: renew the token of %s's qvirt-handler: %v\n", NodeName(i+1), err)
			}
		}
	}
}
