package netsetup_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/netsetup"
)

// podState is what the bridge binding takes from the pod interface and gives back.
type podState struct {
	mac    string
	addrs  []string
	gw     string
	master int
}

func (p *podNS) eth0(t *testing.T) podState {
	t.Helper()
	h := p.handle(t)
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	s := podState{mac: l.Attrs().HardwareAddr.String(), master: l.Attrs().MasterIndex}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		s.addrs = append(s.addrs, a.IPNet.String())
	}
	routes, err := h.RouteList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if ones, _ := dstMask(r); ones == 0 && r.Gw != nil {
			s.gw = r.Gw.String()
		}
	}
	return s
}

func TestBridgeSetupTeardown(t *testing.T) {
	p := newPodNS(t)
	before := p.eth0(t)
	id := randHex(t, 3)
	b := netsetup.Bridge{TapName: "qvtap" + id, BridgeName: "qvbr" + id, TapOwner: 4242, TapGroup: 4243}
	res, err := netsetup.SetupBridge(p.Path, b)
	if err != nil {
		t.Fatal(err)
	}
	if res.GuestIP != netip.PrefixFrom(p.PodIP, 24) || res.Gateway != p.HostIP || res.MAC.String() != before.mac ||
		res.ServerIP != netsetup.BridgeServerIP || res.PodInterface != "eth0" || res.MTU != 1500 {
		t.Errorf("result = %+v; want the pod's %v/24, gateway %v, MAC %s", *res, p.PodIP, p.HostIP, before.mac)
	}
	h := p.handle(t)
	br, err := h.LinkByName(b.BridgeName)
	if err != nil {
		t.Fatal(err)
	}
	during := p.eth0(t)
	if during.master != br.Attrs().Index || len(during.addrs) != 0 || during.mac == before.mac || during.gw != "" {
		t.Errorf("eth0 during the binding = %+v; want a port of %s without address, route or its MAC", during, b.BridgeName)
	}
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != "169.254.75.10/32" {
		t.Errorf("bridge addresses = %v", addrs)
	}
	link, err := h.LinkByName(b.TapName)
	if err != nil {
		t.Fatal(err)
	}
	if tap, ok := link.(*netlink.Tuntap); !ok || tap.Owner != 4242 || tap.Group != 4243 || tap.Attrs().MasterIndex != br.Attrs().Index {
		t.Errorf("tap = %+v, want a port of the bridge owned by 4242:4243", link)
	}

	again, err := netsetup.SetupBridge(p.Path, b)
	if err != nil {
		t.Fatalf("second setup: %v", err)
	}
	if again.GuestIP != res.GuestIP || again.Gateway != res.Gateway || again.MAC.String() != res.MAC.String() {
		t.Errorf("second setup = %+v, want %+v", *again, *res)
	}

	for i := range 2 {
		if err := netsetup.TeardownBridge(p.Path, b); err != nil {
			t.Fatalf("teardown %d: %v", i, err)
		}
	}
	if got := p.links(t); !slices.Equal(got, []string{"eth0", "lo"}) {
		t.Errorf("links after teardown = %v", got)
	}
	if after := p.eth0(t); after.mac != before.mac || !slices.Equal(after.addrs, before.addrs) || after.gw != before.gw || after.master != 0 {
		t.Errorf("eth0 after teardown = %+v, want %+v", after, before)
	}
}

// TestBridgeGuest boots the test guest on the bridge binding: it gets the pod's address over DHCP,
// reaches the outside with it and is reached at it; teardown gives the pod its address back.
func TestBridgeGuest(t *testing.T) {
	p := newPodNS(t)
	before, linksBefore := p.eth0(t), p.links(t)
	id := randHex(t, 3)
	b := netsetup.Bridge{TapName: "qvtap" + id, BridgeName: "qvbr" + id}
	res, err := netsetup.SetupBridge(p.Path, b)
	if err != nil {
		t.Fatal(err)
	}
	tornDown := false
	t.Cleanup(func() {
		if !tornDown {
			_ = netsetup.TeardownBridge(p.Path, b)
		}
	})
	g := bootGuest(t, p, v1alpha1.Interface{Bridge: &v1alpha1.InterfaceBridge{}}, res.TapName,
		launcher.DHCPLease{MAC: res.MAC, IP: res.GuestIP, Gateway: res.Gateway, ServerID: res.ServerIP,
			Hostname: "testguest", MTU: res.MTU}, res.BridgeName)
	checkOutbound(t, g, p, p.PodIP) // the guest has the pod's address itself
	checkInbound(t, p.PodIP)
	g.shutdown(t)

	if err := netsetup.TeardownBridge(p.Path, b); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	tornDown = true
	if got := p.links(t); !slices.Equal(got, linksBefore) {
		t.Errorf("links after teardown = %v, want %v", got, linksBefore)
	}
	if after := p.eth0(t); after.mac != before.mac || !slices.Equal(after.addrs, before.addrs) || after.gw != before.gw {
		t.Errorf("eth0 after teardown = %+v, want %+v", after, before)
	}
}

