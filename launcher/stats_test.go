package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// TestStatsFollowTheGuest boots the test guest through a real launcher and reads GET /v1/stats
// while the guest computes, reads and writes its disk, and exchanges packets over a NIC whose tap
// lives in this test's network namespace (which is the launcher's: it runs in this process).
func TestStatsFollowTheGuest(t *testing.T) {
	t.Parallel()
	v, c := boot(t)
	ctx := context.Background()

	before := stats(t, v)
	if len(before.VCPUs) != 1 || before.VCPUs[0].ID != 0 || before.VCPUs[0].ThreadID <= 0 {
		t.Fatalf("vCPUs %+v, want one vCPU 0 with its thread", before.VCPUs)
	}
	// QEMU's own code and data alone are well above 16 MiB; the booted guest adds its RAM.
	if before.MemoryResidentBytes < 16<<20 {
		t.Fatalf("QEMU resident %d bytes, want > 16 MiB", before.MemoryResidentBytes)
	}
	if before.CPU.Total() < before.VCPUs[0].Time.Total() {
		t.Fatalf("process CPU %s below its vCPU's %s", before.CPU.Total(), before.VCPUs[0].Time.Total())
	}

	t.Run("vCPU time grows while the guest computes", func(t *testing.T) {
		c.Send(t, "while :; do :; done &")
		time.Sleep(3 * time.Second)
		c.Send(t, "kill $!")
		after := stats(t, v)
		grew := after.VCPUs[0].Time.Total() - before.VCPUs[0].Time.Total()
		t.Logf("vCPU 0: %s then %s (+%s in 3 s of busy loop)", before.VCPUs[0].Time.Total(), after.VCPUs[0].Time.Total(), grew)
		// Not 3 s: the vCPU thread shares two host cores with whatever else runs here.
		if grew < 300*time.Millisecond {
			t.Fatalf("vCPU time grew %s during a 3 s busy loop, want at least 300 ms", grew)
		}
		if after.PID != before.PID || after.CPU.Total() <= before.CPU.Total() {
			t.Fatalf("process CPU %s then %s (pid %d then %d)", before.CPU.Total(), after.CPU.Total(), before.PID, after.PID)
		}
	})

	t.Run("disk counters follow the guest's reads and writes", func(t *testing.T) {
		s0 := diskNamed(t, stats(t, v), "scratch")
		from := len(c.Text())
		c.Send(t, `dd if=/dev/vda of=/dev/null bs=4096 count=512 2>/dev/null; dd if=/dev/zero of=/dev/vda bs=4096 count=64 2>/dev/null; sync; echo "DD-DONE"`)
		c.Expect(t, from, "DD-DONE\r\n", time.Minute)
		s1 := diskNamed(t, stats(t, v), "scratch")
		t.Logf("scratch: %+v", s1)
		// The guest read 2 MiB from the start of the disk; its kernel may have cached the first
		// few KiB when it probed the partition table at boot.
		if s1.ReadBytes-s0.ReadBytes < 1<<20 || s1.ReadOps <= s0.ReadOps || s1.ReadTime <= s0.ReadTime {
			t.Errorf("reads %d bytes/%d ops then %d bytes/%d ops after reading 2 MiB", s0.ReadBytes, s0.ReadOps, s1.ReadBytes, s1.ReadOps)
		}
		if s1.WriteBytes-s0.WriteBytes < 256<<10 || s1.WriteOps <= s0.WriteOps || s1.WriteTime <= s0.WriteTime {
			t.Errorf("writes %d bytes/%d ops then %d bytes/%d ops after writing 256 KiB", s0.WriteBytes, s0.WriteOps, s1.WriteBytes, s1.WriteOps)
		}
	})

	t.Run("NIC counters are the guest's, mapped from its tap", func(t *testing.T) {
		tap := fmt.Sprintf("qvst%d", os.Getpid()%100000) // not nic_migration_test's qvs: both run in parallel
		// A /30 of our own on our own tap; removed with the tap.
		host, guest := "10.213.77.1", "10.213.77.2"
		run(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
		if err := v.client.HotplugNIC(ctx, machine.NIC{Name: "extra", Tap: tap, MAC: "02:00:00:aa:bb:01", Model: machine.NICVirtio}); err != nil {
			t.Fatalf("hotplug nic: %v", err)
		}
		run(t, "ip", "addr", "add", host+"/30", "dev", tap)
		run(t, "ip", "link", "set", tap, "up")
		from := len(c.Text())
		c.Send(t, `for i in $(seq 30); do [ -e /sys/class/net/eth0 ] && break; sleep 1; done; ip link set eth0 up; ip addr add `+guest+`/30 dev eth0; ping -c 3 -W 5 `+host+` >/dev/null && echo "PING-OK" || echo "PING-FAILED"`)
		// "\r\n" right after the marker: the echo of the command line has a quote there.
		c.Expect(t, from, "PING-OK\r\n", time.Minute)
		// Traffic one way only: datagrams to a closed port in the guest, which answers at most a
		// few rate-limited ICMP errors of at most 576 bytes each.
		conn, err := net.Dial("udp", guest+":9")
		if err != nil {
			t.Fatal(err)
		}
		payload := make([]byte, 1400)
		for range 20 {
			_, _ = conn.Write(payload)
		}
		_ = conn.Close()
		var nic protocol.InterfaceStats
		waitFor(t, 10*time.Second, "the datagrams in the guest's receive counters", func() bool {
			nic = interfaceNamed(t, stats(t, v), "extra")
			return nic.RxBytes > 20*1400
		})
		t.Logf("extra: %+v", nic)
		if nic.Tap != tap || !nic.Hotplugged {
			t.Fatalf("extra reported as %+v, want hotplugged on %s", nic, tap)
		}
		// Three echo requests out and three replies in, plus ARP; at least 98 bytes per echo.
		if nic.TxPackets < 4 || nic.RxPackets < 4+20 || nic.TxBytes < 3*98 {
			t.Fatalf("guest counters after 3 pings and 20 datagrams: %+v", nic)
		}
		// The directions are the guest's (the tap's swapped): the guest received the datagrams.
		if nic.RxBytes < nic.TxBytes+10*1400 {
			t.Fatalf("the guest received %d bytes and sent %d: directions swapped?", nic.RxBytes, nic.TxBytes)
		}
	})

	t.Run("no stats once QEMU is gone", func(t *testing.T) {
		if err := v.client.Kill(ctx); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "QEMU to exit", func() bool { st, _ := v.client.Status(ctx); return st.Exit != nil })
		_, err := v.client.Stats(ctx)
		var apiErr *launcher.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 409 {
			t.Fatalf("stats after exit: %v, want a 409", err)
		}
	})
}

func stats(t *testing.T, v *vm) protocol.Stats {
	t.Helper()
	st, err := v.client.Stats(context.Background())
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	return st
}

func diskNamed(t *testing.T, st protocol.Stats, name string) protocol.DiskStats {
	t.Helper()
	for _, d := range st.Disks {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("no disk %q in %+v", name, st.Disks)
	return protocol.DiskStats{}
}

func interfaceNamed(t *testing.T, st protocol.Stats, name string) protocol.InterfaceStats {
	t.Helper()
	for _, in := range st.Interfaces {
		if in.Name == name {
			return in
		}
	}
	t.Fatalf("no interface %q in %+v", name, st.Interfaces)
	return protocol.InterfaceStats{}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}
