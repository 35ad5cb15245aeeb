package launcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests boot the real test guest (test/guest/build.sh) under TCG with the real QEMU and talk
// to the launcher through its real command socket. They need qemu-system-x86_64 and fail, not
// skip, without it: `make test` installs it.
//
// Tests that boot a guest run two at a time (t.Parallel): a TCG guest keeps one of the machine's
// 2 cores busy, so two at once nearly halve the package's time. A test that changes a package
// variable (AgentPollInterval) stays serial: serial tests run before the parallel ones start.

var guestDir string

func TestMain(m *testing.M) {
	out, err := exec.Command("../test/guest/build.sh").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build the test guest with test/guest/build.sh: %v\n", err)
		os.Exit(1)
	}
	guestDir = strings.TrimSpace(string(out))
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		fmt.Fprintln(os.Stderr, "qemu-system-x86_64 not found: install qemu-system-x86 (make deps)")
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// guestVMI is the test guest with one scratch virtio disk (so a hotplugged disk is /dev/vdb).
func guestVMI(t testing.TB) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	vmi, err := translate.LoadFile("../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	vmi.Spec.Domain.Firmware.KernelBoot.Container.Image = "file://" + guestDir
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "scratch", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{
		EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("16Mi")}}}}
	return vmi
}

// guestSpec is the node agent's request to start guestVMI under emulation.
func guestSpec(t testing.TB) *protocol.SyncRequest { return testutil.SyncRequest(t, guestVMI(t), nil) }

// guestMachineFile writes the test guest's machine description, as `qvirtctl machine --emulation
// -f test/guest/vmi.yaml` prints it, for `qvirt-launcher run`, with extraArgs appended to the
// guest kernel's command line.
func guestMachineFile(t testing.TB, extraArgs ...string) string {
	t.Helper()
	vmi, err := translate.LoadFile("../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	kb := vmi.Spec.Domain.Firmware.KernelBoot
	kb.Container.Image = "file://" + guestDir
	kb.KernelArgs = strings.Join(append([]string{kb.KernelArgs}, extraArgs...), " ")
	m, err := translate.Machine(vmi, translate.Host{Emulation: true})
	if err != nil {
		t.Fatal(err)
	}
	desc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "vm.json")
	if err := os.WriteFile(file, desc, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// fileDisk is a hot-pluggable virtio disk on an image file.
func fileDisk(name, path, format string) machine.Disk {
	return machine.Disk{Name: name, Bus: machine.BusVirtio, Cache: machine.CacheNone, IO: machine.IOThreads,
		Source: machine.Source{HostFile: &machine.HostFile{Path: path, Format: format}}}
}

// vm is one launcher serving its socket in a private run directory.
type vm struct {
	runDir string
	client *launcher.Client
}

// bootGuest starts req's guest in a new launcher and waits for the guest's ready line.
func bootGuest(t *testing.T, req *protocol.SyncRequest) (*vm, *console) {
	t.Helper()
	v := newLauncher(t)
	if st, err := v.client.Sync(context.Background(), req); err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	return v, c
}

func newLauncher(t *testing.T) *vm {
	t.Helper()
	return newLauncherWith(t, launcher.HostResolver{SpareRootPorts: 2})
}

// newLauncherWith starts a launcher in this process with a resolver of the test's choosing,
// serving its command socket in a short run directory (unix socket paths are limited to 107
// bytes; t.TempDir() can be longer), and kills its QEMU when the test ends.
func newLauncherWith(t *testing.T, res launcher.HostResolver) *vm {
	t.Helper()
	return newLauncherOpts(t, res, launcher.Options{})
}

// newLauncherOpts is newLauncherWith with the launcher's options (its Log is the test's).
func newLauncherOpts(t *testing.T, res launcher.HostResolver, opts launcher.Options) *vm {
	t.Helper()
	runDir, err := os.MkdirTemp("", "qvt-")
	if err != nil {
		t.Fatal(err)
	}
	opts.Log = testr.New(t)
	l := launcher.New(runDir, res, opts)
	ctx, cancel := context.WithCancel(context.Background())
	sock := filepath.Join(runDir, launcher.SocketName)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = launcher.Serve(ctx, sock, l, testr.New(t))
	}()
	t.Cleanup(func() {
		if st, err := launcher.NewClient(sock).Status(context.Background()); err == nil && st.PID > 0 && st.Exit == nil {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			waitFor(t, 10*time.Second, "QEMU to exit", func() bool { s, _ := l.Status(context.Background()); return s.Exit != nil })
		}
		cancel()
		<-served
		_ = os.RemoveAll(runDir)
	})
	// The socket file exists from bind, a moment before listen: wait until it accepts.
	waitFor(t, 5*time.Second, "the command socket", func() bool {
		c, err := net.Dial("unix", sock)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	})
	return &vm{runDir: runDir, client: launcher.NewClient(sock)}
}

// waitFor polls ok until it holds or d passes (test/testutil).
func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	testutil.Eventually(t, d, what, ok)
}

