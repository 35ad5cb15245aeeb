package vmisync

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/netsetup"
)

// setupNetwork makes the host side of every guest interface inside the launcher pod's network
// namespace (reached through the launcher process, peer) and returns what the launcher needs to
// attach them and serve their DHCP leases. It is idempotent: after a handler restart it returns
// the same setup. The pod's default network (the pod network, or a default multus one) is its
// eth0, which one interface at most uses (validation); each secondary multus network is a pod
// interface of its own that Multus added (v1alpha1.MultusInterfaceName), bound by bridge.
func setupNetwork(v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, peer launcher.Peer) (map[string]machine.NIC, error) {
	ifaces := v.Spec.Domain.Devices.Interfaces
	base := field.NewPath("spec", "domain", "devices", "interfaces")
	nics := make(map[string]machine.NIC, len(ifaces))
	for i := range ifaces {
		in := &ifaces[i]
		n := v.Spec.Network(in.Name)
		if n == nil {
			return nil, field.NotFound(base.Index(i).Child("name"), in.Name)
		}
		queues := v1alpha1.NICQueues(&v.Spec.Domain, in)
		var nic machine.NIC
		var err error
		if n.IsSecondary() {
			nic, err = secondarySetup(in, peer, queues > 1)
		} else {
			nic, err = defaultNetworkSetup(v, in, pod, peer, queues > 1, base.Index(i))
		}
		if err != nil {
			return nil, err
		}
		nic.Queues = queues
		nics[in.Name] = nic
	}
	return nics, nil
}

// defaultNetworkSetup binds the pod's eth0 to interface in, by bridge, masquerade, passt or slirp.
func defaultNetworkSetup(v *v1alpha1.VirtualMachineInstance, in *v1alpha1.Interface, pod *corev1.Pod, peer launcher.Peer, multiQueue bool, p *field.Path) (machine.NIC, error) {
	if in.IsPasst() {
		return passtSetup(v, in), nil
	}
	if in.IsSlirp() {
		return slirpSetup(v, in), nil
	}
	dns, err := podDNS(peer)
	if err != nil {
		return machine.NIC{}, err
	}
	if in.Bridge != nil {
		return bridgeSetup(in, peer, dns, pod.Spec.Hostname, multiQueue)
	}
	return masqueradeSetup(v, in, peer, dns, pod.Spec.Hostname, multiQueue, p)
}

// secondarySetup binds the pod interface Multus made for interface in's network by bridge, in a
// bridge and tap named after it. The guest gets the interface's address, if it has one, by DHCP,
// without a router or name servers: those come with the default network.
func secondarySetup(in *v1alpha1.Interface, peer launcher.Peer, multiQueue bool) (machine.NIC, error) {
	podIf := v1alpha1.MultusInterfaceName(in.Name)
	suffix := strings.TrimPrefix(podIf, "pod")
	res, err := netsetup.SetupBridge(peer.NetNSPath(), netsetup.Bridge{TapOwner: peer.UID, TapGroup: peer.GID, TapMultiQueue: multiQueue,
		PodInterface: podIf, TapName: "qvt" + suffix, BridgeName: "qvb" + suffix})
	if err != nil {
		return machine.NIC{}, fmt.Errorf("bridge binding of interface %q to pod interface %s, which Multus adds for its network "+
			"(is Multus installed, and the NetworkAttachmentDefinition there? see the pod's k8s.v1.cni.cncf.io/network-status annotation): %w", in.Name, podIf, err)
	}
	nic := machine.NIC{Name: in.Name, Tap: res.TapName, MAC: res.MAC.String()}
	if res.GuestIP.IsValid() {
		nic.DHCP = &machine.DHCP{Interface: res.BridgeName, IP: res.GuestIP, ServerID: res.ServerIP, MTU: res.MTU}
	}
	return nic, nil
}

// podInterface is the pod's default network interface, which the kubelet names eth0 (CNI_IFNAME).
const podInterface = "eth0"

// passtSetup needs nothing of the node agent: the launcher's passt connects the guest to the pod's
// eth0 from inside the pod, and forwards the interface's ports (all when it lists none).
func passtSetup(v *v1alpha1.VirtualMachineInstance, in *v1alpha1.Interface) machine.NIC {
	tcp, udp := forwardedPorts(in)
	// The spec's macAddress, when set, wins in translate.NIC.
	return machine.NIC{Name: in.Name, MAC: netsetup.StableMAC(string(v.UID), in.Name),
		Passt: &machine.Passt{Interface: podInterface, TCPPorts: tcp, UDPPorts: udp}}
}

// slirpSetup needs nothing of the node agent either: QEMU's own network stack, in the pod, forwards
// the interface's ports (none when it lists none, as KubeVirt's slirp binding).
func slirpSetup(v *v1alpha1.VirtualMachineInstance, in *v1alpha1.Interface) machine.NIC {
	tcp, udp := forwardedPorts(in)
	return machine.NIC{Name: in.Name, MAC: netsetup.StableMAC(string(v.UID), in.Name), Slirp: &machine.Slirp{TCPPorts: tcp, UDPPorts: udp}}
}

