package netsetup

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// Defaults for the zero values of Masquerade's fields.
const (
	DefaultBridgeName = "qvbr0"
	DefaultTapName    = "qvtap0"
)

// DefaultVMCIDR is the guest network of the masquerade binding: gateway .1 on the bridge, guest .2.
var DefaultVMCIDR = netip.MustParsePrefix("10.0.2.0/24")

// Port is an inbound port forwarded to the guest.
type Port struct {
	// Protocol is "TCP" (the default when empty) or "UDP".
	Protocol string
	// Port is the port number, 1-65535.
	Port int32
}

// Masquerade describes the masquerade binding of one guest interface.
type Masquerade struct {
	// VMCIDR is the guest network; DefaultVMCIDR when zero. The bridge gets its first address (the
	// gateway), the guest the second.
	VMCIDR netip.Prefix
	// Ports are the inbound ports forwarded to the guest; every TCP and UDP port when empty.
	Ports []Port
	// PodPorts are ports the pod itself serves (for example a migration port); when Ports is empty,
	// inbound connections to them stay in the pod instead of going to the guest.
	PodPorts []Port
	// TapName is the tap QEMU opens; DefaultTapName when empty.
	TapName string
	// TapOwner is the uid that may open the tap (the launcher's).
	TapOwner uint32
	// TapGroup is the group that may open the tap with its owner (the launcher's).
	TapGroup uint32
	// TapMultiQueue makes a multi-queue tap, for a NIC with several queue pairs.
	TapMultiQueue bool
	// BridgeName is the bridge holding the gateway address; DefaultBridgeName when empty.
	BridgeName string
	// MTU of the bridge and tap; the pod interface's MTU when zero.
	MTU int
}

// Result is what the guest side needs from a masquerade setup: the DHCP lease and the address
// the guest is reached at.
type Result struct {
	// GuestIP is the guest's address with the VM network's prefix length (10.0.2.2/24).
	GuestIP netip.Prefix
	// GatewayIP is the bridge's address: the guest's router and the DHCP server's identity.
	GatewayIP netip.Addr
	// PodIP is the pod's address, where the guest is reached from outside.
	PodIP netip.Addr
	// PodInterface carries the pod's default route (eth0 in a pod).
	PodInterface string
	// BridgeName and TapName are the links created; MTU is theirs.
	BridgeName string
	TapName    string
	MTU        int
}

func (m Masquerade) withDefaults() (Masquerade, error) {
	if !m.VMCIDR.IsValid() {
		m.VMCIDR = DefaultVMCIDR
	}
	m.VMCIDR = m.VMCIDR.Masked()
	if !m.VMCIDR.Addr().Is4() || m.VMCIDR.Bits() > 30 {
		return m, fmt.Errorf("masquerade: VM CIDR %v must be an IPv4 network of at least 4 addresses", m.VMCIDR)
	}
	if m.TapName == "" {
		m.TapName = DefaultTapName
	}
	if m.BridgeName == "" {
		m.BridgeName = DefaultBridgeName
	}
	for _, n := range []string{m.TapName, m.BridgeName} {
		if err := validLinkName(n); err != nil {
			return m, fmt.Errorf("masquerade: %w", err)
		}
	}
	if m.TapName == m.BridgeName {
		return m, fmt.Errorf("masquerade: tap and bridge are both named %q", m.TapName)
	}
	if m.MTU < 0 || m.MTU > 65535 {
		return m, fmt.Errorf("masquerade: MTU %d out of range", m.MTU)
	}
	for _, ps := range [][]Port{m.Ports, m.PodPorts} {
		for _, p := range ps {
			if _, err := p.proto(); err != nil {
				return m, fmt.Errorf("masquerade: %w", err)
			}
			if p.Port < 1 || p.Port > 65535 {
				return m, fmt.Errorf("masquerade: port %d out of range", p.Port)
			}
		}
	}
	return m, nil
}

func validLinkName(n string) error {
	if n == "" || len(n) > 15 || n == "." || n == ".." || strings.ContainsAny(n, "/ \t\n:") {
		return fmt.Errorf("%q is not a valid interface name", n)
	}
	return nil
}

// gateway and guest are the first and second addresses of the VM network.
func (m Masquerade) gateway() netip.Addr { return m.VMCIDR.Addr().Next() }
func (m Masquerade) guest() netip.Addr   { return m.VMCIDR.Addr().Next().Next() }