// console is the guest's serial console (test/testutil).
type console = testutil.Console

func attach(t *testing.T, runDir string) *console {
	t.Helper()
	return testutil.AttachConsole(t, filepath.Join(runDir, "serial.sock"))
}

const bootTimeout = 3 * time.Minute

// countingTarget starts the guest's counter on src and a launcher waiting for src's guest, with
// the disks hot-plugged on src in its machine, as the node agent describes a migration target.
func countingTarget(t *testing.T, src *vm, srcConsole *console) *vm {
	t.Helper()
	ctx := context.Background()
	srcConsole.Send(t, "tick 100000 &")
	srcConsole.Expect(t, 0, "tick 3", time.Minute)
	srcStatus, err := src.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dst := newLauncher(t)
	req := guestSpec(t)
	req.Machine.UID = srcStatus.UID
	// The node agent describes a target from the same instance, so with the same SMBIOS UUID (the
	// instance's UID): the guest must not see it change, and QEMU's parallel streams check it.
	req.Machine.UUID = srcStatus.UID
	req.Incoming = true
	req.Machine.Disks = append(req.Machine.Disks, srcStatus.Hotplugged...)
	if st, err := dst.client.Sync(ctx, req); err != nil || st.Phase != protocol.PhaseIncoming {
		t.Fatalf("sync target: %v (phase %s)", err, st.Phase)
	}
	return dst
}

