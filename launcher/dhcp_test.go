package launcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func testLease() DHCPLease {
	return DHCPLease{
		MAC:      net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55},
		IP:       netip.MustParsePrefix("10.0.2.2/24"),
		Gateway:  netip.MustParseAddr("10.0.2.1"),
		DNS:      []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")},
		Hostname: "vm1",
		MTU:      1450,
	}
}

func dhcpRequest(t *testing.T, mac net.HardwareAddr, typ dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	m, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(typ)}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDHCPReply(t *testing.T) {
	lease := testLease()
	h := &dhcpHandler{lease: lease}
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 9}
	gw, ip := net.IPv4(10, 0, 2, 1), net.IPv4(10, 0, 2, 2)
	for _, tc := range []struct {
		name string
		req  *dhcpv4.DHCPv4
		want dhcpv4.MessageType // MessageTypeNone: no reply
	}{
		{"discover", dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeDiscover), dhcpv4.MessageTypeOffer},
		{"discover from another MAC", dhcpRequest(t, other, dhcpv4.MessageTypeDiscover), dhcpv4.MessageTypeNone},
		{"request", dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(gw))), dhcpv4.MessageTypeAck},
		{"renewal (ciaddr)", dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(ip)), dhcpv4.MessageTypeAck},
		{"request for another address", dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 2, 15)))), dhcpv4.MessageTypeNak},
		{"request to another server", dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 2, 3)))), dhcpv4.MessageTypeNone},
		{"request from another MAC", dhcpRequest(t, other, dhcpv4.MessageTypeRequest,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip))), dhcpv4.MessageTypeNone},
		{"release", dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeRelease), dhcpv4.MessageTypeNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.reply(tc.req)
			if tc.want == dhcpv4.MessageTypeNone {
				if resp != nil {
					t.Fatalf("got a %s, want no reply", resp.MessageType())
				}
				return
			}
			if resp == nil {
				t.Fatalf("no reply, want a %s", tc.want)
			}
			if resp.MessageType() != tc.want || resp.TransactionID != tc.req.TransactionID || !resp.ServerIdentifier().Equal(gw) {
				t.Fatalf("reply: type %s xid %s server %v; want %s xid %s server %v",
					resp.MessageType(), resp.TransactionID, resp.ServerIdentifier(), tc.want, tc.req.TransactionID, gw)
			}
			if tc.want == dhcpv4.MessageTypeNak {
				return
			}
			checkLease(t, resp, lease)
		})
	}
}

// checkLease checks an OFFER or ACK against the lease.
func checkLease(t *testing.T, resp *dhcpv4.DHCPv4, lease DHCPLease) {
	t.Helper()
	dns := resp.DNS()
	mtu := resp.GetOneOption(dhcpv4.OptionInterfaceMTU)
	switch {
	case !resp.YourIPAddr.Equal(net.IPv4(10, 0, 2, 2)):
		t.Errorf("yiaddr = %v", resp.YourIPAddr)
	case resp.SubnetMask().String() != net.CIDRMask(24, 32).String():
		t.Errorf("subnet mask = %v", resp.SubnetMask())
	case len(resp.Router()) != 1 || !resp.Router()[0].Equal(net.IPv4(10, 0, 2, 1)):
		t.Errorf("router = %v", resp.Router())
	case len(dns) != 2 || !dns[0].Equal(net.IPv4(10, 96, 0, 10)) || !dns[1].Equal(net.IPv4(10, 96, 0, 11)):
		t.Errorf("dns = %v", dns)
	case resp.HostName() != lease.Hostname:
		t.Errorf("hostname = %q", resp.HostName())
	case resp.IPAddressLeaseTime(0) != DHCPLeaseTime:
		t.Errorf("lease time = %v", resp.IPAddressLeaseTime(0))
	case len(mtu) != 2 || int(mtu[0])<<8|int(mtu[1]) != lease.MTU:
		t.Errorf("mtu option = %v", mtu)
	case !resp.BroadcastAddress().Equal(net.IPv4(10, 0, 2, 255)):
		t.Errorf("broadcast = %v", resp.BroadcastAddress())
	}
}

// With the bridge binding the router is the pod network's and the server answers as ServerID.
func TestDHCPReplyServerID(t *testing.T) {
	lease := testLease()
	lease.Gateway = netip.MustParseAddr("10.0.2.254")
	lease.ServerID = netip.MustParseAddr("169.254.75.10")
	h := &dhcpHandler{lease: lease}
	sid := net.IPv4(169, 254, 75, 10)
	offer := h.reply(dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeDiscover))
	if offer == nil || !offer.ServerIdentifier().Equal(sid) || !offer.ServerIPAddr.Equal(sid) ||
		len(offer.Router()) != 1 || !offer.Router()[0].Equal(net.IPv4(10, 0, 2, 254)) {
		t.Fatalf("offer = %v, want server %v and router 10.0.2.254", offer, sid)
	}
	ack := h.reply(dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeRequest,
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 2, 2))), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sid))))
	if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("request to the server identifier: %v, want an ACK", ack)
	}
	if r := h.reply(dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeRequest,
		dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 2, 2))),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 2, 254))))); r != nil {
		t.Errorf("request naming the router as server got a %s, want no reply", r.MessageType())
	}
}

