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

// NS is a network namespace set up like a pod's: eth0 with hostIP's subnet and a default route
// through the host end of a veth pair in the root namespace.
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

// New makes the namespace and veth pair and registers their removal with t.Cleanup.
func New(t testing.TB) *NS {
	t.Helper()
	id := RandHex(t, 4)
	p := &NS{Name: "qvt-" + id, HostVeth: "qvh" + id}
	p.Path = filepath.Join("/var/run/netns", p.Name)
	// A /24 of 10.99.0.0/16 no root-namespace address uses.
	used, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for {
		r := RandHex(t, 1)
		var n byte
		fmt.Sscanf(r, "%x", &n)
		subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 99, n, 0}), 24)
		if !slices.ContainsFunc(used, func(a netlink.Addr) bool {
			ip, _ := netip.AddrFromSlice(a.IP.To4())
			return subnet.Contains(ip)
		}) {
			p.HostIP = netip.AddrFrom4([4]byte{10, 99, n, 1})
			p.PodIP = netip.AddrFrom4([4]byte{10, 99, n, 2})
			break
		}
	}

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
	host, err := netlink.LinkByName(p.HostVeth)
	if err != nil {
		t.Fatal(err)
	}
	must(t, netlink.AddrAdd(host, addr(p.HostIP, 24)))
	must(t, netlink.LinkSetUp(host))

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
