package vmisync

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
)

// A passt interface needs nothing of the node agent in the pod: its NIC has one queue whatever
// networkInterfaceMultiqueue says (passt's backend has one, and the launcher refuses more), and
// a port listed twice is forwarded once (passt refuses overlapping ports).
func TestPasstNIC(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.UID = "0a1b2c3d"
	v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 4, Threads: 1}
	v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr.To(true)
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Binding: &v1alpha1.PluginBinding{Name: v1alpha1.PasstBinding},
		Ports: []v1alpha1.Port{{Name: "http", Port: 80}, {Name: "web", Port: 80}, {Port: 53, Protocol: "UDP"}, {Port: 53}}}}
	v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	// No launcher process: passt's setup must not need one.
	nics, err := setupNetwork(v, &corev1.Pod{}, launcher.Peer{})
	if err != nil {
		t.Fatal(err)
	}
	n := nics["default"]
	if n.Passt == nil || n.Tap != "" || n.Queues != 0 || n.MAC == "" {
		t.Fatalf("NIC %+v, want a passt NIC with one queue and a MAC", n)
	}
	if !slices.Equal(n.Passt.TCPPorts, []int32{80, 53}) || !slices.Equal(n.Passt.UDPPorts, []int32{53}) || n.Passt.Interface != "eth0" {
		t.Errorf("passt %+v, want TCP 80 and 53, UDP 53, on eth0", *n.Passt)
	}
}
