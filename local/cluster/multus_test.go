package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/vmi"
)

// secondaryNet is a NetworkAttachmentDefinition the test made: a bridge on the host (the bridge
// CNI plugin's, its gateway address the host's), with host-local addresses recorded in ipamDir.
type secondaryNet struct {
	name, bridge, ipamDir, gateway string
}

// createSecondaryNet creates NetworkAttachmentDefinition default/name as a KubeVirt user's
// bridge network, and removes its host bridge when the test ends.
func createSecondaryNet(t *testing.T, ctx context.Context, cl client.Client, dir, name string) secondaryNet {
	t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	n := secondaryNet{name: name, bridge: "qvsec" + hex.EncodeToString(b), ipamDir: filepath.Join(dir, "secondary-ipam"), gateway: "192.168.251.1"}
	conf, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": name, "type": "bridge", "bridge": n.bridge, "isGateway": true,
		"ipam": map[string]any{"type": "host-local", "dataDir": n.ipamDir,
			"ranges": [][]map[string]string{{{"subnet": "192.168.251.0/24", "gateway": n.gateway}}}}})
	if err != nil {
		t.Fatal(err)
	}
	nad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": name, "namespace": "default"}, "spec": map[string]any{"config": string(conf)}}}
	if err := cl.Create(ctx, nad); err != nil {
		t.Fatalf("create the NetworkAttachmentDefinition: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(n.bridge); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	return n
}

// addSecondary gives v interface name, bridge-bound, on the multus network n.
func addSecondary(v *v1alpha1.VirtualMachineInstance, name string, n secondaryNet) {
	v.Spec.Domain.Devices.Interfaces = append(v.Spec.Domain.Devices.Interfaces, v1alpha1.Interface{Name: name, Bridge: &v1alpha1.InterfaceBridge{}})
	v.Spec.Networks = append(v.Spec.Networks, v1alpha1.Network{Name: name, Multus: &v1alpha1.MultusNetwork{NetworkName: n.name}})
}

// multusStatus is one element of Multus's network-status annotation.
type multusStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
}

// secondaryIP is the address Multus reports (the pod's network-status annotation) for the pod
// interface of the instance's network name on n.
func secondaryIP(t *testing.T, ctx context.Context, cl client.Client, uid string, name string, n secondaryNet) (string, error) {
	t.Helper()
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{v1alpha1.VMIUIDLabel: uid}); err != nil {
		return "", err
	}
	if len(pods.Items) != 1 {
		return "", fmt.Errorf("%d launcher pods, want 1", len(pods.Items))
	}
	p := pods.Items[0]
	if p.Annotations[vmi.MultusNetworksAnnotation] == "" {
		return "", fmt.Errorf("pod %s has no %s annotation: %v", p.Name, vmi.MultusNetworksAnnotation, p.Annotations)
	}
	var st []multusStatus
	raw := p.Annotations["k8s.v1.cni.cncf.io/network-status"]
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return "", fmt.Errorf("pod %s network-status %q: %w", p.Name, raw, err)
	}
	for _, s := range st {
		if s.Name == "default/"+n.name && s.Interface == v1alpha1.MultusInterfaceName(name) && len(s.IPs) > 0 {
			return s.IPs[0], nil
		}
	}
	return "", fmt.Errorf("pod %s network-status %s has no address on %s", p.Name, raw, n.name)
}

// reservedIPs are the addresses host-local holds in n's network.
func (n secondaryNet) reservedIPs() []string {
	entries, _ := os.ReadDir(filepath.Join(n.ipamDir, n.name))
	var ips []string
	for _, e := range entries {
		if strings.Count(e.Name(), ".") == 3 {
			ips = append(ips, e.Name())
		}
	}
	return ips
}