func boot(t *testing.T) (*vm, *console) {
	t.Helper()
	v := newLauncher(t)
	ctx := context.Background()
	st, err := v.client.Sync(ctx, guestSpec(t))
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if st.Phase != protocol.PhaseRunning || !strings.HasPrefix(st.QEMUVersion, "7.") && !strings.HasPrefix(st.QEMUVersion, "8.") && !strings.HasPrefix(st.QEMUVersion, "9.") {
		t.Fatalf("after sync: phase %s qemu %q, want Running on QEMU 7+", st.Phase, st.QEMUVersion)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	return v, c
}

func TestGuestLifecycle(t *testing.T) {
	t.Parallel()
	v, c := boot(t)
	ctx := context.Background()

	t.Run("without a bootloader the guest boots through BIOS: it sees no EFI", func(t *testing.T) {
		c.Run(t, bootModeCmd, "FW-BIOS", time.Minute)
	})

	t.Run("pause and resume stop and restart the guest", func(t *testing.T) {
		c.Send(t, "tick 100000 &")
		c.Expect(t, 0, "tick 3", time.Minute)
		if err := v.client.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		st, _ := v.client.Status(ctx)
		if !st.Paused || st.RunState != "paused" {
			t.Fatalf("after pause: paused=%v runState=%s", st.Paused, st.RunState)
		}
		// A line already in flight may still arrive: wait until the console has been quiet for 1 s.
		for n, quietSince := len(c.Text()), time.Now(); time.Since(quietSince) < time.Second; time.Sleep(100 * time.Millisecond) {
			if m := len(c.Text()); m != n {
				n, quietSince = m, time.Now()
			}
		}
		before := c.LastTick()
		time.Sleep(3 * time.Second)
		if after := c.LastTick(); after != before {
			t.Fatalf("the guest kept counting while paused: tick %d then %d", before, after)
		}
		if err := v.client.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if st, _ := v.client.Status(ctx); st.Paused || st.RunState != "running" {
			t.Fatalf("after resume: paused=%v runState=%s", st.Paused, st.RunState)
		}
		waitFor(t, time.Minute, "the counter to go on after resume", func() bool { return c.LastTick() > before })
		c.Send(t, "kill $!")
	})

	t.Run("a hotplugged disk appears as /dev/vdb and goes away on unplug", func(t *testing.T) {
		img := filepath.Join(v.runDir, "hot.qcow2")
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img, "32M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img: %v: %s", err, out)
		}
		got, err := v.client.HotplugDisk(ctx, fileDisk("hot", img, "qcow2"))
		if err != nil {
			t.Fatalf("hotplug: %v", err)
		}
		if got.Port == "" {
			t.Fatalf("hotplug reply names no root port: %+v", got)
		}
		from := len(c.Text())
		c.Send(t, `for i in $(seq 30); do [ -b /dev/vdb ] && break; sleep 1; done; echo "PLUGGED-$(cat /sys/block/vdb/size 2>/dev/null)"`)
		c.Expect(t, from, "PLUGGED-65536", time.Minute) // 32 MiB in 512-byte sectors
		if err := v.client.UnplugDisk(ctx, "hot"); err != nil {
			t.Fatalf("unplug: %v", err)
		}
		from = len(c.Text())
		c.Send(t, `echo "UNPLUGGED-$(ls /dev/vdb 2>/dev/null || echo gone)"`)
		c.Expect(t, from, "UNPLUGGED-gone", time.Minute)
		if st, _ := v.client.Status(ctx); len(st.Hotplugged) != 0 {
			t.Fatalf("status still lists hotplugged disks: %+v", st.Hotplugged)
		}
	})

	t.Run("a hotplugged NIC appears with its MAC and goes away on unplug", func(t *testing.T) {
		// A tap of our own on the host, removed by name at the end.
		tap := fmt.Sprintf("qvt%d", os.Getpid()%100000)
		if out, err := exec.Command("ip", "tuntap", "add", "dev", tap, "mode", "tap").CombinedOutput(); err != nil {
			t.Fatalf("create tap %s: %v: %s", tap, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tap).Run() })
		const mac = "02:00:00:aa:bb:cc"
		if err := v.client.HotplugNIC(ctx, machine.NIC{Name: "extra", Tap: tap, MAC: mac, Model: machine.NICVirtio}); err != nil {
			t.Fatalf("hotplug nic: %v", err)
		}
		from := len(c.Text())
		c.Send(t, `for i in $(seq 30); do [ -e /sys/class/net/eth0 ] && break; sleep 1; done; echo "NIC-$(cat /sys/class/net/eth0/address)"`)
		c.Expect(t, from, "NIC-"+mac, time.Minute)
		if err := v.client.UnplugNIC(ctx, "extra"); err != nil {
			t.Fatalf("unplug nic: %v", err)
		}
		from = len(c.Text())
		c.Send(t, `echo "NICGONE-$(ls /sys/class/net | grep -c eth)"`)
		c.Expect(t, from, "NICGONE-0", time.Minute)
	})

	t.Run("ACPI shutdown powers the guest off within the grace period", func(t *testing.T) {
		exit, err := v.client.Shutdown(ctx, ptr(int64(120)))
		if err != nil {
			t.Fatal(err)
		}
		if exit.Reason != protocol.ExitGuestShutdown {
			t.Fatalf("exit reason %q (%s), want %q", exit.Reason, exit.Detail, protocol.ExitGuestShutdown)
		}
		if st, _ := v.client.Status(ctx); st.Phase != protocol.PhaseSucceeded {
			t.Fatalf("phase after shutdown %s, want Succeeded", st.Phase)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// migrate sends src's guest to dst (sendGuest) and hands it over as the node agents do (handOver);
// it returns the guest's last tick on the source before the switch.
func migrate(t *testing.T, src, dst *vm, srcConsole *console) int {
	t.Helper()
	beforeSwitch := sendGuest(t, src, dst, srcConsole)
	handOver(t, src, dst)
	return beforeSwitch
}

// sendGuest has the (incoming) target dst listen on loopback and starts sending src's guest there,
// uncapped, with its local disks (the emptyDisk) mirrored to dst's NBD server; it returns the
// guest's last tick on the source before the switch.
func sendGuest(t *testing.T, src, dst *vm, srcConsole *console) int {
	t.Helper()
	return sendGuestOver(t, src, dst, srcConsole, nil, nil)
}

// sendGuestOver is sendGuest over parallel streams (nil: the main stream only), through relay
// (nil: straight to the target), which is given the target's URI and returns the source's.
func sendGuestOver(t *testing.T, src, dst *vm, srcConsole *console, parallel *protocol.ParallelStreams, relay func(uri string) string) int {
	t.Helper()
	ctx := context.Background()
	uri, err := dst.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0", Parallel: parallel})
	if err != nil {
		t.Fatal(err)
	}
	if relay != nil {
		uri = relay(uri)
	}
	beforeSwitch := srcConsole.LastTick()
	req := protocol.MigrationSource{URI: uri, BandwidthBytesPerSecond: -1, BlockMigration: nbdOf(dst), Parallel: parallel}
	if err := src.client.MigrateSource(ctx, req); err != nil {
		t.Fatal(err)
	}
	return beforeSwitch
}

func TestKilledQEMUIsReportedAtOnce(t *testing.T) {
	v := newLauncher(t)
	ctx := context.Background()
	st, err := v.client.Sync(ctx, guestSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	watchCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	seen := make(chan protocol.Status, 1)
	go func() {
		_ = v.client.Watch(watchCtx, func(s protocol.Status) bool {
			if s.Exit != nil {
				seen <- s
				return false
			}
			return true
		})
	}()
	time.Sleep(200 * time.Millisecond) // let the watch start
	killed := time.Now()
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-seen:
		t.Logf("reported %s after %s", s.Exit.Reason, time.Since(killed))
		if s.Phase != protocol.PhaseFailed || s.Exit.Reason != protocol.ExitKilled {
			t.Fatalf("phase %s reason %q, want Failed/killed", s.Phase, s.Exit.Reason)
		}
	case <-watchCtx.Done():
		t.Fatal("the watch never reported the kill")
	}
}

func TestMigrationKeepsTheGuestRunning(t *testing.T) {
	t.Parallel()
	src, srcConsole := boot(t)
	ctx := context.Background()
	// A disk hotplugged on the source must be on the target too: QEMU refuses a migration between
	// different device sets.
	img := filepath.Join(src.runDir, "hot.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img, "32M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	if _, err := src.client.HotplugDisk(ctx, fileDisk("hot", img, "qcow2")); err != nil {
		t.Fatal(err)
	}
	dst := countingTarget(t, src, srcConsole)
	dstConsole := attach(t, dst.runDir)
	beforeSwitch := -1
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("tick %d before the switch; the source's console: %q\nthe target's console: %q", beforeSwitch, srcConsole.Text(), dstConsole.Text())
		}
	})
	// Over two parallel streams compressed with zstd, through a relay counting the bytes.
	var wire *atomic.Int64
	relay := func(uri string) string {
		link := newLink(t, uri, 0)
		wire = &link.Sent
		return link.URI
	}
	beforeSwitch = sendGuestOver(t, src, dst, srcConsole, &protocol.ParallelStreams{Channels: 2, Compression: protocol.CompressionZstd}, relay)
	handOver(t, src, dst)
	waitFor(t, 2*time.Minute, "the source to exit as migrated", func() bool {
		st, err := src.client.Status(ctx)
		return err == nil && st.Exit != nil
	})
	st, _ := src.client.Status(ctx)
	if st.Exit.Reason != protocol.ExitMigrated || st.Migration == nil || st.Migration.Status != "completed" {
		t.Fatalf("source ended %+v, migration %+v; want migrated/completed", st.Exit, st.Migration)
	}
	waitFor(t, 30*time.Second, "the target to run", func() bool {
		st, err := dst.client.Status(ctx)
		return err == nil && st.Phase == protocol.PhaseRunning && st.RunState == "running"
	})
	// The guest had its agent's port open on the source. The target's launcher, which watches the
	// port from before the guest arrived, hears it open once QEMU loads the guest, and connects.
	waitFor(t, time.Minute, "the target's launcher to connect to the guest's agent", func() bool {
		st, err := dst.client.Status(ctx)
		return err == nil && st.GuestAgent != nil && st.GuestAgent.Connected
	})
	// The counter goes on from where it was: same guest, no reboot.
	dstConsole.Expect(t, 0, "tick ", time.Minute)
	waitFor(t, time.Minute, "the counter to go on past the switch", func() bool { return dstConsole.LastTick() > beforeSwitch+1 })
	from := len(dstConsole.Text())
	dstConsole.Send(t, `echo "STILL-$(cat /sys/block/vdb/size)"`)
	dstConsole.Expect(t, from, "STILL-65536", time.Minute)
	if strings.Contains(dstConsole.Text(), "QVIRT-GUEST-READY") {
		t.Fatalf("the guest rebooted on the target:\n%s", dstConsole.Text())
	}
	t.Logf("tick %d before the switch, %d on the target; downtime %d ms", beforeSwitch, dstConsole.LastTick(), st.Migration.DowntimeMs)
	// The pages went over the parallel streams, compressed: fewer bytes on the wire than pages sent.
	t.Logf("pages over the parallel streams %d bytes, on the wire %d bytes", st.Migration.ParallelBytes, wire.Load())
	if st.Migration.ParallelBytes == 0 || wire.Load() > st.Migration.ParallelBytes*3/4 {
		t.Errorf("parallel streams carried %d bytes of pages and the wire %d bytes: want the pages on the parallel streams, compressed to under 3/4",
			st.Migration.ParallelBytes, wire.Load())
	}
}

func TestBadMachinesFailBeforeQEMUStarts(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(m *machine.Machine)
		field  string
	}{
		{"missing kernel", func(m *machine.Machine) { m.Kernel.KernelPath = "/no-such-kernel" }, "machine.kernel.kernelPath"},
		{"missing host disk", func(m *machine.Machine) {
			m.Disks[0].Source = machine.Source{HostFile: &machine.HostFile{Path: "/no/such/disk.img", Format: "raw"}}
		}, "machine.disks[0].source.hostFile.path"},
		{"unknown bus", func(m *machine.Machine) { m.Disks[0].Bus = "ide" }, "machine.disks[0].bus"},
		{"duplicate disk names", func(m *machine.Machine) {
			d := m.Disks[0]
			d.Source = machine.Source{Empty: &machine.Empty{CapacityBytes: 1 << 20}}
			m.Disks = append(m.Disks, d)
		}, "machine.disks[1].name"},
		{"bad MAC", func(m *machine.Machine) {
			m.NICs = []machine.NIC{{Name: "default", Tap: "tap0", MAC: "02:00:00:00:00", Model: machine.NICVirtio}}
		}, "machine.nics[0].mac"},
		{"relative state directory", func(m *machine.Machine) {
			m.State = &machine.State{Dir: "state", TPM: true}
		}, "machine.state.dir"},
		{"state directory not mounted", func(m *machine.Machine) {
			m.State = &machine.State{Dir: "/no/such/state", TPM: true}
		}, "machine.state.dir"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newLauncher(t)
			req := guestSpec(t)
			tc.mutate(&req.Machine)
			_, err := v.client.Sync(context.Background(), req)
			var apiErr *launcher.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(apiErr.Msg, tc.field) {
				t.Fatalf("want a 400 naming %s, got %v", tc.field, err)
			}
			if _, err := os.Stat(filepath.Join(v.runDir, "qmp.sock")); err == nil {
				t.Fatal("QEMU was started for a refused machine")
			}
		})
	}
}

