package netsetup

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TableName is the nftables table (family ip) holding every rule netsetup makes in a pod.
const TableName = "qvirt"

// rule is one rule of a chain of the qvirt table.
type rule struct {
	chain string
	exprs []expr.Any
}

var (
	natChains = []struct {
		name     string
		hook     *nftables.ChainHook
		priority *nftables.ChainPriority
	}{
		{"prerouting", nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest},
		{"output", nftables.ChainHookOutput, nftables.ChainPriorityNATDest},
		{"postrouting", nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource},
	}
	table = &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
)

func (p Port) proto() (byte, error) {
	switch p.Protocol {
	case "", "TCP":
		return unix.IPPROTO_TCP, nil
	case "UDP":
		return unix.IPPROTO_UDP, nil
	}
	return 0, fmt.Errorf("protocol %q: want TCP or UDP", p.Protocol)
}

// natRules are the masquerade binding's rules (see the package documentation). Ports were
// validated by withDefaults.
func natRules(m Masquerade, podIface string, podIP netip.Addr) []rule {
	guest := m.guest().AsSlice()
	dnat := func(extra ...expr.Any) []expr.Any {
		return append(extra,
			&expr.Immediate{Register: 1, Data: guest},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1})
	}
	inbound := func(proto byte, port int32) []expr.Any {
		e := append(ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, podIface), daddr(podIP)...)
		e = append(e, l4proto(proto)...)
		if port != 0 {
			e = append(e, dport(port)...)
		}
		return e
	}
	var rules []rule
	if len(m.Ports) == 0 {
		for _, p := range m.PodPorts {
			proto, _ := p.proto()
			rules = append(rules, rule{"prerouting", append(inbound(proto, p.Port), &expr.Verdict{Kind: expr.VerdictAccept})})
		}
		for _, proto := range []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
			rules = append(rules, rule{"prerouting", dnat(inbound(proto, 0)...)})
		}
	}
	for _, p := range m.Ports {
		proto, _ := p.proto()
		rules = append(rules, rule{"prerouting", dnat(inbound(proto, p.Port)...)})
		local := append(daddr(podIP), l4proto(proto)...)
		rules = append(rules, rule{"output", dnat(append(local, dport(p.Port)...)...)})
	}
	// Masquerade what the guest sends out of the pod (not what stays on the guest network).
	rules = append(rules, rule{"postrouting", append(saddrIn(m.VMCIDR),
		append(ifname(expr.MetaKeyOIFNAME, expr.CmpOpNeq, m.BridgeName), &expr.Masq{})...)})
	return rules
}

func ifname(key expr.MetaKey, op expr.CmpOp, name string) []expr.Any {
	data := make([]byte, unix.IFNAMSIZ)
	copy(data, name)
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data}}
}

func daddr(ip netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ip.AsSlice()},
	}
}

func saddrIn(p netip.Prefix) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func dport(port int32) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, uint16(port))},
	}
}

func nftConn(netNS ns.NetNS) (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(netNS.Fd())))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return c, nil
}

func tableExists(c *nftables.Conn) (bool, error) {
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("nftables: list tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == TableName {
			return true, nil
		}
	}
	return false, nil
}

// replaceTable replaces the qvirt table with one holding rules, in one transaction: the pod never
// sees a half-built rule set.
func replaceTable(netNS ns.NetNS, rules []rule) error {
	c, err := nftConn(netNS)
	if err != nil {
		return err
	}
	exists, err := tableExists(c)
	if err != nil {
		return err
	}
	if exists {
		c.DelTable(table)
	}
	t := c.AddTable(table)
	chains := map[string]*nftables.Chain{}
	for _, ch := range natChains {
		chains[ch.name] = c.AddChain(&nftables.Chain{Name: ch.name, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: ch.hook, Priority: ch.priority})
	}
	for _, r := range rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: chains[r.chain], Exprs: r.exprs})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: install table %s: %w", TableName, err)
	}
	return nil
}

func deleteTable(netNS ns.NetNS) error {
	c, err := nftConn(netNS)
	if err != nil {
		return err
	}
	exists, err := tableExists(c)
	if err != nil || !exists {
		return err
	}
	c.DelTable(table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: delete table %s: %w", TableName, err)
	}
	return nil
}
