package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/local/cluster"
)

// Each node agent of the local cluster runs with the identity its DaemonSet pod would have: the
// qvirt-handler ServiceAccount with a token bound to its node. So qvirt-controller certified each
// for its own node (the streams and migrations of the other tests go through these
// certificates), nothing holds a shared handler key, and one node's agent cannot change the
// other's Node.
func TestNodeAgentsRunAsTheirNodes(t *testing.T) {
	ctx := context.Background()
	var reqs certificatesv1.CertificateSigningRequestList
	if err := cl.List(ctx, &reqs); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		node := cluster.NodeName(i)
		issued := 0
		for _, r := range reqs.Items {
			if r.Spec.SignerName != certs.HandlerSignerName || !slices.Equal(r.Spec.Extra["authentication.kubernetes.io/node-name"], []string{node}) {
				continue
			}
			if r.Spec.Username != "system:serviceaccount:"+cluster.Namespace+":qvirt-handler" {
				t.Errorf("request %s for node %s from %q", r.Name, node, r.Spec.Username)
			}
			if len(r.Status.Certificate) == 0 {
				continue
			}
			chain, err := certs.DecodeCerts(r.Status.Certificate)
			if err != nil {
				t.Fatalf("request %s: %v", r.Name, err)
			}
			if err := certs.CheckHandlerNode(chain[0], node); err != nil {
				t.Errorf("request %s: %v", r.Name, err)
			}
			issued++
		}
		if issued == 0 {
			t.Errorf("no certificate was issued to the agent of node %s", node)
		}
	}
	var legacy corev1.Secret
	if err := cl.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: certs.LegacyHandlerSecret}, &legacy); !apierrors.IsNotFound(err) {
		t.Errorf("Secret %s/%s: %v, want none", cluster.Namespace, certs.LegacyHandlerSecret, err)
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", cluster.HandlerKubeconfig(dir, 1))
	if err != nil {
		t.Fatal(err)
	}
	agent1, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	redirect := []byte(`{"metadata":{"annotations":{"qvirt.io/streams-address":"10.243.0.1:1"}}}`)
	other := &corev1.Node{}
	other.Name = cluster.NodeName(2)
	err = agent1.Patch(ctx, other, client.RawPatch(types.MergePatchType, redirect))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "only the node its pod runs on") {
		t.Errorf("node %s's agent patching node %s: %v, want Forbidden by the own-node policy", cluster.NodeName(1), other.Name, err)
	}
}