func TestEarlyQEMUExitReportsItsError(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vmlinuz"), []byte("not a kernel"), 0o600); err != nil {
		t.Fatal(err)
	}
	vmi := guestVMI(t)
	vmi.Spec.Domain.Firmware.KernelBoot.Container.Image = "file://" + dir
	vmi.Spec.Domain.Firmware.KernelBoot.Container.InitrdPath = ""
	m, err := launcher.HostResolver{}.Resolve(&testutil.SyncRequest(t, vmi, nil).Machine, dir)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = launcher.Start(context.Background(), m, launcher.Options{Log: testr.New(t), StartTimeout: 30 * time.Second})
	elapsed := time.Since(start)
	var se *launcher.StartError
	if !errors.As(err, &se) || se.Stderr == "" {
		t.Fatalf("want a StartError with QEMU's stderr, got %v", err)
	}
	if elapsed > 15*time.Second {
		t.Fatalf("the failure took %s: it waited for the start timeout instead of noticing the exit", elapsed)
	}
	t.Logf("reported after %s: %v", elapsed, err)
}

func TestRunCommandBootsAndPowersOff(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "qvirt-launcher")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/qvirt-launcher").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	file := guestMachineFile(t)
	cmd := exec.Command(bin, "run", "-f", file)
	stdin, _ := cmd.StdinPipe()
	var stdout, stderr testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	waitFor(t, bootTimeout, "QVIRT-GUEST-READY on stdout", func() bool { return strings.Contains(stdout.String(), "QVIRT-GUEST-READY") })
	// The console is a shell: power off from inside the guest.
	time.Sleep(500 * time.Millisecond)
	_, _ = stdin.Write([]byte("poweroff\n"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("qvirt-launcher run exited with %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the guest did not power off; stdout tail:\n%s", testutil.Tail(stdout.String(), 500))
	}
	if !strings.Contains(stderr.String(), "guest ended: guest shutdown") {
		t.Fatalf("stderr does not report the clean shutdown:\n%s", stderr.String())
	}
}

