package launcher

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"github.com/qvirt/qvirt/machine"
)

// DHCPLeaseTime is how long the guest's lease lasts. The lease never changes during the VM's life,
// so a long lease only saves renewals.
const DHCPLeaseTime = 24 * time.Hour

// DHCPLease is the one address the launcher's DHCP server hands out: to the guest NIC with MAC.
type DHCPLease struct {
	// MAC is the guest NIC's address; requests from any other client are ignored.
	MAC net.HardwareAddr
	// IP is the guest's address and prefix length, e.g. 10.0.2.2/24.
	IP netip.Prefix
	// Gateway is the default router; none (zero) on a secondary network, whose lease then needs a
	// ServerID.
	Gateway netip.Addr
	// ServerID is the server identifier (option 54), an address of the interface the server
	// listens on; Gateway when zero, as with the masquerade binding where the bridge is the
	// guest's router. The bridge binding's router is the pod network's, so it sets this.
	ServerID netip.Addr
	// DNS servers, in order of preference; optional.
	DNS []netip.Addr
	// Hostname is the guest's host name; optional.
	Hostname string
	// MTU is the interface MTU (option 26); not sent when zero.
	MTU int
}

// leaseFor is the DHCPLease of c for the guest NIC with mac.
func leaseFor(c *machine.DHCP, mac string) (DHCPLease, error) {
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return DHCPLease{}, fmt.Errorf("interface mac %q: %w", mac, err)
	}
	return DHCPLease{MAC: hw, IP: c.IP, Gateway: c.Gateway, ServerID: c.ServerID, DNS: c.DNS,
		Hostname: c.Hostname, MTU: c.MTU}, nil
}

func (l *DHCPLease) validate() error {
	switch {
	case len(l.MAC) != 6:
		return fmt.Errorf("dhcp lease: MAC %q is not an ethernet address", l.MAC)
	case !l.IP.IsValid() || !l.IP.Addr().Is4():
		return fmt.Errorf("dhcp lease: IP %v is not an IPv4 prefix", l.IP)
	case l.Gateway.IsValid() && !l.Gateway.Is4():
		return fmt.Errorf("dhcp lease: gateway %v is not an IPv4 address", l.Gateway)
	case !l.Gateway.IsValid() && !l.ServerID.IsValid():
		return errors.New("dhcp lease: neither a gateway nor a server identifier")
	case l.ServerID.IsValid() && !l.ServerID.Is4():
		return fmt.Errorf("dhcp lease: server identifier %v is not an IPv4 address", l.ServerID)
	case l.MTU < 0 || l.MTU > 65535:
		return fmt.Errorf("dhcp lease: MTU %d out of range", l.MTU)
	}
	for _, d := range l.DNS {
		if !d.Is4() {
			return fmt.Errorf("dhcp lease: DNS server %v is not an IPv4 address", d)
		}
	}
	return nil
}

// ServeDHCP answers the guest's DHCP requests on iface (the bridge the guest's tap is enslaved to)
// until ctx ends, then returns nil; it returns an error only when it cannot serve at all. It answers
// DISCOVER with an OFFER and REQUEST with an ACK for lease.MAC only, and a REQUEST for another
// address with a NAK; everything else is ignored.
//
// The listening socket is opened in the network namespace of the calling OS thread: call ServeDHCP
// from a goroutine that runs inside the pod's network namespace (the launcher process itself runs
// there; a caller in another namespace locks its goroutine to a thread switched into the pod's
// namespace first). Binding port 67 needs CAP_NET_BIND_SERVICE (or a lowered
// net.ipv4.ip_unprivileged_port_start in the pod) and the socket is bound to iface.
func ServeDHCP(ctx context.Context, iface string, lease DHCPLease) error {
	srv, err := startDHCP(iface, lease)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		srv.stop()
		return nil
	case <-srv.served:
		if ctx.Err() != nil {
			return nil
		}
		return srv.err
	}
}

// dhcpServer is a DHCP server serving in the background, started by startDHCP.
type dhcpServer struct {
	srv      *server4.Server
	served   chan struct{} // closed once Serve returned and the socket is closed
	err      error         // why Serve returned; set before served is closed
	stopping atomic.Bool   // stop was called: Serve's return is expected
}