// SetupMasquerade builds the masquerade binding in the network namespace at nsPath (see the package
// documentation): bridge with the gateway address, persistent tap owned by m.TapOwner enslaved to
// it, ip_forward inside the namespace, and the nftables table "qvirt". It may be called again for
// the same binding (after a node agent restart): existing links are reused and the table replaced.
// On error, whatever it created is removed again.
func SetupMasquerade(nsPath string, m Masquerade) (*Result, error) {
	m, err := m.withDefaults()
	if err != nil {
		return nil, err
	}
	netNS, err := ns.GetNS(nsPath)
	if err != nil {
		return nil, fmt.Errorf("masquerade: open network namespace: %w", err)
	}
	defer netNS.Close()
	var res *Result
	err = netNS.Do(func(ns.NetNS) error {
		var err error
		res, err = setupMasquerade(netNS, m)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// setupMasquerade runs on a thread inside the pod's namespace. On error it deletes the links it
// created; links that existed before (an earlier setup's, possibly in use) are left alone.
func setupMasquerade(netNS ns.NetNS, m Masquerade) (res *Result, err error) {
	var created []netlink.Link
	defer func() {
		if err != nil {
			for i := len(created) - 1; i >= 0; i-- {
				if derr := netlink.LinkDel(created[i]); derr != nil {
					err = errors.Join(err, fmt.Errorf("delete %s: %w", created[i].Attrs().Name, derr))
				}
			}
		}
	}()
	podLink, podIP, err := podAddress()
	if err != nil {
		return nil, err
	}
	if m.VMCIDR.Contains(podIP) {
		// The bridge's route would take the pod's own address away from its interface.
		return nil, fmt.Errorf("masquerade: the VM network %v holds the pod's address %v: pick another vmNetworkCIDR", m.VMCIDR, podIP)
	}
	mtu := m.MTU
	if mtu == 0 {
		mtu = podLink.Attrs().MTU
	}
	br, err := ensureBridge(m.BridgeName, mtu, netip.PrefixFrom(m.gateway(), m.VMCIDR.Bits()), &created)
	if err != nil {
		return nil, err
	}
	if err := ensureTap(tapSpec{m.TapName, m.TapOwner, m.TapGroup, m.TapMultiQueue}, mtu, br, &created); err != nil {
		return nil, err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("enable ip_forward in the pod's namespace: %w", err)
	}
	if err := allowDHCPServer(); err != nil {
		return nil, err
	}
	if err := replaceTable(netNS, natRules(m, podLink.Attrs().Name, podIP)); err != nil {
		return nil, err
	}
	return &Result{
		GuestIP:      netip.PrefixFrom(m.guest(), m.VMCIDR.Bits()),
		GatewayIP:    m.gateway(),
		PodIP:        podIP,
		PodInterface: podLink.Attrs().Name,
		BridgeName:   m.BridgeName,
		TapName:      m.TapName,
		MTU:          mtu,
	}, nil
}

// allowDHCPServer lets the unprivileged launcher (no capabilities) bind the DHCP server port in
// the pod's namespace: ports from 67 up stop being privileged there, and only there. The
// namespace holds nothing but the launcher, QEMU and the guest's links.
func allowDHCPServer() error {
	const path = "/proc/sys/net/ipv4/ip_unprivileged_port_start"
	cur, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read ip_unprivileged_port_start in the pod's namespace: %w", err)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(cur))); err == nil && n <= DHCPServerPort {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(DHCPServerPort)), 0o644); err != nil {
		return fmt.Errorf("let the launcher bind port %d in the pod's namespace: %w", DHCPServerPort, err)
	}
	return nil
}

// DHCPServerPort is the port the launcher's DHCP server binds.
const DHCPServerPort = 67

// podAddress is the link of the namespace's IPv4 default route and its first global address.
func podAddress() (netlink.Link, netip.Addr, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 254}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, netip.Addr{}, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil && !(r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) {
			continue
		}
		link, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			return nil, netip.Addr{}, fmt.Errorf("default route's link: %w", err)
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return nil, netip.Addr{}, fmt.Errorf("addresses of %s: %w", link.Attrs().Name, err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP.To4())
			if ok && ip.IsGlobalUnicast() {
				return link, ip, nil
			}
		}
		return nil, netip.Addr{}, fmt.Errorf("pod interface %s has no IPv4 address", link.Attrs().Name)
	}
	return nil, netip.Addr{}, errors.New("the pod's network namespace has no IPv4 default route")
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// ensureBridge makes or reuses the bridge; a bridge it makes is appended to created.
func ensureBridge(name string, mtu int, gw netip.Prefix, created *[]netlink.Link) (netlink.Link, error) {
	link, err := netlink.LinkByName(name)
	switch {
	case err == nil:
		if _, ok := link.(*netlink.Bridge); !ok {
			return nil, fmt.Errorf("bridge %s: a %s link of that name exists", name, link.Type())
		}
	case isNotFound(err):
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: mtu}}
		if err := netlink.LinkAdd(br); err != nil {
			return nil, fmt.Errorf("create bridge %s: %w", name, err)
		}
		*created = append(*created, br)
		if link, err = netlink.LinkByName(name); err != nil {
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
	default:
		return nil, fmt.Errorf("bridge %s: %w", name, err)
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return nil, fmt.Errorf("bridge %s: set MTU %d: %w", name, mtu, err)
		}
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: gw.Addr().AsSlice(), Mask: net.CIDRMask(gw.Bits(), 32)}}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return nil, fmt.Errorf("bridge %s: add address %v: %w", name, gw, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("bridge %s: set up: %w", name, err)
	}
	return link, nil
}