// forwardedPorts are interface in's ports by protocol, each once: a port listed twice (named
// twice, say) is one forward, since passt refuses overlaps and QEMU a second forward.
func forwardedPorts(in *v1alpha1.Interface) (tcp, udp []int32) {
	for _, port := range in.Ports {
		list := &tcp
		if port.Protocol == "UDP" {
			list = &udp
		}
		if !slices.Contains(*list, port.Port) {
			*list = append(*list, port.Port)
		}
	}
	return tcp, udp
}

func masqueradeSetup(v *v1alpha1.VirtualMachineInstance, in *v1alpha1.Interface, peer launcher.Peer, dns []netip.Addr, hostname string, multiQueue bool, p *field.Path) (machine.NIC, error) {
	// Migration streams reach a target through the node agent and a socket in the pod, never a
	// port of the pod: the pod keeps no port of its own from the guest.
	m := netsetup.Masquerade{TapOwner: peer.UID, TapGroup: peer.GID, TapMultiQueue: multiQueue}
	if cidr := vmNetworkCIDR(v, in.Name); cidr != "" {
		pfx, err := netip.ParsePrefix(cidr)
		if err != nil {
			return machine.NIC{}, field.Invalid(field.NewPath("spec", "networks").Key(in.Name).Child("pod", "vmNetworkCIDR"), cidr, err.Error())
		}
		m.VMCIDR = pfx
	}
	for i, port := range in.Ports {
		if port.Port < 1 || port.Port > 65535 {
			return machine.NIC{}, field.Invalid(p.Child("ports").Index(i).Child("port"), port.Port, "must be 1-65535")
		}
		m.Ports = append(m.Ports, netsetup.Port{Protocol: port.Protocol, Port: port.Port})
	}
	res, err := netsetup.SetupMasquerade(peer.NetNSPath(), m)
	if err != nil {
		return machine.NIC{}, fmt.Errorf("masquerade binding of interface %q: %w", in.Name, err)
	}
	// The binding's MAC; the spec's macAddress, when set, wins in translate.NIC.
	mac := netsetup.StableMAC(string(v.UID), in.Name)
	return machine.NIC{Name: in.Name, Tap: res.TapName, MAC: mac, DHCP: &machine.DHCP{
		Interface: res.BridgeName, IP: res.GuestIP, Gateway: res.GatewayIP, DNS: dns, Hostname: hostname, MTU: res.MTU,
	}}, nil
}

// vmNetworkCIDR is the pod network's vmNetworkCIDR for the interface named name; "" for the
// default.
func vmNetworkCIDR(v *v1alpha1.VirtualMachineInstance, name string) string {
	for _, n := range v.Spec.Networks {
		if n.Name == name && n.Pod != nil {
			return n.Pod.VMNetworkCIDR
		}
	}
	return ""
}

func bridgeSetup(in *v1alpha1.Interface, peer launcher.Peer, dns []netip.Addr, hostname string, multiQueue bool) (machine.NIC, error) {
	res, err := netsetup.SetupBridge(peer.NetNSPath(), netsetup.Bridge{TapOwner: peer.UID, TapGroup: peer.GID, TapMultiQueue: multiQueue})
	if err != nil {
		return machine.NIC{}, fmt.Errorf("bridge binding of interface %q: %w", in.Name, err)
	}
	// The pod network knows the pod's address at the pod interface's original MAC; the spec's
	// macAddress, when set, wins in translate.NIC.
	return machine.NIC{Name: in.Name, Tap: res.TapName, MAC: res.MAC.String(), DHCP: &machine.DHCP{
		Interface: res.BridgeName, IP: res.GuestIP, Gateway: res.Gateway, ServerID: res.ServerIP,
		DNS: dns, Hostname: hostname, MTU: res.MTU,
	}}, nil
}

// podDNS are the nameservers of the launcher pod's resolv.conf, read through the launcher's root
// (/proc/PID/root); none when the pod has no resolv.conf.
func podDNS(peer launcher.Peer) ([]netip.Addr, error) {
	path := filepath.Join("/proc", strconv.Itoa(peer.PID), "root", "etc", "resolv.conf")
	dns, err := netsetup.ResolvConfDNS(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the pod's resolv.conf: %w", err)
	}
	return dns, nil
}

// teardownNetwork undoes setupNetwork in the launcher pod, whichever binding it made: the bridge
// binding's teardown gives the pod its address back (and leaves a masquerade bridge alone), the
// masquerade's removes the NAT table, bridge and tap.
func teardownNetwork(peer launcher.Peer) error {
	return errors.Join(netsetup.TeardownBridge(peer.NetNSPath(), netsetup.Bridge{}),
		netsetup.TeardownMasquerade(peer.NetNSPath(), netsetup.Masquerade{}))
}
