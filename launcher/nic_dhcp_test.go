package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
)

// TestHotpluggedNICGetsItsLease hot-plugs a NIC with DHCP into the running test guest, on a tap
// the test made in its own network namespace (the launcher's: it runs in this process), as the
// node agent does after setting up the host side: the guest's udhcpc gets the lease; unplugging
// closes the server's socket.
func TestHotpluggedNICGetsItsLease(t *testing.T) {
	t.Parallel()
	v, c := boot(t)
	ctx := context.Background()
	tap := fmt.Sprintf("qvh%d", os.Getpid()%100000)
	run(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
	run(t, "ip", "addr", "add", "10.213.79.1/30", "dev", tap)
	run(t, "ip", "link", "set", tap, "up")
	const mac = "02:00:00:aa:bb:02"
	nic := machine.NIC{Name: "hot", Tap: tap, MAC: mac, Model: machine.NICVirtio, DHCP: &machine.DHCP{
		Interface: tap, IP: netip.MustParsePrefix("10.213.79.2/30"), Gateway: netip.MustParseAddr("10.213.79.1"),
		DNS: []netip.Addr{netip.MustParseAddr("10.213.79.1")}, Hostname: "hot-guest"}}

	t.Run("a DHCP interface that cannot be served is refused before QEMU sees the NIC", func(t *testing.T) {
		bad := nic
		bad.DHCP = &machine.DHCP{Interface: "qvnosuch0", IP: nic.DHCP.IP, Gateway: nic.DHCP.Gateway}
		err := v.client.HotplugNIC(ctx, bad)
		var apiErr *launcher.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != "dhcp.interface" {
			t.Fatalf("hotplug with DHCP on a missing interface: %v, want a 400 naming dhcp.interface", err)
		}
		if hotNICs(t, v) != 0 {
			t.Fatal("a refused NIC is listed in the status")
		}
	})

	t.Run("the guest gets the hot-plugged NIC's lease", func(t *testing.T) {
		if err := v.client.HotplugNIC(ctx, nic); err != nil {
			t.Fatalf("hotplug nic: %v", err)
		}
		if hotNICs(t, v) != 1 {
			t.Fatal("the status does not list the NIC as hot-plugged")
		}
		// udhcpc runs at boot on the interfaces the guest had then; start it on the new one the
		// same way (the same event script prints QVIRT-IP).
		from := len(c.Text())
		c.Send(t, `for i in $(seq 30); do [ -e /sys/class/net/eth0 ] && break; sleep 1; done; ip link set eth0 up; `+
			`udhcpc -f -q -n -i eth0 -s /etc/udhcpc.script -T 2 -t 15 >/var/log/udhcpc.hot.log 2>&1; echo "UDHCPC-DONE-$?"`)
		c.Expect(t, from, "QVIRT-IP eth0 10.213.79.2", time.Minute)
		c.Expect(t, from, "UDHCPC-DONE-0\r\n", time.Minute)
		from = len(c.Text())
		c.Send(t, `ping -c 1 -W 5 10.213.79.1 >/dev/null && echo "GW-OK" || echo "GW-FAILED"`)
		c.Expect(t, from, "GW-OK\r\n", time.Minute)
	})

	t.Run("unplug stops the DHCP server", func(t *testing.T) {
		// While it serves, port 67 on the tap is taken (a socket without SO_REUSEPORT cannot bind).
		if l, err := bindDHCPPort(tap); err == nil {
			_ = l.Close()
			t.Fatal("bound port 67 on the tap while the NIC's DHCP server runs: the check below proves nothing")
		}
		if err := v.client.UnplugNIC(ctx, "hot"); err != nil {
			t.Fatalf("unplug nic: %v", err)
		}
		l, err := bindDHCPPort(tap)
		if err != nil {
			t.Fatalf("port 67 on %s still taken after unplug: %v", tap, err)
		}
		_ = l.Close()
		if hotNICs(t, v) != 0 {
			t.Fatal("the status still lists the unplugged NIC")
		}
	})

	t.Run("the same NIC can be plugged again, with its DHCP server", func(t *testing.T) {
		if err := v.client.HotplugNIC(ctx, nic); err != nil {
			t.Fatalf("second hotplug: %v", err)
		}
		if l, err := bindDHCPPort(tap); err == nil {
			_ = l.Close()
			t.Fatal("no DHCP server on the tap after the second hotplug")
		}
	})

	t.Run("QEMU's exit stops the DHCP server", func(t *testing.T) {
		if err := v.client.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "port 67 on the tap to be free", func() bool {
			l, err := bindDHCPPort(tap)
			if err == nil {
				_ = l.Close()
			}
			return err == nil
		})
	})
}

// hotNICs counts the NICs the launcher's status reports as hot-plugged.
func hotNICs(t *testing.T, v *vm) int {
	t.Helper()
	st, err := v.client.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, nic := range st.NICs {
		if nic.Hotplugged {
			n++
		}
	}
	return n
}

// bindDHCPPort binds UDP 0.0.0.0:67 on iface as a DHCP server would, but without SO_REUSEADDR or
// SO_REUSEPORT, so it fails while another socket is bound there.
func bindDHCPPort(iface string) (net.PacketConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = syscall.BindToDevice(int(fd), iface) }); err != nil {
			return err
		}
		return serr
	}}
	return lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:67")
}
