package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// TestMigrationKeepsAHotpluggedNIC hot-plugs a disk and then a NIC into the running test guest
// (so the NIC sits on the second spare root port), migrates the guest to a second launcher that is
// given the NIC placed on the source's port with a tap and DHCP lease of its own (as the node agent
// sets up the target pod), and checks on the target that the guest kept the NIC, its MAC and its
// uptime, that the NIC is wired to the target's tap, and that it is still a hot-plugged NIC.
// Before placed NICs existed, the target started the NIC as a cold-plugged interface and QEMU
// refused the stream ("Unknown ramblock 0000:00:02.2:00.0/virtio-net-pci.rom").
func TestMigrationKeepsAHotpluggedNIC(t *testing.T) {
	t.Parallel()
	src, srcConsole := boot(t)
	ctx := context.Background()
	// Taps of our own in this process's network namespace (the launchers run here), one per side:
	// each launcher pod has its own.
	srcTap := fmt.Sprintf("qvs%d", os.Getpid()%100000)
	dstTap := fmt.Sprintf("qvm%d", os.Getpid()%100000)
	for _, tap := range []string{srcTap, dstTap} {
		run(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
	}
	run(t, "ip", "addr", "add", "10.213.80.1/30", "dev", dstTap)
	run(t, "ip", "link", "set", dstTap, "up")

	img := filepath.Join(src.runDir, "hot.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", img, "32M")
	if _, err := src.client.HotplugDisk(ctx, fileDisk("hot", img, "qcow2")); err != nil {
		t.Fatal(err)
	}
	const mac = "02:00:00:aa:bb:03"
	if err := src.client.HotplugNIC(ctx, machine.NIC{Name: "extra", Tap: srcTap, MAC: mac, Model: machine.NICVirtio}); err != nil {
		t.Fatal(err)
	}
	from := len(srcConsole.Text())
	srcConsole.Send(t, `for i in $(seq 30); do [ -e /sys/class/net/eth0 ] && break; sleep 1; done; echo "NIC-$(cat /sys/class/net/eth0/address)"`)
	srcConsole.Expect(t, from, "NIC-"+mac, time.Minute)
	srcConsole.Send(t, "tick 100000 &")
	srcConsole.Expect(t, 0, "tick 3", time.Minute)
	srcStatus, err := src.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	srcNIC := nicNamed(t, srcStatus, "extra")
	if !srcNIC.Hotplugged || srcNIC.Port != launcher.HotplugPortID(1) {
		t.Fatalf("source reports the NIC as %+v, want hot-plugged on %s (the disk took %s)", srcNIC, launcher.HotplugPortID(1), launcher.HotplugPortID(0))
	}

	dst := newLauncher(t)
	nic := machine.NIC{Port: srcNIC.Port, Name: "extra", Tap: dstTap, MAC: srcNIC.MAC, Model: machine.NICVirtio,
		DHCP: &machine.DHCP{Interface: dstTap, IP: netip.MustParsePrefix("10.213.80.2/30"), Gateway: netip.MustParseAddr("10.213.80.1")}}
	target := func(mutate func(*machine.NIC)) *protocol.SyncRequest {
		req := guestSpec(t)
		req.Machine.UID, req.Incoming = srcStatus.UID, true
		req.Machine.Disks = append(req.Machine.Disks, srcStatus.Hotplugged...)
		n := nic
		if mutate != nil {
			mutate(&n)
		}
		req.Machine.NICs = []machine.NIC{n}
		return req
	}

	t.Run("a bad placed NIC is refused with its field named", func(t *testing.T) {
		// A launcher of its own: the last case fails in the argv builder, after the Sync was taken.
		bad := newLauncher(t)
		for _, tc := range []struct {
			field  string
			mutate func(*machine.NIC)
		}{
			{"machine.nics[0].mac", func(n *machine.NIC) { n.MAC = "02:00:00" }},
			{"machine.nics[0].dhcp.interface", func(n *machine.NIC) {
				n.DHCP = &machine.DHCP{Interface: "qvnosuch0", IP: nic.DHCP.IP, Gateway: nic.DHCP.Gateway}
			}},
			{"machine.nics[0].port", func(n *machine.NIC) { n.Model = machine.NICE1000 }},         // a conventional PCI NIC cannot sit on a root port
			{"machine.nics[0].port", func(n *machine.NIC) { n.Port = launcher.HotplugPortID(0) }}, // the disk's
		} {
			_, err := bad.client.Sync(ctx, target(tc.mutate))
			var apiErr *launcher.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != tc.field {
				t.Errorf("want a 400 naming %s, got %v (field %q)", tc.field, err, fieldOf(apiErr))
			}
		}
		// The refused Syncs left no DHCP server behind on the target's tap.
		if l, err := bindDHCPPort(dstTap); err != nil {
			t.Errorf("port 67 on %s is taken after the refused Syncs: %v", dstTap, err)
		} else {
			_ = l.Close()
		}
	})

	if st, err := dst.client.Sync(ctx, target(nil)); err != nil || st.Phase != protocol.PhaseIncoming {
		t.Fatalf("sync target: %v (phase %s)", err, st.Phase)
	}
	dstConsole := attach(t, dst.runDir)
	beforeSwitch := migrate(t, src, dst, srcConsole)
	waitFor(t, 2*time.Minute, "the source to exit or the migration to fail", func() bool {
		st, err := src.client.Status(ctx)
		return err == nil && (st.Exit != nil || st.Migration != nil && st.Migration.Status == "failed")
	})
	if st, _ := src.client.Status(ctx); st.Exit == nil || st.Exit.Reason != protocol.ExitMigrated {
		dstSt, _ := dst.client.Status(ctx)
		t.Fatalf("source ended %+v, migration %+v; want migrated. Target: %+v", st.Exit, st.Migration, dstSt.Exit)
	}
	waitFor(t, 30*time.Second, "the target to run", func() bool {
		st, err := dst.client.Status(ctx)
		return err == nil && st.Phase == protocol.PhaseRunning && st.RunState == "running"
	})

	t.Run("the guest keeps running with the NIC and its MAC", func(t *testing.T) {
		dstConsole.Expect(t, 0, "tick ", time.Minute)
		waitFor(t, time.Minute, "the counter to go on past the switch", func() bool { return dstConsole.LastTick() > beforeSwitch+1 })
		from := len(dstConsole.Text())
		// The command line's echo holds no MAC: only the guest's answer can match.
		dstConsole.Send(t, `echo "MACS: $(cat /sys/class/net/*/address | tr '\n' ' ')"`)
		dstConsole.Expect(t, from, mac, time.Minute)
		if strings.Contains(dstConsole.Text(), "QVIRT-GUEST-READY") {
			t.Fatalf("the guest rebooted on the target:\n%s", dstConsole.Text())
		}
		st, _ := dst.client.Status(ctx)
		if got := nicNamed(t, st, "extra"); got != srcNIC {
			t.Fatalf("target reports the NIC as %+v, want %+v as on the source", got, srcNIC)
		}
	})

	t.Run("the NIC is wired to the target's tap and gets the target's lease", func(t *testing.T) {
		from := len(dstConsole.Text())
		dstConsole.Send(t, `ip link set eth0 up; udhcpc -f -q -n -i eth0 -s /etc/udhcpc.script -T 2 -t 15 >/var/log/udhcpc.mig.log 2>&1; echo "UDHCPC-DONE-$?"`)
		dstConsole.Expect(t, from, "QVIRT-IP eth0 10.213.80.2", time.Minute)
		dstConsole.Expect(t, from, "UDHCPC-DONE-0\r\n", time.Minute)
		from = len(dstConsole.Text())
		dstConsole.Send(t, `ping -c 1 -W 5 10.213.80.1 >/dev/null && echo "GW-OK" || echo "GW-FAILED"`)
		dstConsole.Expect(t, from, "GW-OK\r\n", time.Minute)
	})

	t.Run("the NIC can still be unplugged on the target", func(t *testing.T) {
		if err := dst.client.UnplugNIC(ctx, "extra"); err != nil {
			t.Fatalf("unplug nic: %v", err)
		}
		from := len(dstConsole.Text())
		dstConsole.Send(t, `echo "NICGONE-$(ls /sys/class/net | grep -c eth)"`)
		dstConsole.Expect(t, from, "NICGONE-0", time.Minute)
	})
	t.Logf("tick %d before the switch, %d on the target", beforeSwitch, dstConsole.LastTick())
}

func nicNamed(t *testing.T, st protocol.Status, name string) protocol.NICStatus {
	t.Helper()
	for _, n := range st.NICs {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("no NIC %q in the status: %+v", name, st.NICs)
	return protocol.NICStatus{}
}

func fieldOf(e *launcher.APIError) string {
	if e == nil {
		return ""
	}
	return e.Field
}
