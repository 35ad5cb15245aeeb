package launcher

import (
	"strconv"
	"strings"

	"github.com/qvirt/qvirt/machine"
)

// KubeVirt's slirp binding: the guest NIC on QEMU's own user-mode network stack (libslirp, netdev
// user), which lives in QEMU in the pod's network namespace. QEMU opens the guest's outbound
// connections from the pod's address as ordinary sockets, and listens on the pod's forwarded ports
// (below 1024 by the pod's ip_unprivileged_port_start, as for passt); the guest sits behind it on
// 10.0.2.0/24. Nothing runs beside QEMU and the node agent makes nothing in the pod.

// checkSlirp checks a slirp NIC.
func checkSlirp(p machine.Path, n *machine.NIC) machine.FieldErrors {
	errs := checkUserModeNIC(p, n, "slirp")
	seen := map[string]bool{}
	for _, ports := range []struct {
		proto string
		list  []int32
	}{{"tcp", n.Slirp.TCPPorts}, {"udp", n.Slirp.UDPPorts}} {
		for i, port := range ports.list {
			pp := p.Child("slirp", ports.proto+"Ports").Index(i)
			key := ports.proto + strconv.Itoa(int(port))
			switch {
			case port < 1 || port > 65535:
				errs = append(errs, machine.Invalid(pp, port, "must be 1-65535"))
			case seen[key]:
				// QEMU refuses a second forward of the same port.
				errs = append(errs, machine.Duplicate(pp, port))
			}
			seen[key] = true
		}
	}
	return errs
}

// slirpNetdev is the user backend of a slirp NIC: each listed port of the pod's forwarded to the
// same port of the guest.
func slirpNetdev(n *machine.NIC) string {
	var b strings.Builder
	b.WriteString("user,id=" + NetdevID(n.Name))
	for _, ports := range []struct {
		proto string
		list  []int32
	}{{"tcp", n.Slirp.TCPPorts}, {"udp", n.Slirp.UDPPorts}} {
		for _, port := range ports.list {
			p := strconv.Itoa(int(port))
			b.WriteString(",hostfwd=" + ports.proto + "::" + p + "-:" + p)
		}
	}
	return b.String()
}