// TestBridgeSecondaryInterface binds a secondary pod interface (as Multus adds one): its address,
// when it has one, moves to the guest without a gateway, eth0 keeps the pod network, and
// teardown gives the address back; a layer-2 interface without address binds with no lease.
func TestBridgeSecondaryInterface(t *testing.T) {
	p := newPodNS(t)
	h := p.handle(t)
	before := p.eth0(t)
	for _, tc := range []struct {
		name, addr string
	}{{"with an address", "192.168.77.5/24"}, {"layer 2", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			id := randHex(t, 3)
			podIf := "pod" + id
			must(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: podIf}, PeerName: "peer" + id}))
			link, err := h.LinkByName(podIf)
			must(t, err)
			mac := link.Attrs().HardwareAddr.String()
			if tc.addr != "" {
				a, err := netlink.ParseAddr(tc.addr)
				must(t, err)
				must(t, h.AddrAdd(link, a))
			}
			must(t, h.LinkSetUp(link))
			b := netsetup.Bridge{TapName: "qvt" + id, BridgeName: "qvb" + id, TapOwner: 4242, TapGroup: 4243, PodInterface: podIf}
			res, err := netsetup.SetupBridge(p.Path, b)
			must(t, err)
			wantIP := netip.Prefix{}
			if tc.addr != "" {
				wantIP = netip.MustParsePrefix(tc.addr)
			}
			if res.GuestIP != wantIP || res.Gateway.IsValid() || res.MAC.String() != mac || res.PodInterface != podIf {
				t.Errorf("result = %+v; want %v, no gateway, MAC %s of %s", *res, wantIP, mac, podIf)
			}
			if during := p.eth0(t); during.mac != before.mac || !slices.Equal(during.addrs, before.addrs) || during.gw != before.gw || during.master != 0 {
				t.Errorf("eth0 during a secondary binding = %+v, want it untouched %+v", during, before)
			}
			// The secondary network cannot reach the pod's stack, nor route through it.
			table := fmt.Sprintf("%d qvirt-%s", nftables.TableFamilyBridge, b.BridgeName)
			if !slices.Contains(p.tables(t), table) || p.sysctl(t, "net/ipv4/conf/"+b.BridgeName+"/forwarding") != "0" {
				t.Errorf("tables %v, %s forwarding %s; want table %q and forwarding 0", p.tables(t), b.BridgeName,
					p.sysctl(t, "net/ipv4/conf/"+b.BridgeName+"/forwarding"), table)
			}
			again, err := netsetup.SetupBridge(p.Path, b)
			must(t, err)
			if again.GuestIP != res.GuestIP || again.MAC.String() != res.MAC.String() {
				t.Errorf("second setup = %+v, want %+v", *again, *res)
			}
			must(t, netsetup.TeardownBridge(p.Path, b))
			if tables := p.tables(t); slices.Contains(tables, fmt.Sprintf("%d qvirt-%s", nftables.TableFamilyBridge, b.BridgeName)) {
				t.Errorf("tables after teardown: %v", tables)
			}
			link, err = h.LinkByName(podIf)
			must(t, err)
			addrs, err := h.AddrList(link, netlink.FAMILY_V4)
			must(t, err)
			var got []string
			for _, a := range addrs {
				got = append(got, a.IPNet.String())
			}
			if want := []string{tc.addr}; tc.addr != "" && !slices.Equal(got, want) || tc.addr == "" && len(got) != 0 ||
				link.Attrs().HardwareAddr.String() != mac || link.Attrs().MasterIndex != 0 {
				t.Errorf("%s after teardown: addresses %v, MAC %s, master %d; want %q, %s, none", podIf, got, link.Attrs().HardwareAddr, link.Attrs().MasterIndex, tc.addr, mac)
			}
		})
	}
}