// tapSpec is the tap a binding makes: its name, the owner and group that may open it, and whether
// it has several queues.
type tapSpec struct {
	name         string
	owner, group uint32
	multiQueue   bool
}

// ensureTap makes or reuses the tap; a tap it makes is appended to created.
func ensureTap(spec tapSpec, mtu int, br netlink.Link, created *[]netlink.Link) error {
	name := spec.name
	flags := netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR
	if spec.multiQueue {
		flags |= netlink.TUNTAP_MULTI_QUEUE
	}
	link, err := netlink.LinkByName(name)
	switch {
	case err == nil:
		tap, ok := link.(*netlink.Tuntap)
		if !ok || tap.Mode != netlink.TUNTAP_MODE_TAP {
			return fmt.Errorf("tap %s: a %s link of that name exists", name, link.Type())
		}
		if tap.Owner != spec.owner || tap.Group != spec.group {
			return fmt.Errorf("tap %s exists owned by %d:%d, want %d:%d", name, tap.Owner, tap.Group, spec.owner, spec.group)
		}
		if has := tap.Flags&netlink.TUNTAP_MULTI_QUEUE != 0; has != spec.multiQueue {
			return fmt.Errorf("tap %s exists with multi-queue %t, want %t", name, has, spec.multiQueue)
		}
	case isNotFound(err):
		// Persistent, so that it outlives this call and QEMU opens it by name, with as many queues
		// as the NIC has: QEMU's open (queues=N, or its default single queue) must match the tap's
		// multi-queue flag. QEMU negotiates vnet_hdr itself.
		tap := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: name},
			Mode:      netlink.TUNTAP_MODE_TAP,
			Flags:     flags,
			Owner:     spec.owner,
			// The kernel lets a process attach only when it matches both the owner and the
			// group (a tap always has one).
			Group: spec.group,
		}
		if spec.multiQueue {
			// With Queues set, LinkAdd keeps the queue it opened to create the tap: close it, so
			// that QEMU's queues are the only ones.
			tap.Queues = 1
		}
		err := netlink.LinkAdd(tap)
		for _, f := range tap.Fds {
			_ = f.Close()
		}
		if err != nil {
			return fmt.Errorf("create tap %s: %w", name, err)
		}
		*created = append(*created, tap)
		if link, err = netlink.LinkByName(name); err != nil {
			return fmt.Errorf("tap %s: %w", name, err)
		}
	default:
		return fmt.Errorf("tap %s: %w", name, err)
	}
	if link.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("tap %s: set MTU %d: %w", name, mtu, err)
		}
	}
	if link.Attrs().MasterIndex != br.Attrs().Index {
		if err := netlink.LinkSetMaster(link, br); err != nil {
			return fmt.Errorf("tap %s: enslave to %s: %w", name, br.Attrs().Name, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("tap %s: set up: %w", name, err)
	}
	return nil
}

// inExistingNS runs fn inside the namespace at nsPath, passing it that namespace (ns.NetNS.Do
// passes the caller's); a namespace that no longer exists is not an error (there is nothing left
// to tear down in it).
func inExistingNS(nsPath, what string, fn func(ns.NetNS) error) error {
	netNS, err := ns.GetNS(nsPath)
	if err != nil {
		var notExist ns.NSPathNotExistErr
		if errors.As(err, &notExist) {
			return nil
		}
		return fmt.Errorf("%s: open network namespace: %w", what, err)
	}
	defer netNS.Close()
	return netNS.Do(func(ns.NetNS) error { return fn(netNS) })
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// TeardownMasquerade removes what SetupMasquerade made in the namespace at nsPath: the nftables
// table, the tap and the bridge. It is idempotent; a namespace that no longer exists has nothing
// left to remove. ip_forward stays on: it belongs to the pod's namespace, which goes with the pod.
func TeardownMasquerade(nsPath string, m Masquerade) error {
	m, err := m.withDefaults()
	if err != nil {
		return err
	}
	return inExistingNS(nsPath, "masquerade", func(netNS ns.NetNS) error { return teardownMasquerade(netNS, m) })
}

// teardownMasquerade runs on a thread inside the pod's namespace; it removes everything it can
// and reports every failure.
func teardownMasquerade(netNS ns.NetNS, m Masquerade) error {
	errs := []error{deleteTable(netNS)}
	for _, name := range []string{m.TapName, m.BridgeName} {
		link, err := netlink.LinkByName(name)
		if isNotFound(err) {
			continue
		}
		if err == nil {
			// Only links of the kind netsetup makes: a misconfigured name must not take the
			// pod's own interface with it.
			_, isTap := link.(*netlink.Tuntap)
			_, isBridge := link.(*netlink.Bridge)
			if (name == m.TapName && !isTap) || (name == m.BridgeName && !isBridge) {
				continue
			}
			err = netlink.LinkDel(link)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
