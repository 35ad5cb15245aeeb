package netsetup

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// BridgeServerIP is the link-local address the bridge binding's bridge carries so that the
// launcher's DHCP server has an address to answer from (KubeVirt uses the same one).
var BridgeServerIP = netip.MustParseAddr("169.254.75.10")

// Bridge describes the bridge binding of one guest interface: the pod's address, MAC and default
// route move to the guest, and the pod interface becomes a port of a bridge with the guest's tap.
// The pod keeps no address on that network, so the binding is not live-migratable.
type Bridge struct {
	// TapName is the tap QEMU opens; DefaultTapName when empty.
	TapName string
	// TapOwner is the uid that may open the tap (the launcher's).
	TapOwner uint32
	// TapGroup is the group that may open the tap with its owner (the launcher's).
	TapGroup uint32
	// TapMultiQueue makes a multi-queue tap, for a NIC with several queue pairs.
	TapMultiQueue bool
	// BridgeName is the bridge; DefaultBridgeName when empty.
	BridgeName string
	// PodInterface is the pod interface to bind: a secondary one (Multus's), whose address (if
	// any) moves to the guest without a default route. Empty for the pod network's interface, the
	// one of the IPv4 default route.
	PodInterface string
}

// BridgeResult is the guest's DHCP lease for the bridge binding.
type BridgeResult struct {
	// GuestIP is the pod's address and prefix length, now the guest's; invalid when a secondary
	// pod interface had none (a layer-2 network).
	GuestIP netip.Prefix
	// Gateway is the pod network's default router; invalid for a secondary interface.
	Gateway netip.Addr
	// MAC is the pod interface's original MAC: the guest must use it, since the pod network
	// (ARP caches, anti-spoofing) knows the pod's address at that MAC. The pod interface gets a
	// random one.
	MAC net.HardwareAddr
	// ServerIP is the bridge's address, the DHCP server's identity (BridgeServerIP).
	ServerIP netip.Addr
	// PodInterface is the former owner of the address, now a bridge port.
	PodInterface string
	BridgeName   string
	TapName      string
	MTU          int
}

// bridgeAliasPrefix marks the bridge's ifalias, which records what SetupBridge moved so that a
// repeated setup returns the same lease and Teardown can put it back.
const bridgeAliasPrefix = "qvirt-bridge "

func (b Bridge) withDefaults() (Bridge, error) {
	if b.TapName == "" {
		b.TapName = DefaultTapName
	}
	if b.BridgeName == "" {
		b.BridgeName = DefaultBridgeName
	}
	names := []string{b.TapName, b.BridgeName}
	if b.PodInterface != "" {
		names = append(names, b.PodInterface)
	}
	for _, n := range names {
		if err := validLinkName(n); err != nil {
			return b, fmt.Errorf("bridge binding: %w", err)
		}
	}
	if b.TapName == b.BridgeName {
		return b, fmt.Errorf("bridge binding: tap and bridge are both named %q", b.TapName)
	}
	return b, nil
}

