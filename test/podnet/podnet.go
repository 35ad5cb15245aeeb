// Package podnet makes network namespaces that look like a pod's for tests: eth0 with an address,
// a default route through a veth pair to the root namespace. They are named qvt-<random> and
// removed, with their veth, when the test ends. Root only.
package podnet

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// NS is a network namespace set up like a pod's: eth0 with PodIP in HostIP's /24 and a default
// route through HostIP, the host end of a veth pair in the root namespace (New) or the bridge the
// host end is attached to (Network.NewNS).
type NS struct {
	Name     string // under /var/run/netns
	Path     string
	HostVeth string
	HostIP   netip.Addr // 10.99.R.1, in the root namespace
	PodIP    netip.Addr // 10.99.R.2 on eth0 in the namespace
}

// RandHex is n random bytes in hex, for unique names.
func RandHex(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// New makes the namespace and veth pair, the host end holding HostIP, and registers their removal
// with t.Cleanup.
func New(t testing.TB) *NS {
	t.Helper()
	subnet := freeSubnet(t)
	hostIP := subnet.Addr().Next()
	p := newNS(t, hostIP, hostIP.Next())
	host, err := netlink.LinkByName(p.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	must(t, netlink.AddrAdd(host, addr(p.HostIP, 24)))
	must(t, netlink.LinkSetUp(host))
	return p
}

// Network is a bridge in the root namespace holding the gateway address, with pod namespaces
// attached by veth pairs, as the CNI bridge plugin makes them: pods reach each other over the
// bridge without the host forwarding.
type Network struct {
	Bridge  string
	Gateway netip.Addr // 10.99.R.1 on the bridge
	next    netip.Addr
}

// The name prefixes of the host's links this package makes: a test that checks the host for links
// left behind skips these, which tests of other packages running beside it make and remove.
const (
	BridgePrefix   = "qvn"
	HostVethPrefix = "qvh"
)

// NewNetwork makes the bridge and registers its removal with t.Cleanup.
func NewNetwork(t testing.TB) *Network {
	t.Helper()
	subnet := freeSubnet(t)
	n := &Network{Bridge: BridgePrefix + RandHex(t, 4), Gateway: subnet.Addr().Next()}
	n.next = n.Gateway.Next()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.Bridge}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatalf("create bridge %s: %v", n.Bridge, err)
	}
	t.Cleanup(func() {
		if err := netlink.LinkDel(br); err != nil {
			t.Errorf("delete bridge %s: %v", n.Bridge, err)
		}
	})
	must(t, netlink.AddrAdd(br, addr(n.Gateway, 24)))
	must(t, netlink.LinkSetUp(br))
	return n
}

// NewNS makes a pod namespace on the network with the next free address.
func (n *Network) NewNS(t testing.TB) *NS {
	t.Helper()
	p := newNS(t, n.Gateway, n.next)
	n.next = n.next.Next()
	host, err := netlink.LinkByName(p.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	br, err := netlink.LinkByName(n.Bridge)
	if err != nil {
		t.Fatal(err)
	}
	must(t, netlink.LinkSetMaster(host, br))
	must(t, netlink.LinkSetUp(host))
	return p
}

// freeSubnet is a /24 of 10.99.0.0/16 no root-namespace address uses.
func freeSubnet(t testing.TB) netip.Prefix {
	t.Helper()
	used, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for {
		var n byte
		fmt.Sscanf(RandHex(t, 1), "%x", &n)
		subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 99, n, 0}), 24)
		if !slices.ContainsFunc(used, func(a netlink.Addr) bool {
			ip, _ := netip.AddrFromSlice(a.IP.To4())
			return subnet.Contains(ip)
		}) {
			return subnet
		}
	}
}

// newNS makes the namespace with eth0 at podIP/24 routing through gateway, and the veth pair whose
// host end (down, no address) the caller sets up.
func newNS(t testing.TB, gateway, podIP netip.Addr) *NS {
	t.Helper()
	id := RandHex(t, 4)
	p := &NS{Name: "qvt-" + id, HostVeth: HostVethPrefix + id, HostIP: gateway, PodIP: podIP}
	p.Path = filepath.Join("/var/run/netns", p.Name)

	// netns.NewNamed switches the calling thread into the new namespace: do it on a thread that
	// is thrown away afterwards.
	created := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		h, err := netns.NewNamed(p.Name)
		if err == nil {
			_ = h.Close()
		}
		created <- err
	}()
	if err := <-created; err != nil {
		t.Fatalf("create netns %s: %v", p.Name, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(p.HostVeth); err == nil {
			_ = netlink.LinkDel(l)
		}
		if err := netns.DeleteNamed(p.Name); err != nil {
			t.Errorf("delete netns %s: %v", p.Name, err)
		}
		if _, err := os.Stat(p.Path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("netns %s left behind: %v", p.Name, err)
		}
		if _, err := netlink.LinkByName(p.HostVeth); err == nil {
			t.Errorf("veth %s left behind", p.HostVeth)
		}
	})

	nsh, err := netns.GetFromName(p.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	peer := "qvp" + id
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.HostVeth}, PeerName: peer,
		PeerNamespace: netlink.NsFd(int(nsh))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth %s: %v", p.HostVeth, err)
	}
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	must(t, h.LinkSetName(eth0, "eth0"))
	must(t, h.AddrAdd(eth0, addr(p.PodIP, 24)))
	must(t, h.LinkSetUp(eth0))
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	must(t, h.LinkSetUp(lo))
	must(t, h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: p.HostIP.AsSlice()}))
	return p
}

func addr(ip netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// handle is a netlink handle for the namespace.
