package netsetup_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/qvirt/qvirt/netsetup"
	"github.com/qvirt/qvirt/test/podnet"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests need root: they make real network namespaces, named qvt-<random>, with a veth pair
// standing in for the pod network, and remove exactly those again.

// podNS is a pod-like network namespace (test/podnet).
type podNS struct{ *podnet.NS }

func newPodNS(t *testing.T) *podNS { return &podNS{podnet.New(t)} }

func randHex(t *testing.T, n int) string { return podnet.RandHex(t, n) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func (p *podNS) handle(t *testing.T) *netlink.Handle {
	t.Helper()
	nsh, err := netns.GetFromPath(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// links are the names of the namespace's links.
func (p *podNS) links(t *testing.T) []string {
	t.Helper()
	links, err := p.handle(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

// tables are the namespace's nftables tables, as "family name".
func (p *podNS) tables(t *testing.T) []string {
	t.Helper()
	nsh, err := netns.GetFromPath(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(nsh)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, fmt.Sprintf("%d %s", tb.Family, tb.Name))
	}
	return names
}

// rules counts the rules per chain of the qvirt table.
func (p *podNS) rules(t *testing.T) map[string]int {
	t.Helper()
	nsh, err := netns.GetFromPath(p.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(nsh)))
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, ch := range chains {
		if ch.Table.Name != netsetup.TableName {
			continue
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			t.Fatal(err)
		}
		n[ch.Name] = len(rules)
	}
	return n
}

// sysctl reads a /proc/sys file inside the namespace (they are per network namespace).
func (p *podNS) sysctl(t *testing.T, name string) string {
	t.Helper()
	type result struct {
		v   string
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		nsh, err := netns.GetFromPath(p.Path)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer nsh.Close()
		if err := netns.Set(nsh); err != nil {
			ch <- result{err: err}
			return
		}
		b, err := os.ReadFile(filepath.Join("/proc/sys", name))
		ch <- result{strings.TrimSpace(string(b)), err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.v
}

func TestMasqueradeSetupTeardown(t *testing.T) {
	testutil.LockHostNetwork(t)
	p := newPodNS(t)
	hostForward, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	id := randHex(t, 3)
	m := netsetup.Masquerade{TapName: "qvtap" + id, BridgeName: "qvbr" + id, TapOwner: 4242, TapGroup: 4243,
		Ports: []netsetup.Port{{Port: 80}, {Protocol: "UDP", Port: 53}}}
	res, err := netsetup.SetupMasquerade(p.Path, m)
	if err != nil {
		t.Fatal(err)
	}
	want := netsetup.Result{GuestIP: netip.MustParsePrefix("10.0.2.2/24"), GatewayIP: netip.MustParseAddr("10.0.2.1"),
		PodIP: p.PodIP, PodInterface: "eth0", BridgeName: m.BridgeName, TapName: m.TapName, MTU: 1500}
	if *res != want {
		t.Errorf("result = %+v, want %+v", *res, want)
	}

	h := p.handle(t)
	br, err := h.LinkByName(m.BridgeName)
	if err != nil {
		t.Fatal(err)
	}
	if br.Type() != "bridge" || br.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("bridge: type %s flags %v", br.Type(), br.Attrs().Flags)
	}
	addrs, err := h.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.0.2.1/24" {
		t.Errorf("bridge addresses = %v, want 10.0.2.1/24", addrs)
	}
	link, err := h.LinkByName(m.TapName)
	if err != nil {
		t.Fatal(err)
	}
	tap, ok := link.(*netlink.Tuntap)
	switch {
	case !ok:
		t.Errorf("%s is a %s, want a tap", m.TapName, link.Type())
	case tap.Mode != netlink.TUNTAP_MODE_TAP || tap.Owner != 4242 || tap.Group != 4243 || tap.NonPersist || tap.Flags&netlink.TUNTAP_MULTI_QUEUE != 0:
		t.Errorf("tap: mode %v owner %d non-persistent %v flags %#x; want a persistent single-queue tap owned by 4242:4243",
			tap.Mode, tap.Owner, tap.NonPersist, tap.Flags)
	case tap.Attrs().MasterIndex != br.Attrs().Index:
		t.Errorf("tap master index %d, want the bridge's %d", tap.Attrs().MasterIndex, br.Attrs().Index)
	}
	if v := p.sysctl(t, "net/ipv4/ip_forward"); v != "1" {
		t.Errorf("ip_forward in the namespace = %s, want 1", v)
	}
	// The unprivileged launcher binds the DHCP server port there.
	if v := p.sysctl(t, "net/ipv4/ip_unprivileged_port_start"); v != "67" {
		t.Errorf("ip_unprivileged_port_start in the namespace = %s, want 67", v)
	}
	if got := p.tables(t); !slices.Equal(got, []string{fmt.Sprintf("%d %s", nftables.TableFamilyIPv4, netsetup.TableName)}) {
		t.Errorf("nftables tables = %v, want only ip qvirt", got)
	}
	// One DNAT per port in prerouting and output, one masquerade.
	if got, want := p.rules(t), map[string]int{"prerouting": 2, "output": 2, "postrouting": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("rules per chain = %v, want %v", got, want)
	}

	// Setup again (a restarted node agent) reuses the links and replaces the table.
	m.Ports = nil
	m.PodPorts = []netsetup.Port{{Port: 49152}}
	if _, err := netsetup.SetupMasquerade(p.Path, m); err != nil {
		t.Fatalf("second setup: %v", err)
	}
	if got, want := p.rules(t), map[string]int{"prerouting": 3, "output": 0, "postrouting": 1}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("rules per chain after the second setup = %v, want %v", got, want)
	}
	// A tap of another owner is not silently reused, and the failed setup leaves the working
	// binding alone.
	other := m
	other.TapOwner = 1
	if _, err := netsetup.SetupMasquerade(p.Path, other); err == nil {
		t.Error("setup with another tap owner succeeded")
	}
	if _, err := p.handle(t).LinkByName(m.TapName); err != nil {
		t.Errorf("a failed setup removed the existing tap: %v", err)
	}

	for i := range 2 { // idempotent
		if err := netsetup.TeardownMasquerade(p.Path, m); err != nil {
			t.Fatalf("teardown %d: %v", i, err)
		}
	}
	if got := p.links(t); !slices.Equal(got, []string{"eth0", "lo"}) {
		t.Errorf("links after teardown = %v, want eth0 and lo", got)
	}
	if got := p.tables(t); len(got) != 0 {
		t.Errorf("nftables tables after teardown = %v", got)
	}
	if after, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); string(after) != string(hostForward) {
		t.Errorf("the root namespace's ip_forward changed from %q to %q", hostForward, after)
	}
	if err := netsetup.TeardownMasquerade("/var/run/netns/qvt-does-not-exist", m); err != nil {
		t.Errorf("teardown in a missing namespace: %v", err)
	}
}

func TestMasqueradeErrors(t *testing.T) {
	p := newPodNS(t)
	for name, m := range map[string]netsetup.Masquerade{
		"ipv6 cidr":      {VMCIDR: netip.MustParsePrefix("fd00::/64")},
		"tiny cidr":      {VMCIDR: netip.MustParsePrefix("10.0.2.0/31")},
		"bad protocol":   {Ports: []netsetup.Port{{Protocol: "SCTP", Port: 1}}},
		"bad port":       {Ports: []netsetup.Port{{Port: 70000}}},
		"long name":      {TapName: "a-very-long-tap-name"},
		"same names":     {TapName: "x", BridgeName: "x"},
		"bridge is eth0": {BridgeName: "eth0", TapName: "qvtap" + randHex(t, 3)},
	} {
		if _, err := netsetup.SetupMasquerade(p.Path, m); err == nil {
			t.Errorf("%s: setup succeeded", name)
		}
	}
	if got := p.links(t); !slices.Equal(got, []string{"eth0", "lo"}) {
		t.Errorf("links after failed setups = %v, want eth0 and lo", got)
	}
	if got := p.tables(t); len(got) != 0 {
		t.Errorf("nftables tables after failed setups = %v", got)
	}
	if _, err := netsetup.SetupMasquerade("/var/run/netns/qvt-does-not-exist", netsetup.Masquerade{}); err == nil {
		t.Error("setup in a missing namespace succeeded")
	}
}

func TestMasqueradeNoDefaultRoute(t *testing.T) {
	p := newPodNS(t)
	h := p.handle(t)
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if ones, _ := dstMask(r); ones == 0 {
			must(t, h.RouteDel(&r))
		}
	}
	_, err = netsetup.SetupMasquerade(p.Path, netsetup.Masquerade{BridgeName: "qvbr" + randHex(t, 3), TapName: "qvtap" + randHex(t, 3)})
	if err == nil || !strings.Contains(err.Error(), "default route") {
		t.Errorf("setup without a default route: err = %v", err)
	}
}