// SetupBridge builds the bridge binding in the network namespace at nsPath: the pod interface (the
// IPv4 default route's) loses its address, default route and MAC to the guest and is enslaved with
// a persistent tap owned by b.TapOwner to a bridge holding BridgeServerIP/32. Calling it again for
// the same binding returns the same result. On error, what it changed is put back.
func SetupBridge(nsPath string, b Bridge) (*BridgeResult, error) {
	b, err := b.withDefaults()
	if err != nil {
		return nil, err
	}
	netNS, err := ns.GetNS(nsPath)
	if err != nil {
		return nil, fmt.Errorf("bridge binding: open network namespace: %w", err)
	}
	defer netNS.Close()
	var res *BridgeResult
	err = netNS.Do(func(ns.NetNS) error {
		var err error
		res, err = setupBridge(b)
		return err
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func setupBridge(b Bridge) (*BridgeResult, error) {
	res, br, err := existingBridge(b)
	if err != nil {
		return nil, err
	}
	moved := false
	if res == nil {
		moved = true
		if res, br, err = moveToBridge(b); err != nil {
			return nil, errors.Join(err, teardownBridge(b))
		}
	}
	var created []netlink.Link
	err = ensureTap(tapSpec{b.TapName, b.TapOwner, b.TapGroup, b.TapMultiQueue}, res.MTU, br, &created)
	if err == nil {
		err = allowDHCPServer()
	}
	if err == nil && b.PodInterface != "" {
		err = isolateSecondary(b.BridgeName, res.PodInterface)
	}
	if err != nil {
		if moved {
			err = errors.Join(err, teardownBridge(b))
		}
		return nil, err
	}
	return res, nil
}

// existingBridge is the result recorded by an earlier SetupBridge, or nil.
func existingBridge(b Bridge) (*BridgeResult, netlink.Link, error) {
	link, err := netlink.LinkByName(b.BridgeName)
	if isNotFound(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("bridge %s: %w", b.BridgeName, err)
	}
	if _, ok := link.(*netlink.Bridge); !ok {
		return nil, nil, fmt.Errorf("bridge %s: a %s link of that name exists", b.BridgeName, link.Type())
	}
	res, err := parseBridgeAlias(link.Attrs().Alias)
	if err != nil {
		return nil, nil, fmt.Errorf("bridge %s exists but was not made by SetupBridge: %w", b.BridgeName, err)
	}
	res.BridgeName, res.TapName, res.MTU = b.BridgeName, b.TapName, link.Attrs().MTU
	return res, link, nil
}

func moveToBridge(b Bridge) (*BridgeResult, netlink.Link, error) {
	var pod netlink.Link
	var addr netlink.Addr
	var gw netip.Addr
	var err error
	if b.PodInterface == "" {
		pod, addr, gw, err = podConfig()
	} else {
		pod, addr, err = secondaryConfig(b.PodInterface)
	}
	if err != nil {
		return nil, nil, err
	}
	res := &BridgeResult{
		Gateway: gw, MAC: pod.Attrs().HardwareAddr,
		ServerIP: BridgeServerIP, PodInterface: pod.Attrs().Name,
		BridgeName: b.BridgeName, TapName: b.TapName, MTU: pod.Attrs().MTU,
	}
	if addr.IPNet != nil {
		ones, _ := addr.Mask.Size()
		ip, _ := netip.AddrFromSlice(addr.IP.To4())
		res.GuestIP = netip.PrefixFrom(ip, ones)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: b.BridgeName, MTU: res.MTU}}
	if err := netlink.LinkAdd(br); err != nil {
		return nil, nil, fmt.Errorf("create bridge %s: %w", b.BridgeName, err)
	}
	link, err := netlink.LinkByName(b.BridgeName)
	if err == nil {
		err = netlink.LinkSetAlias(link, bridgeAlias(res))
		if err != nil {
			_ = netlink.LinkDel(link) // not marked as ours yet: teardownBridge would leave it
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("bridge %s: record the pod's address: %w", b.BridgeName, err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"add " + BridgeServerIP.String(), func() error {
			return netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: BridgeServerIP.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		}},
		{"set up", func() error { return netlink.LinkSetUp(link) }},
		{"remove the pod's address from " + res.PodInterface, func() error {
			if addr.IPNet == nil {
				return nil
			}
			return netlink.AddrDel(pod, &addr)
		}},
		{"set " + res.PodInterface + " down", func() error { return netlink.LinkSetDown(pod) }},
		{"give " + res.PodInterface + " a new MAC", func() error { return netlink.LinkSetHardwareAddr(pod, randomMAC()) }},
		{"enslave " + res.PodInterface, func() error { return netlink.LinkSetMaster(pod, link) }},
		{"set " + res.PodInterface + " up", func() error { return netlink.LinkSetUp(pod) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return nil, nil, fmt.Errorf("bridge %s: %s: %w", b.BridgeName, s.what, err)
		}
	}
	return res, link, nil
}

// secondaryConfig is the secondary pod interface name and its first global IPv4 address, if it
// has one (a zero Addr otherwise).
func secondaryConfig(name string) (netlink.Link, netlink.Addr, error) {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, netlink.Addr{}, fmt.Errorf("pod interface %s: %w", name, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, netlink.Addr{}, fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip.IsGlobalUnicast() {
			return link, a, nil
		}
	}
	return link, netlink.Addr{}, nil
}

// podConfig is the IPv4 default route's link, its first global address and the gateway.
func podConfig() (netlink.Link, netlink.Addr, netip.Addr, error) {
	link, ip, err := podAddress()
	if err != nil {
		return nil, netlink.Addr{}, netip.Addr{}, err
	}
	routes, err := netlink.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, netlink.Addr{}, netip.Addr{}, fmt.Errorf("list routes: %w", err)
	}
	var gw netip.Addr
	for _, r := range routes {
		if (r.Dst == nil || isZeroMask(r.Dst.Mask)) && r.Gw != nil {
			gw, _ = netip.AddrFromSlice(r.Gw.To4())
			break
		}
	}
	if !gw.IsValid() {
		return nil, netlink.Addr{}, netip.Addr{}, fmt.Errorf("the default route through %s has no gateway", link.Attrs().Name)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return nil, netlink.Addr{}, netip.Addr{}, err
	}
	for _, a := range addrs {
		if a.IP.Equal(ip.AsSlice()) {
			return link, a, gw, nil
		}
	}
	return nil, netlink.Addr{}, netip.Addr{}, fmt.Errorf("address %v vanished from %s", ip, link.Attrs().Name)
}

func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	_, _ = rand.Read(mac)
	mac[0] = mac[0]&^1 | 2 // unicast, locally administered
	return mac
}

func bridgeAlias(r *BridgeResult) string {
	a := fmt.Sprintf("%sif=%s mac=%s", bridgeAliasPrefix, r.PodInterface, r.MAC)
	if r.GuestIP.IsValid() {
		a += " ip=" + r.GuestIP.String()
	}
	if r.Gateway.IsValid() {
		a += " gw=" + r.Gateway.String()
	}
	return a
}

func parseBridgeAlias(alias string) (*BridgeResult, error) {
	rest, ok := strings.CutPrefix(alias, bridgeAliasPrefix)
	if !ok {
		return nil, fmt.Errorf("alias %q", alias)
	}
	res := &BridgeResult{ServerIP: BridgeServerIP}
	var err error
	for _, kv := range strings.Fields(rest) {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "if":
			res.PodInterface = v
		case "ip":
			res.GuestIP, err = netip.ParsePrefix(v)
		case "gw":
			res.Gateway, err = netip.ParseAddr(v)
		case "mac":
			res.MAC, err = net.ParseMAC(v)
		}
		if err != nil {
			return nil, fmt.Errorf("alias %q: %w", alias, err)
		}
	}
	if res.PodInterface == "" || res.MAC == nil {
		return nil, fmt.Errorf("alias %q is incomplete", alias)
	}
	return res, nil
}

// TeardownBridge removes the bridge binding from the namespace at nsPath and gives the pod
// interface back its address, MAC and default route. It is idempotent; a namespace that no longer
// exists has nothing left to remove.
func TeardownBridge(nsPath string, b Bridge) error {
	b, err := b.withDefaults()
	if err != nil {
		return err
	}
	return inExistingNS(nsPath, "bridge binding", func(ns.NetNS) error { return teardownBridge(b) })
}

func teardownBridge(b Bridge) error {
	var errs []error
	if link, err := netlink.LinkByName(b.TapName); err == nil {
		if _, ok := link.(*netlink.Tuntap); ok {
			if err := netlink.LinkDel(link); err != nil {
				errs = append(errs, fmt.Errorf("delete %s: %w", b.TapName, err))
			}
		}
	} else if !isNotFound(err) {
		errs = append(errs, fmt.Errorf("tap %s: %w", b.TapName, err))
	}
	link, err := netlink.LinkByName(b.BridgeName)
	if isNotFound(err) {
		return errors.Join(errs...)
	}
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("bridge %s: %w", b.BridgeName, err))...)
	}
	res, err := parseBridgeAlias(link.Attrs().Alias)
	if _, isBridge := link.(*netlink.Bridge); !isBridge || err != nil {
		return errors.Join(errs...) // not made by SetupBridge: leave it
	}
	if b.PodInterface != "" {
		errs = append(errs, removeSecondaryTable(b.BridgeName))
	}
	errs = append(errs, restorePod(res))
	if err := netlink.LinkDel(link); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", b.BridgeName, err))
	}
	return errors.Join(errs...)
}

// restorePod gives the pod interface back what moveToBridge took.
func restorePod(r *BridgeResult) error {
	pod, err := netlink.LinkByName(r.PodInterface)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pod interface %s: %w", r.PodInterface, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: r.GuestIP.Addr().AsSlice(), Mask: net.CIDRMask(r.GuestIP.Bits(), 32)}}
	steps := []struct {
		what string
		do   func() error
	}{
		{"release", func() error { return netlink.LinkSetNoMaster(pod) }},
		{"set down", func() error { return netlink.LinkSetDown(pod) }},
		{"restore the MAC", func() error { return netlink.LinkSetHardwareAddr(pod, r.MAC) }},
		{"set up", func() error { return netlink.LinkSetUp(pod) }},
		{"restore the address", func() error {
			if !r.GuestIP.IsValid() {
				return nil
			}
			return netlink.AddrReplace(pod, addr)
		}},
		{"restore the default route", func() error {
			if !r.Gateway.IsValid() {
				return nil
			}
			return netlink.RouteReplace(&netlink.Route{LinkIndex: pod.Attrs().Index, Gw: r.Gateway.AsSlice()})
		}},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("pod interface %s: %s: %w", r.PodInterface, s.what, err)
		}
	}
	return nil
}