// A migration whose stream stops moving (here a target that accepts the connection and never
// reads) is cancelled after the progress timeout, its failure says why, and the guest goes on
// running on the source.
func TestStalledMigrationIsAborted(t *testing.T) {
	t.Parallel()
	src := newLauncher(t)
	ctx := context.Background()
	spec := guestSpec(t)
	// Without the emptyDisk: a memory-only migration needs no NBD server on the other end.
	spec.Machine.Disks = slices.DeleteFunc(spec.Machine.Disks, func(d machine.Disk) bool { return d.Source.Empty != nil })
	if _, err := src.client.Sync(ctx, spec); err != nil {
		t.Fatalf("sync: %v", err)
	}
	srcConsole := attach(t, src.runDir)
	srcConsole.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			held <- c // never read: the source's writes block once the socket buffers are full
		}
	}()
	t.Cleanup(func() {
		select {
		case c := <-held:
			c.Close()
		default:
		}
	})
	srcConsole.Send(t, "tick 100000 &")
	srcConsole.Expect(t, 0, "tick 2", time.Minute)
	req := protocol.MigrationSource{URI: "tcp:" + ln.Addr().String(), BandwidthBytesPerSecond: -1, ProgressTimeout: 2 * time.Second}
	if err := src.client.MigrateSource(ctx, req); err != nil {
		t.Fatal(err)
	}
	var st protocol.Status
	waitFor(t, 2*time.Minute, "the stalled migration to end", func() bool {
		st, err = src.client.Status(ctx)
		return err == nil && st.Migration != nil && (st.Migration.Status == "cancelled" || st.Migration.Status == "failed")
	})
	if !strings.Contains(st.Migration.Error, "no progress for 2s") {
		t.Fatalf("migration ended %+v: want an error saying it made no progress for 2s", st.Migration)
	}
	waitFor(t, 30*time.Second, "the guest to run on the source", func() bool {
		st, err := src.client.Status(ctx)
		return err == nil && st.Phase == protocol.PhaseRunning && st.RunState == "running"
	})
	last := srcConsole.LastTick()
	waitFor(t, time.Minute, "the guest's counter to go on", func() bool { return srcConsole.LastTick() > last+1 })
	t.Logf("aborted: %s", st.Migration.Error)
}
