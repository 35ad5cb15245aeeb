package launcher

import (
	"fmt"
	"net"
	"strings"

	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// The NIC device kind: its tap backend and its device, in the one form both QEMU's command line
// and QMP take, so a cold-plugged PCIe NIC, a hot-plugged one and a migration target's copy of a
// hot-plugged one are the same device.

// nicDrivers maps each NIC model to its QEMU driver; pcie says whether it sits on a root port
// (and can be hot-plugged) or is a conventional PCI device on pcie.0.
var nicDrivers = map[machine.NICModel]struct {
	driver string
	pcie   bool
}{
	machine.NICVirtio:  {"virtio-net-pci", true},
	machine.NICE1000E:  {"e1000e", true},
	machine.NICE1000:   {"e1000", false},
	machine.NICRTL8139: {"rtl8139", false},
}

// parseMAC accepts what the API accepts and returns QEMU's form (lower case, colons).
func parseMAC(mac string) (string, error) {
	if !machine.IsMAC(mac) {
		return "", fmt.Errorf("must be six hex octets such as 02:00:00:00:00:01")
	}
	hw, err := net.ParseMAC(strings.ReplaceAll(mac, "-", ":"))
	if err != nil {
		return "", err
	}
	if hw[0]&1 == 1 {
		return "", fmt.Errorf("must be a unicast address (lowest bit of the first octet clear)")
	}
	return hw.String(), nil
}

// checkNIC checks what a NIC must be whatever its moment, and returns its MAC in QEMU's form.
func checkNIC(p machine.Path, n *machine.NIC) (string, machine.FieldErrors) {
	var errs machine.FieldErrors
	if err := checkName(p.Child("name"), n.Name); err != nil {
		errs = append(errs, err)
	}
	switch {
	case n.Passt != nil:
		errs = append(errs, checkPasst(p, n)...)
	case n.Slirp != nil:
		errs = append(errs, checkSlirp(p, n)...)
	case !machine.IsTapName(n.Tap) || n.Tap == "." || n.Tap == "..":
		errs = append(errs, machine.Invalid(p.Child("tap"), n.Tap, "must be a network interface name: 1-15 letters, digits or _.-"))
	}
	drv, ok := nicDrivers[n.Model]
	switch {
	case !ok:
		errs = append(errs, machine.NotSupported(p.Child("model"), n.Model, []string{"virtio", "e1000", "e1000e", "rtl8139"}))
	case n.Port != "" && !drv.pcie:
		errs = append(errs, machine.Invalid(p.Child("port"), n.Port, fmt.Sprintf("a %s NIC is a conventional PCI device and cannot be hot-plugged; use virtio or e1000e", n.Model)))
	}
	if n.Queues > 1 && (n.Model != machine.NICVirtio || n.Queues > maxNICQueues) {
		errs = append(errs, machine.Invalid(p.Child("queues"), n.Queues, fmt.Sprintf("only a virtio NIC has several queues, at most %d (a tap's)", maxNICQueues)))
	}
	hw, err := parseMAC(n.MAC)
	if err != nil {
		errs = append(errs, machine.Invalid(p.Child("mac"), n.MAC, err.Error()))
	}
	if n.DHCP != nil && !machine.IsTapName(n.DHCP.Interface) {
		errs = append(errs, machine.Invalid(p.Child("dhcp", "interface"), n.DHCP.Interface, "must be a network interface name of 1 to 15 characters"))
	}
	return hw, errs
}

// maxNICQueues is the most queues a tap has (the kernel's MAX_TAP_QUEUES).
const maxNICQueues = 256

// multiQueue says whether n has several queue pairs (and its tap several queues).
func multiQueue(n *machine.NIC) bool { return n.Queues > 1 }

// nicDevice is a PCIe NIC's device on root port port, for -device (JSON) and device_add. No
// option ROM (there is no network boot, and KubeVirt drops the ROM of interfaces without a boot
// order too): a ROM is a RAM block a migration target would need as well.
func nicDevice(n *machine.NIC, mac, port string) qmp.Device {
	props := map[string]any{"netdev": NetdevID(n.Name), "mac": mac, "romfile": ""}
	if multiQueue(n) {
		// One MSI-X vector per queue of each pair, one for the control queue and one for config
		// changes, as libvirt sets for KubeVirt.
		props["mq"] = true
		props["vectors"] = 2*n.Queues + 2
	}
	return qmp.Device{Driver: nicDrivers[n.Model].driver, ID: NICDeviceID(n.Name), Bus: port, Props: props}
}

// nics lays out every NIC: cold ones in order, then hot-plugged ones on their spare ports.
func (b *builder) nics() {
	for _, hot := range []bool{false, true} {
		for i := range b.m.NICs {
			if n := &b.m.NICs[i]; (n.Port != "") == hot {
				b.nic(machinePath.Child("nics").Index(i), n)
			}
		}
	}
}

func (b *builder) nic(p machine.Path, n *machine.NIC) {
	hw, errs := checkNIC(p, n)
	if len(errs) > 0 {
		b.errs = append(b.errs, errs...)
		return
	}
	if !b.unique(p.Child("name"), "nic", n.Name) || !b.uniqueMAC(p.Child("mac"), hw, n.Name) {
		return
	}
	netdev := tapNetdev(n)
	switch {
	case n.Passt != nil:
		netdev = passtNetdev(n, b.m.PasstSocket(n.Name))
	case n.Slirp != nil:
		netdev = slirpNetdev(n)
	}
	id := NICDeviceID(n.Name)
	if !nicDrivers[n.Model].pcie {
		b.devs = append(b.devs, "-netdev", netdev,
			"-device", nicDrivers[n.Model].driver+",id="+id+",bus=pcie.0,addr="+b.legacySlot()+",netdev="+NetdevID(n.Name)+",mac="+hw+",romfile=")
		return
	}
	dev := nicDevice(n, hw, n.Port)
	switch {
	case n.Port != "":
		if !b.placeOnSparePort(p.Child("port"), n.Port, fmt.Sprintf("interface %q", n.Name)) {
			return
		}
	case n.Model == machine.NICVirtio:
		dev = b.virtioSlot(dev.Driver, id).place(dev)
	default:
		dev.Bus = b.rootPort("port-" + id)
	}
	b.devs = append(b.devs, "-netdev", netdev, "-device", jsonArg(dev))
}

// tapNetdev is the tap backend of n. No vhost: /dev/vhost-net is absent here, and QEMU may not open
// it without it.
func tapNetdev(n *machine.NIC) string {
	netdev := "tap,id=" + NetdevID(n.Name) + ",ifname=" + optEscape(n.Tap) + ",script=no,downscript=no"
	if multiQueue(n) {
		netdev += fmt.Sprintf(",queues=%d", n.Queues)
	}
	return netdev
}

// uniqueMAC records interface name's MAC hw (QEMU's form), failing at p when another NIC has it.
func (b *builder) uniqueMAC(p machine.Path, hw, name string) bool {
	if other, dup := b.macs[hw]; dup {
		b.fail(machine.Duplicate(p, fmt.Sprintf("%s (also interface %q)", hw, other)))
		return false
	}
	b.macs[hw] = name
	return true
}