// On a secondary network (a multus one) the lease has no router: the guest's default route stays
// the pod network's.
func TestDHCPReplyWithoutGateway(t *testing.T) {
	lease := testLease()
	lease.Gateway = netip.Addr{}
	lease.ServerID = netip.MustParseAddr("169.254.75.10")
	if err := lease.validate(); err != nil {
		t.Fatalf("a lease with a server identifier and no gateway: %v", err)
	}
	h := &dhcpHandler{lease: lease}
	offer := h.reply(dhcpRequest(t, lease.MAC, dhcpv4.MessageTypeDiscover))
	if offer == nil || !offer.ServerIdentifier().Equal(net.IPv4(169, 254, 75, 10)) || len(offer.Router()) != 0 ||
		!offer.YourIPAddr.Equal(net.IPv4(10, 0, 2, 2)) {
		t.Fatalf("offer = %v, want 10.0.2.2 from 169.254.75.10 without a router", offer)
	}
}

func TestServeDHCPBadLease(t *testing.T) {
	for name, mutate := range map[string]func(*DHCPLease){
		"no MAC":                              func(l *DHCPLease) { l.MAC = nil },
		"no IP":                               func(l *DHCPLease) { l.IP = netip.Prefix{} },
		"IPv6":                                func(l *DHCPLease) { l.IP = netip.MustParsePrefix("fd00::2/64") },
		"no gateway and no server identifier": func(l *DHCPLease) { l.Gateway = netip.Addr{} },
		"IPv6 DNS":                            func(l *DHCPLease) { l.DNS = []netip.Addr{netip.MustParseAddr("fd00::53")} },
		"MTU too big":                         func(l *DHCPLease) { l.MTU = 70000 },
		"IPv6 server":                         func(l *DHCPLease) { l.ServerID = netip.MustParseAddr("fd00::1") },
	} {
		lease := testLease()
		mutate(&lease)
		if err := ServeDHCP(context.Background(), "lo", lease); err == nil {
			t.Errorf("%s: ServeDHCP returned nil", name)
		}
	}
}

// inNS runs f on a new OS thread switched into the namespace h; the thread is never returned to
// the scheduler (it ends with the goroutine), so no other goroutine runs in the namespace.
func inNS(h netns.NsHandle, f func() error) <-chan error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(h); err != nil {
			done <- err
			return
		}
		done <- f()
	}()
	return done
}

// TestServeDHCP runs the server and a real DHCP client on the two ends of a veth pair inside a
// throwaway network namespace (qvd-<random>).
func TestServeDHCP(t *testing.T) {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "qvd-" + hex.EncodeToString(b)
	created := make(chan error, 1)
	var nsh netns.NsHandle
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		var err error
		nsh, err = netns.NewNamed(name)
		created <- err
	}()
	if err := <-created; err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = nsh.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	lease := testLease()
	err := <-inNS(nsh, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "srv0"}, PeerName: "cli0"}); err != nil {
			return err
		}
		for _, n := range []string{"srv0", "cli0"} {
			l, err := netlink.LinkByName(n)
			if err != nil {
				return err
			}
			if n == "srv0" {
				if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(10, 0, 2, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
					return err
				}
			} else if err := netlink.LinkSetHardwareAddr(l, lease.MAC); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set up veth pair: %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := inNS(nsh, func() error { return ServeDHCP(ctx, "srv0", lease) })

	var got *nclient4.Lease
	err = <-inNS(nsh, func() error {
		c, err := nclient4.New("cli0", nclient4.WithTimeout(500*time.Millisecond), nclient4.WithRetry(20))
		if err != nil {
			return err
		}
		defer c.Close()
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		defer rcancel()
		got, err = c.Request(rctx, dhcpv4.WithOption(dhcpv4.OptHostName(lease.Hostname)))
		return err
	})
	if err != nil {
		t.Fatalf("DHCP exchange: %v", err)
	}
	if got.Offer.MessageType() != dhcpv4.MessageTypeOffer || got.ACK.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("exchange: %s then %s", got.Offer.MessageType(), got.ACK.MessageType())
	}
	checkLease(t, got.ACK, lease)

	// Another MAC gets no answer.
	err = <-inNS(nsh, func() error {
		c, err := nclient4.New("cli0", nclient4.WithHWAddr(net.HardwareAddr{0x02, 0, 0, 0, 0, 9}),
			nclient4.WithTimeout(300*time.Millisecond), nclient4.WithRetry(1))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.DiscoverOffer(ctx)
		return err
	})
	if err == nil {
		t.Error("a client with another MAC got an offer")
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("ServeDHCP: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeDHCP did not return after its context ended")
	}
}

func TestServeDHCPMissingInterface(t *testing.T) {
	if err := ServeDHCP(context.Background(), "qvnosuchif0", testLease()); err == nil {
		t.Error("ServeDHCP on a missing interface returned nil")
	}
}
