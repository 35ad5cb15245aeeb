package netsetup_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/vishvananda/netns"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/netsetup"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestMasqueradeGuest boots the test guest with a real launcher inside a pod-like network namespace
// wired by SetupMasquerade, with the launcher's DHCP server: the guest gets 10.0.2.2 over DHCP,
// reaches a server outside the namespace through the masquerade (seen there as the pod's address),
// and an HTTP request to the pod's address on port 80 reaches the guest's httpd. Teardown leaves
// only the namespace's own links and no nftables table.
// guestVM is the test guest booted by a real launcher whose QEMU runs inside a pod namespace,
// with the launcher's DHCP server serving it there.
type guestVM struct {
	l        *launcher.Launcher
	con      *testutil.Console
	dhcpDone <-chan error
	stopDHCP context.CancelFunc
	stopped  bool
}

// bootGuest starts the guest with one interface (binding set by the caller in iface) on tap and
// waits for its DHCP lease of want; tweaks change the VMI first.
func bootGuest(t *testing.T, p *podNS, iface v1alpha1.Interface, tap string, lease launcher.DHCPLease, dhcpIface string, tweaks ...func(*v1alpha1.VirtualMachineInstance)) *guestVM {
	t.Helper()
	guestDir, err := testutil.GuestDir()
	if err != nil {
		t.Fatal(err)
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal("qemu-system-x86_64 not found: install qemu-system-x86 (make deps)")
	}
	ipCmd, err := exec.LookPath("ip")
	if err != nil {
		t.Fatal("ip (iproute2) not found: the test runs QEMU through `ip netns exec`")
	}
	req, err := translate.LoadFile("../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	req.Spec.Domain.Firmware.KernelBoot.Container.Image = "file://" + guestDir
	iface.Name = "default"
	req.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{iface}
	req.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	for _, tweak := range tweaks {
		tweak(req)
	}
	// The node agent's part: the interface's host side is the tap netsetup made.
	queues := v1alpha1.NICQueues(&req.Spec.Domain, &req.Spec.Domain.Devices.Interfaces[0])
	m, err := translate.Machine(req, translate.Host{Emulation: true,
		NICs: map[string]machine.NIC{"default": {Tap: tap, MAC: lease.MAC.String(), Queues: queues}}})
	if err != nil {
		t.Fatal(err)
	}

	// The launcher's DHCP server, on a thread inside the namespace, as in a launcher pod.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dhcpDone := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		nsh, err := netns.GetFromPath(p.Path)
		if err != nil {
			dhcpDone <- err
			return
		}
		defer nsh.Close()
		if err := netns.Set(nsh); err != nil {
			dhcpDone <- err
			return
		}
		dhcpDone <- launcher.ServeDHCP(ctx, dhcpIface, lease)
	}()

	// QEMU runs inside the namespace so that it can open the tap by name.
	wrapper := filepath.Join(t.TempDir(), "qemu-in-netns")
	script := fmt.Sprintf("#!/bin/sh\nexec %s netns exec %s %s \"$@\"\n", ipCmd, p.Name, qemu)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("", "qvn-") // unix socket paths must stay under 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(runDir) })
	l := launcher.New(runDir, launcher.HostResolver{SpareRootPorts: 1}, launcher.Options{QEMU: wrapper, Log: testr.New(t)})
	if err := l.Sync(context.Background(), &protocol.SyncRequest{Machine: *m}); err != nil {
		t.Fatalf("sync: %v", err)
	}
	g := &guestVM{l: l, dhcpDone: dhcpDone, stopDHCP: cancel}
	t.Cleanup(func() {
		if !g.stopped {
			_ = l.Kill(context.Background())
			_, _ = l.Wait(context.Background())
		}
	})
	g.con = testutil.AttachConsole(t, filepath.Join(runDir, "serial.sock"))
	booted := time.Now()
	g.con.Expect(t, 0, "QVIRT-IP eth0 "+lease.IP.Addr().String()+"\r\n", 3*time.Minute)
	t.Logf("guest leased %s %.1fs after start", lease.IP.Addr(), time.Since(booted).Seconds())
	return g
}

// shutdown powers the guest off and stops the DHCP server.
func (g *guestVM) shutdown(t *testing.T) {
	t.Helper()
	grace := int64(30)
	exit, err := g.l.Shutdown(context.Background(), &grace)
	g.stopped = true
	if err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if exit.Reason != protocol.ExitGuestShutdown {
		t.Errorf("exit = %+v, want a guest shutdown", exit)
	}
	g.stopDHCP()
	select {
	case err := <-g.dhcpDone:
		if err != nil {
			t.Errorf("ServeDHCP: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("ServeDHCP did not return after its context ended")
	}
}

// outsideServer is an HTTP server on the host end of the pod network answering HELLO-FROM-OUTSIDE;
// it reports each request's remote address.
func outsideServer(t *testing.T, p *podNS) (net.Addr, <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(p.HostIP.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	remote := make(chan string, 10)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		remote <- r.RemoteAddr
		fmt.Fprintln(w, "HELLO-FROM-OUTSIDE")
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr(), remote
}

// checkOutbound has the guest fetch from the outside server, which must see it as from.
func checkOutbound(t *testing.T, g *guestVM, p *podNS, from netip.Addr) {
	t.Helper()
	addr, remote := outsideServer(t, p)
	at := len(g.con.Text())
	g.con.Send(t, fmt.Sprintf("wget -q -O - http://%s/", addr))
	g.con.Expect(t, at, "HELLO-FROM-OUTSIDE", time.Minute)
	select {
	case a := <-remote:
		host, _, _ := net.SplitHostPort(a)
		if host != from.String() {
			t.Errorf("outside server saw the guest as %s, want %s", host, from)
		}
	case <-time.After(5 * time.Second):
		t.Error("outside server got no request")
	}
}

// checkInbound fetches http://addr:80/ from the root namespace: the guest's httpd must answer.
func checkInbound(t *testing.T, addr netip.Addr) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	var body string
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := client.Get("http://" + net.JoinHostPort(addr.String(), "80") + "/")
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				body = string(b)
				break
			}
			err = fmt.Errorf("status %s, read error %v", resp.Status, rerr)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s port 80: %v", addr, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if strings.TrimSpace(body) != "testguest" {
		t.Errorf("%s port 80 served %q, want the guest's hostname testguest", addr, body)
	}
}