// startDHCP validates lease, binds the DHCP port on iface (in the calling thread's network
// namespace, see ServeDHCP) and serves lease in the background until stop. Bind errors are
// returned here, so a caller learns at once that the guest would get no address.
func startDHCP(iface string, lease DHCPLease) (*dhcpServer, error) {
	if err := lease.validate(); err != nil {
		return nil, err
	}
	h := &dhcpHandler{lease: lease}
	srv, err := server4.NewServer(iface, &net.UDPAddr{IP: net.IPv4zero, Port: dhcpv4.ServerPort}, h.handle)
	if err != nil {
		return nil, fmt.Errorf("dhcp server on %s: %w", iface, err)
	}
	s := &dhcpServer{srv: srv, served: make(chan struct{})}
	go func() {
		err := srv.Serve()
		_ = srv.Close()
		s.err = fmt.Errorf("dhcp server on %s: %w", iface, err)
		close(s.served)
	}()
	return s, nil
}

// stop closes the server's socket and returns once it stopped serving. Safe to call more than once
// and concurrently.
func (s *dhcpServer) stop() {
	s.stopping.Store(true)
	_ = s.srv.Close()
	<-s.served
}

type dhcpHandler struct{ lease DHCPLease }

// handle is server4's Handler; it runs in its own goroutine per message and only reads h.
func (h *dhcpHandler) handle(conn net.PacketConn, peer net.Addr, req *dhcpv4.DHCPv4) {
	reply := h.reply(req)
	if reply == nil {
		return
	}
	_, _ = conn.WriteTo(reply.ToBytes(), peer)
}

// reply is the answer to req, or nil when req gets none.
func (h *dhcpHandler) reply(req *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	if req.OpCode != dhcpv4.OpcodeBootRequest || !bytes.Equal(req.ClientHWAddr, h.lease.MAC) {
		return nil
	}
	gw := net.IP(h.lease.Gateway.AsSlice())
	sid := gw
	if h.lease.ServerID.IsValid() {
		sid = net.IP(h.lease.ServerID.AsSlice())
	}
	ip := net.IP(h.lease.IP.Addr().AsSlice())
	var typ dhcpv4.MessageType
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		typ = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		if reqSID := req.ServerIdentifier(); reqSID != nil && !reqSID.Equal(sid) {
			return nil // the client chose another server
		}
		want := req.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = req.ClientIPAddr
		}
		typ = dhcpv4.MessageTypeAck
		if !want.Equal(ip) {
			typ = dhcpv4.MessageTypeNak
		}
	default: // RELEASE, DECLINE, INFORM: nothing to do for a single fixed lease
		return nil
	}
	resp, err := dhcpv4.NewReplyFromRequest(req,
		dhcpv4.WithMessageType(typ),
		dhcpv4.WithServerIP(sid),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(sid)))
	if err != nil {
		return nil
	}
	if typ == dhcpv4.MessageTypeNak {
		return resp
	}
	mask := net.CIDRMask(h.lease.IP.Bits(), 32)
	resp.YourIPAddr = ip
	resp.UpdateOption(dhcpv4.OptSubnetMask(mask))
	if h.lease.Gateway.IsValid() {
		resp.UpdateOption(dhcpv4.OptRouter(gw))
	}
	resp.UpdateOption(dhcpv4.OptIPAddressLeaseTime(DHCPLeaseTime))
	bcast := make(net.IP, 4)
	binary.BigEndian.PutUint32(bcast, binary.BigEndian.Uint32(ip.To4())|^binary.BigEndian.Uint32(mask))
	resp.UpdateOption(dhcpv4.OptBroadcastAddress(bcast))
	if len(h.lease.DNS) > 0 {
		dns := make([]net.IP, len(h.lease.DNS))
		for i, d := range h.lease.DNS {
			dns[i] = net.IP(d.AsSlice())
		}
		resp.UpdateOption(dhcpv4.OptDNS(dns...))
	}
	if h.lease.Hostname != "" {
		resp.UpdateOption(dhcpv4.OptHostName(h.lease.Hostname))
	}
	if h.lease.MTU > 0 {
		resp.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionInterfaceMTU, binary.BigEndian.AppendUint16(nil, uint16(h.lease.MTU))))
	}
	return resp
}