// dstMask is the prefix length of a route's destination; 0 for a default route.
func dstMask(r netlink.Route) (int, int) {
	if r.Dst == nil {
		return 0, 32
	}
	return r.Dst.Mask.Size()
}

var macRE = regexp.MustCompile(`^02(:[0-9a-f]{2}){5}$`)

func TestStableMAC(t *testing.T) {
	a := netsetup.StableMAC("6f1c2e7a-0000-4000-8000-000000000001", "default")
	if !macRE.MatchString(a) {
		t.Errorf("StableMAC = %q, want 02:xx:xx:xx:xx:xx", a)
	}
	if b := netsetup.StableMAC("6f1c2e7a-0000-4000-8000-000000000001", "default"); a != b {
		t.Errorf("not stable: %s then %s", a, b)
	}
	for _, other := range []string{
		netsetup.StableMAC("6f1c2e7a-0000-4000-8000-000000000001", "second"),
		netsetup.StableMAC("6f1c2e7a-0000-4000-8000-000000000002", "default"),
	} {
		if other == a {
			t.Errorf("two interfaces share %s", a)
		}
	}
	hw, err := net.ParseMAC(a)
	if err != nil {
		t.Fatal(err)
	}
	if hw[0]&1 != 0 || hw[0]&2 == 0 {
		t.Errorf("%s is not a locally administered unicast address", a)
	}
}

func TestResolvConfDNS(t *testing.T) {
	f := filepath.Join(t.TempDir(), "resolv.conf")
	must(t, os.WriteFile(f, []byte("# comment\nsearch default.svc.cluster.local\nnameserver 10.96.0.10\nnameserver 127.0.0.53\nnameserver fd00::10\nnameserver 1.1.1.1\noptions ndots:5\n"), 0o644))
	got, err := netsetup.ResolvConfDNS(f)
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("1.1.1.1")}; !slices.Equal(got, want) {
		t.Errorf("DNS = %v, want %v", got, want)
	}
	if _, err := netsetup.ResolvConfDNS(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v", err)
	}
}
