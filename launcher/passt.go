package launcher

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/qvirt/qvirt/machine"
)

// The passt binding: a NIC whose backend is a passt process (https://passt.top) the launcher runs
// in the pod's network namespace, as its own user, instead of a tap the node agent makes. passt
// translates the guest's frames to the pod's own sockets, answers its DHCP with the pod's
// address, routes and name servers, and forwards the pod's ports to it. QEMU 7.2's stream netdev
// connects to passt's unix socket.

// DefaultPasst is passt as Debian installs it (package passt).
const DefaultPasst = "/usr/bin/passt"

// passtReady is how long the launcher waits for passt to listen before QEMU connects.
const passtReady = 10 * time.Second

// PasstSocket is where the passt of the machine's NIC name listens: by the NIC's index, so a
// long name cannot make the path too long for a socket address.
func (m *Machine) PasstSocket(name string) string {
	return Dir(m.RunDir).passt(slices.IndexFunc(m.NICs, func(n machine.NIC) bool { return n.Name == name }), "sock")
}

func (d Dir) passt(i int, ext string) string {
	return string(d) + "/passt" + strconv.Itoa(i) + "." + ext
}

// passtNICs are the indexes of m's passt NICs.
func passtNICs(m *Machine) []int {
	var out []int
	for i := range m.NICs {
		if m.NICs[i].Passt != nil {
			out = append(out, i)
		}
	}
	return out
}

// checkPasst checks a passt NIC: cold-plugged, one queue, its pod interface and ports named.
func checkPasst(p machine.Path, n *machine.NIC) machine.FieldErrors {
	errs := checkUserModeNIC(p, n, "passt")
	if !machine.IsTapName(n.Passt.Interface) {
		errs = append(errs, machine.Invalid(p.Child("passt", "interface"), n.Passt.Interface, "must be a network interface name of 1 to 15 characters"))
	}
	for _, ports := range []struct {
		name string
		list []int32
	}{{"tcpPorts", n.Passt.TCPPorts}, {"udpPorts", n.Passt.UDPPorts}} {
		for i, port := range ports.list {
			if port < 1 || port > 65535 {
				errs = append(errs, machine.Invalid(p.Child("passt", ports.name).Index(i), port, "must be 1-65535"))
			}
		}
	}
	return errs
}

// checkUserModeNIC checks what a NIC on a user-mode network (kind: passt or slirp) cannot have:
// a tap, a hot-plug port, several queues, the launcher's DHCP (the user-mode stack serves its
// own), or the other user-mode network.
func checkUserModeNIC(p machine.Path, n *machine.NIC, kind string) machine.FieldErrors {
	var errs machine.FieldErrors
	if n.Tap != "" {
		errs = append(errs, machine.Invalid(p.Child("tap"), n.Tap, "a "+kind+" NIC has no tap"))
	}
	if n.Port != "" {
		errs = append(errs, machine.Invalid(p.Child("port"), n.Port, "a "+kind+" NIC cannot be hot-plugged: its network comes up as QEMU starts"))
	}
	if n.Queues > 1 {
		errs = append(errs, machine.Invalid(p.Child("queues"), n.Queues, "a "+kind+" NIC has one queue"))
	}
	if n.DHCP != nil {
		errs = append(errs, machine.Invalid(p.Child("dhcp"), "set", kind+" serves the guest's DHCP itself"))
	}
	if n.Passt != nil && n.Slirp != nil {
		errs = append(errs, machine.Forbidden(p.Child("slirp"), "a NIC is on passt or on slirp, not both"))
	}
	return errs
}

// passtNetdev is the stream backend of a passt NIC, connecting to socket.
func passtNetdev(n *machine.NIC, socket string) string {
	return "stream,id=" + NetdevID(n.Name) + ",server=off,addr.type=unix,addr.path=" + optEscape(socket)
}