// TestMasqueradeGuest boots the test guest with a real launcher inside a pod-like network namespace
// wired by SetupMasquerade, with the launcher's DHCP server: the guest gets 10.0.2.2 over DHCP,
// reaches a server outside the namespace through the masquerade (seen there as the pod's address),
// and an HTTP request to the pod's address on port 80 reaches the guest's httpd. Teardown leaves
// only the namespace's own links and no nftables table.
func TestMasqueradeGuest(t *testing.T) {
	start := time.Now()
	p := newPodNS(t)
	linksBefore, tablesBefore := p.links(t), p.tables(t)
	id := randHex(t, 3)
	m := netsetup.Masquerade{TapName: "qvtap" + id, BridgeName: "qvbr" + id, TapOwner: 0}
	res, err := netsetup.SetupMasquerade(p.Path, m)
	if err != nil {
		t.Fatal(err)
	}
	tornDown := false
	t.Cleanup(func() {
		if !tornDown {
			_ = netsetup.TeardownMasquerade(p.Path, m)
		}
	})
	hw, err := net.ParseMAC(netsetup.StableMAC(randHex(t, 8), "default"))
	if err != nil {
		t.Fatal(err)
	}
	g := bootGuest(t, p, v1alpha1.Interface{Masquerade: &v1alpha1.InterfaceMasquerade{}}, res.TapName,
		launcher.DHCPLease{MAC: hw, IP: res.GuestIP, Gateway: res.GatewayIP, DNS: []netip.Addr{p.HostIP},
			Hostname: "testguest", MTU: res.MTU}, res.BridgeName)

	checkOutbound(t, g, p, p.PodIP) // masqueraded to the pod's address
	checkInbound(t, p.PodIP)        // DNAT from the pod's address
	g.shutdown(t)

	if err := netsetup.TeardownMasquerade(p.Path, m); err != nil {
		t.Fatalf("teardown: %v", err)
	}
	tornDown = true
	if got := p.links(t); !slices.Equal(got, linksBefore) {
		t.Errorf("links after teardown = %v, want %v as before setup", got, linksBefore)
	}
	if got := p.tables(t); !slices.Equal(got, tablesBefore) {
		t.Errorf("nftables tables after teardown = %v, want %v as before setup", got, tablesBefore)
	}
	t.Logf("whole test %.1fs", time.Since(start).Seconds())
}

// TestMasqueradeGuestMultiQueue: with networkInterfaceMultiqueue and two vCPUs, the masquerade
// binding's tap is a multi-queue one and the guest's virtio NIC has two queue pairs (rx-1 and tx-1
// in its sysfs), and traffic still flows both ways.
func TestMasqueradeGuestMultiQueue(t *testing.T) {
	p := newPodNS(t)
	id := randHex(t, 3)
	m := netsetup.Masquerade{TapName: "qvtap" + id, BridgeName: "qvbr" + id, TapOwner: 0, TapMultiQueue: true}
	res, err := netsetup.SetupMasquerade(p.Path, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netsetup.TeardownMasquerade(p.Path, m) })
	hw, err := net.ParseMAC(netsetup.StableMAC(randHex(t, 8), "default"))
	if err != nil {
		t.Fatal(err)
	}
	twoQueues := func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Domain.CPU = &v1alpha1.CPU{Cores: 2}
		v.Spec.Domain.Devices.NetworkInterfaceMultiQueue = ptr.To(true)
	}
	g := bootGuest(t, p, v1alpha1.Interface{Masquerade: &v1alpha1.InterfaceMasquerade{}}, res.TapName,
		launcher.DHCPLease{MAC: hw, IP: res.GuestIP, Gateway: res.GatewayIP, DNS: []netip.Addr{p.HostIP},
			Hostname: "testguest", MTU: res.MTU}, res.BridgeName, twoQueues)
	g.con.Run(t, "echo QUEUES $(ls /sys/class/net/eth0/queues/)", "QUEUES rx-0 rx-1 tx-0 tx-1", time.Minute)
	checkOutbound(t, g, p, p.PodIP)
	checkInbound(t, p.PodIP)
	g.shutdown(t)
}
