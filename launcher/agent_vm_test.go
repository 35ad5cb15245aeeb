package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// TestGuestAgentReportsTheGuest boots the test guest, whose init starts qemu-ga on the
// org.qemu.guest_agent.0 port, with a NIC the launcher serves DHCP on: the launcher's status
// shows the agent connected, the guest's OS and its interface's IPv4 lease and IPv6 link-local
// address within seconds of boot; the agent's other queries answer; killing qemu-ga in the guest
// clears Connected, starting it again sets it.
func TestGuestAgentReportsTheGuest(t *testing.T) {
	ctx := context.Background()
	// Poll every second, without backing off, so that polls happen while the guest is frozen below.
	saved, savedMax := launcher.AgentPollInterval, launcher.AgentPollMax
	launcher.AgentPollInterval, launcher.AgentPollMax = time.Second, time.Second
	t.Cleanup(func() { launcher.AgentPollInterval, launcher.AgentPollMax = saved, savedMax })
	tap := fmt.Sprintf("qvga%d", os.Getpid()%100000)
	run(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
	run(t, "ip", "addr", "add", "10.213.81.1/30", "dev", tap)
	run(t, "ip", "link", "set", tap, "up")
	const mac = "02:00:00:aa:bb:81"
	req := guestSpec(t)
	if !req.Machine.GuestAgent {
		t.Fatal("the node agent's machine has no guest agent channel")
	}
	req.Machine.NICs = []machine.NIC{{Name: "default", Tap: tap, MAC: mac, Model: machine.NICVirtio, DHCP: &machine.DHCP{
		Interface: tap, IP: netip.MustParsePrefix("10.213.81.2/30"), Gateway: netip.MustParseAddr("10.213.81.1"),
		DNS: []netip.Addr{netip.MustParseAddr("10.213.81.1")}, Hostname: "agent-guest"}}}

	v := newLauncher(t)
	if _, err := v.client.Sync(ctx, req); err != nil {
		t.Fatalf("sync: %v", err)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	ready := time.Now()

	var st protocol.Status
	reported := func() bool {
		var err error
		if st, err = v.client.Status(ctx); err != nil || st.GuestAgent == nil {
			return false
		}
		ga := st.GuestAgent
		return ga.Connected && ga.OS != nil && len(ga.Interfaces) == 1 &&
			slices.Contains(ga.Interfaces[0].IPs, "10.213.81.2") && slices.ContainsFunc(ga.Interfaces[0].IPs, isLinkLocal6)
	}
	waitFor(t, time.Minute, "the guest agent to report the guest's OS and addresses", reported)
	t.Logf("guest agent report complete %v after QVIRT-GUEST-READY", time.Since(ready).Round(time.Millisecond))
	ga := st.GuestAgent
	if ga.OS.ID != "qvirt-test" || ga.OS.PrettyName != "qvirt test guest (busybox)" || !strings.HasPrefix(ga.OS.KernelRelease, "6.") ||
		ga.OS.Machine != "x86_64" || !strings.HasPrefix(ga.Version, "7.") {
		t.Errorf("agent %s, os %+v", ga.Version, *ga.OS)
	}
	if i := ga.Interfaces[0]; i.Name != "eth0" || i.MAC != mac {
		t.Errorf("interface %+v, want eth0 with MAC %s", i, mac)
	}

	// What the launcher reads when its watcher starts: QEMU's view of the agent's port.
	shell := dialWhenListening(t, launcher.Dir(v.runDir).ShellQMP())
	agentPortOpen := func() bool {
		devs, err := shell.QueryChardevs(ctx)
		if err != nil {
			t.Fatalf("query-chardev: %v", err)
		}
		for _, d := range devs {
			if d.Label == launcher.GuestAgentChardevID {
				return d.FrontendOpen
			}
		}
		t.Fatalf("query-chardev lists no %s: %+v", launcher.GuestAgentChardevID, devs)
		return false
	}
	if !agentPortOpen() {
		t.Error("query-chardev says the guest has the agent's port closed while its agent answers")
	}

	t.Run("guest info, users, filesystems and freeze answer", func(t *testing.T) {
		info, err := v.client.GuestInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Hostname != "testguest" || info.OS.ID != "qvirt-test" || !slices.Contains(info.SupportedCommands, "guest-get-osinfo") ||
			info.FSFreezeStatus != "thawed" {
			t.Errorf("guest info %+v", info)
		}
		if users, err := v.client.GuestUsers(ctx); err != nil || users == nil {
			t.Errorf("users %v: %v (want an empty list: nobody logs in through login(1))", users, err)
		}
		// A filesystem to list and freeze: the scratch disk (the initramfs is neither).
		from := len(c.Text())
		c.Send(t, `mke2fs -q /dev/vda && mount -t ext2 /dev/vda /mnt && echo "MOUNTED-$?"`)
		c.Expect(t, from, "MOUNTED-0\r\n", time.Minute)
		fss, err := v.client.GuestFilesystems(ctx)
		if err != nil {
			t.Fatalf("filesystems: %v", err)
		}
		i := slices.IndexFunc(fss, func(f protocol.GuestFilesystem) bool { return f.MountPoint == "/mnt" })
		if i < 0 || fss[i].FileSystemType != "ext2" || fss[i].TotalBytes < 10<<20 || len(fss[i].Disk) != 1 || fss[i].Disk[0].BusType != "virtio" {
			t.Errorf("filesystems %+v, want /mnt, ext2 of about 16 MiB on a virtio disk", fss)
		}
		fr, err := v.client.FSFreeze(ctx, "freeze")
		if err != nil || fr.Status != "frozen" || fr.Filesystems != 1 {
			t.Fatalf("freeze: %+v, %v", fr, err)
		}
		// The poll keeps going while frozen (the agent refuses most commands then).
		time.Sleep(3 * time.Second)
		if st, err := v.client.Status(ctx); err != nil || !st.GuestAgent.Connected || len(st.GuestAgent.Interfaces) != 1 {
			t.Errorf("while frozen: %v, %+v", err, st.GuestAgent)
		}
		fr, err = v.client.FSFreeze(ctx, "thaw")
		if err != nil || fr.Status != "thawed" || fr.Filesystems != 1 {
			t.Fatalf("thaw: %+v, %v", fr, err)
		}
	})

	t.Run("exec probes run their command in the guest", func(t *testing.T) {
		probe := func(timeout int32, cmd ...string) (protocol.GuestExecResult, error) {
			return v.client.GuestExecProbe(ctx, protocol.GuestExecProbe{Command: cmd, TimeoutSeconds: timeout})
		}
		start := time.Now()
		res, err := probe(5, "sh", "-c", "echo ok; test -e /proc/1")
		if err != nil || res.ExitCode != 0 || res.Output != "ok\n" {
			t.Errorf("passing command: %+v, %v", res, err)
		}
		t.Logf("a passing exec probe took %v", time.Since(start).Round(time.Millisecond))
		res, err = probe(5, "sh", "-c", "echo out; echo bad >&2; exit 3")
		if err != nil || res.ExitCode != 3 || res.Output != "out\nbad\n" {
			t.Errorf("failing command: %+v, %v (want exit code 3 and both streams)", res, err)
		}
		res, err = probe(5, "sh", "-c", "kill -9 $$")
		if err != nil || res.Signal != 9 {
			t.Errorf("killed command: %+v, %v (want signal 9)", res, err)
		}
		// The guest's output is cut at the launcher's bound, not passed on whole.
		res, err = probe(5, "sh", "-c", "yes | head -c 100000")
		if err != nil || res.ExitCode != 0 || len(res.Output) != 10<<10 || res.Output[:4] != "y\ny\n" {
			t.Errorf("long output: %d bytes, exit %d, %v (want the first 10 KiB)", len(res.Output), res.ExitCode, err)
		}
		_, err = probe(5, "/no/such/program")
		if err == nil || !strings.Contains(err.Error(), "guest-exec") {
			t.Errorf("a program the guest lacks: %v, want the agent's guest-exec error", err)
		}
		start = time.Now()
		_, err = probe(1, "sleep", "30")
		if err == nil || !strings.Contains(err.Error(), "did not exit within") || time.Since(start) > 3*time.Second {
			t.Errorf("a command over its timeout: %v after %v, want a timeout within about 1 s", err, time.Since(start))
		}
		// The agent stays connected and usable: the probe took the connection only per call.
		if err := v.client.GuestPing(ctx, 5*time.Second); err != nil {
			t.Errorf("ping after the probes: %v", err)
		}
		if st, err := v.client.Status(ctx); err != nil || !st.GuestAgent.Connected {
			t.Errorf("after the probes: %v, %+v", err, st.GuestAgent)
		}
	})

	t.Run("killing qemu-ga clears Connected, restarting it sets it", func(t *testing.T) {
		c.Send(t, "kill $(pidof qemu-ga)")
		killed := time.Now()
		waitFor(t, 30*time.Second, "Connected to clear", func() bool {
			st, err := v.client.Status(ctx)
			return err == nil && st.GuestAgent != nil && !st.GuestAgent.Connected
		})
		t.Logf("Connected cleared %v after the kill", time.Since(killed).Round(time.Millisecond))
		if agentPortOpen() {
			t.Error("query-chardev says the agent's port is open after qemu-ga closed it")
		}
		_, err := v.client.GuestInfo(ctx)
		var apiErr *launcher.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 409 {
			t.Errorf("guest info without an agent: %v, want a 409", err)
		}
		_, err = v.client.GuestExecProbe(ctx, protocol.GuestExecProbe{Command: []string{"true"}, TimeoutSeconds: 1})
		if !errors.As(err, &apiErr) || apiErr.Status != 409 || !strings.Contains(err.Error(), "not connected") {
			t.Errorf("exec probe without an agent: %v, want a 409 saying the agent is not connected", err)
		}
		c.Send(t, "qemu-ga -m virtio-serial -p /dev/$(basename $(dirname $(grep -l org.qemu.guest_agent.0 /sys/class/virtio-ports/*/name))) -t /run >/dev/null 2>&1 &")
		waitFor(t, 30*time.Second, "Connected again", func() bool {
			st, err := v.client.Status(ctx)
			return err == nil && st.GuestAgent != nil && st.GuestAgent.Connected
		})
	})
}

func isLinkLocal6(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6() && a.IsLinkLocalUnicast()
}

// TestAgentWatcherLeavesAClosedPortAlone: a guest that never opens the agent's port (firmware that
// halts, no qemu-ga) gets no connection from its launcher, however many poll intervals pass: an
// idle instance without an agent costs its launcher no wake-ups. (The launcher used to connect at
// every poll it did not skip, and wait agentCallTimeout on each connection for an answer.)
func TestAgentWatcherLeavesAClosedPortAlone(t *testing.T) {
	saved := launcher.AgentPollInterval
	launcher.AgentPollInterval = 200 * time.Millisecond
	t.Cleanup(func() { launcher.AgentPollInterval = saved })
	req := idleSpec(t)
	if !req.Machine.GuestAgent {
		t.Fatal("the idle machine has no guest agent channel")
	}
	v := newLauncher(t)
	ctx := context.Background()
	if _, err := v.client.Sync(ctx, req); err != nil {
		t.Fatalf("sync: %v", err)
	}
	shell := dialWhenListening(t, launcher.Dir(v.runDir).ShellQMP())
	// QEMU names a socket chardev with no client "disconnected:unix:...".
	for end := time.Now().Add(10 * launcher.AgentPollInterval); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		devs, err := shell.QueryChardevs(ctx)
		if err != nil {
			t.Fatalf("query-chardev: %v", err)
		}
		for _, d := range devs {
			if d.Label == launcher.GuestAgentChardevID && !strings.HasPrefix(d.Filename, "disconnected:") {
				t.Fatalf("the launcher connected to the agent's socket of a guest that never opened the port: %+v", d)
			}
		}
	}
	st, err := v.client.Status(ctx)
	if err != nil || st.GuestAgent == nil || st.GuestAgent.Connected {
		t.Errorf("status %v, %+v: want an agent reported as not connected", err, st.GuestAgent)
	}
}

// TestAgentPollsAfterAHotpluggedNIC: the watcher backs off while the agent reports nothing new,
// yet a hot-plugged NIC is in the agent's report within seconds, since the hotplug asks for polls
// at the short interval again. Without that, the next poll here comes about 31 s after the hotplug.
func TestAgentPollsAfterAHotpluggedNIC(t *testing.T) {
	saved, savedMax := launcher.AgentPollInterval, launcher.AgentPollMax
	launcher.AgentPollInterval, launcher.AgentPollMax = 250*time.Millisecond, time.Hour
	t.Cleanup(func() { launcher.AgentPollInterval, launcher.AgentPollMax = saved, savedMax })
	v, _ := boot(t)
	ctx := context.Background()
	waitFor(t, time.Minute, "the guest agent to connect", func() bool {
		st, err := v.client.Status(ctx)
		return err == nil && st.GuestAgent != nil && st.GuestAgent.Connected
	})
	// Polls 250 ms apart for 1.5 s, then 0.5, 1, 2, 4, 8, 16 and 32 s apart: 34 s on, the next
	// poll on its own is about 31 s away, well past the wait below.
	time.Sleep(34 * time.Second)
	tap := fmt.Sprintf("qvgh%d", os.Getpid()%100000)
	run(t, "ip", "tuntap", "add", "dev", tap, "mode", "tap")
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
	run(t, "ip", "link", "set", tap, "up")
	const mac = "02:00:00:aa:bb:83"
	if err := v.client.HotplugNIC(ctx, machine.NIC{Name: "hot", Tap: tap, MAC: mac, Model: machine.NICVirtio}); err != nil {
		t.Fatalf("hotplug nic: %v", err)
	}
	plugged := time.Now()
	waitFor(t, 11*time.Second, "the agent to report the hot-plugged NIC", func() bool {
		st, err := v.client.Status(ctx)
		return err == nil && st.GuestAgent != nil &&
			slices.ContainsFunc(st.GuestAgent.Interfaces, func(i protocol.GuestInterface) bool { return i.MAC == mac })
	})
	t.Logf("the agent reported the hot-plugged NIC %v after the hotplug", time.Since(plugged).Round(time.Millisecond))
}