// passtArgs are passt's arguments for NIC n listening at socket: in the foreground, logging
// warnings and errors to stderr (the launcher's log), its PID written to pidFile once it listens,
// the guest given n's pod interface's address, and the listed ports forwarded (all when none is).
func passtArgs(n *machine.NIC, socket, pidFile string) []string {
	return []string{"--foreground", "--quiet", "--stderr", "--socket", socket, "--pid", pidFile,
		"--interface", n.Passt.Interface, "--tcp-ports", passtPorts(n.Passt.TCPPorts, n.Passt), "--udp-ports", passtPorts(n.Passt.UDPPorts, n.Passt)}
}

// passtPorts is passt's port specification: the list, "all" when the NIC lists no port at all
// (KubeVirt forwards every port then), "none" when it lists only the other protocol's.
func passtPorts(ports []int32, p *machine.Passt) string {
	if len(p.TCPPorts) == 0 && len(p.UDPPorts) == 0 {
		return "all"
	}
	if len(ports) == 0 {
		return "none"
	}
	s := make([]string, len(ports))
	for i, port := range ports {
		s[i] = strconv.Itoa(int(port))
	}
	return strings.Join(s, ",")
}

// checkAllPorts refuses, with the reason and the remedy, a NIC forwarding every port where passt
// could not open a socket per port: its "all" binds every port below 49152 (passt's own
// PORT_EPHEMERAL_MIN, whatever the kernel's ephemeral range) for TCP and for UDP, about 98,300
// open files, which a container runtime's usual limit (1048576) allows but a lower one does not;
// passt itself would only say it cannot open enough sockets.
func checkAllPorts(p *machine.Passt) error {
	if len(p.TCPPorts) > 0 || len(p.UDPPorts) > 0 {
		return nil
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("open-file limit: %w", err)
	}
	if lim.Max < PasstAllPortsFiles {
		return fmt.Errorf("the interface lists no ports, so passt forwards every port, which takes a socket per port "+
			"and protocol: %d open files, over this pod's limit of %d; list the ports the guest serves in the interface's ports", PasstAllPortsFiles, lim.Max)
	}
	return nil
}

// PasstAllPortsFiles are the open files passt needs to forward every port: a socket per port
// below 49152 (passt's PORT_EPHEMERAL_MIN) for TCP and for UDP, and some to spare.
const PasstAllPortsFiles = 2*49152 + 256

// passtNoise are passt's complaints that it has no syslog (a pod has none; its stderr is logged),
// which it makes for every message.
func passtNoise(line string) bool {
	return strings.HasPrefix(line, "Failed to send ") && strings.HasSuffix(line, " to syslog")
}

// startPasst starts the passt of NIC i and waits until it listens (it writes its PID file once
// its socket listens), so that QEMU's connect does not race its start.
func (d *daemons) startPasst(m *Machine, i int, passt string) error {
	n := &m.NICs[i]
	socket, pidFile := Dir(m.RunDir).passt(i, "sock"), Dir(m.RunDir).passt(i, "pid")
	for _, f := range []string{socket, pidFile} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := checkAllPorts(n.Passt); err != nil {
		return err
	}
	cmd := exec.Command(passt, passtArgs(n, socket, pidFile)...)
	// passt waits for another client when QEMU disconnects: it ends only when the launcher ends
	// it, so any other exit leaves the guest without its network and fails it.
	r, err := d.run(daemon{name: "passt", of: fmt.Sprintf("interface %q", n.Name), cmd: cmd, anyExitFails: true, noise: passtNoise}, d.log.WithValues("interface", n.Name))
	if err != nil {
		return err
	}
	deadline := time.NewTimer(passtReady)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if data, err := os.ReadFile(pidFile); err == nil && len(strings.TrimSpace(string(data))) > 0 {
			return nil
		}
		select {
		case <-r.exited:
			if r.failure != nil {
				return r.failure
			}
			return fmt.Errorf("passt of interface %q ended before it listened", n.Name)
		case <-deadline.C:
			return fmt.Errorf("passt of interface %q did not listen at %s within %s", n.Name, socket, passtReady)
		case <-tick.C:
		}
	}
}
