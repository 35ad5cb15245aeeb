package netsetup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// A secondary network's bridge binding makes the pod interface a port of a bridge that holds
// BridgeServerIP, for the DHCP server. Without more, the pod's own network stack would be
// reachable from the whole secondary network: a peer there could reach the launcher pod's
// sockets, answer or spoof its ARP, and, with the masquerade binding's ip_forward, route through
// the pod to the guest's private address or out of eth0 as this pod. isolateSecondary closes that
// (inside the pod's namespace, which is the caller's):
//   - frames from the pod interface never reach the pod's stack: a bridge-family input rule drops
//     them (forwarded frames, between the pod interface and the guest's tap, are not input and
//     pass);
//   - the bridge forwards no IPv4 packet it receives (conf/<bridge>/forwarding = 0), so the guest
//     cannot route through the pod either.

// secondaryTable is the bridge-family nftables table of a secondary binding's bridge.
func secondaryTable(bridge string) *nftables.Table {
	return &nftables.Table{Name: "qvirt-" + bridge, Family: nftables.TableFamilyBridge}
}

func isolateSecondary(bridge, podIf string) error {
	path := filepath.Join("/proc/sys/net/ipv4/conf", bridge, "forwarding")
	if err := os.WriteFile(path, []byte("0"), 0o644); err != nil {
		return fmt.Errorf("turn forwarding off on %s: %w", bridge, err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := secondaryTable(bridge)
	c.DelTable(t) // whatever an earlier setup left; an error for a missing table is flushed below
	_ = c.Flush()
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: t, Chain: ch,
		Exprs: append(ifname(expr.MetaKeyIIFNAME, expr.CmpOpEq, podIf), &expr.Verdict{Kind: expr.VerdictDrop})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables table %s: %w", t.Name, err)
	}
	return nil
}

// removeSecondaryTable removes isolateSecondary's table; a missing one is no error.
func removeSecondaryTable(bridge string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyBridge)
	if err != nil {
		return fmt.Errorf("list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == secondaryTable(bridge).Name {
			c.DelTable(t)
			return errors.Join(c.Flush())
		}
	}
	return nil
}
