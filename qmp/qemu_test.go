package qmp_test

// Integration tests against a real qemu-system-x86_64 (QEMU 7.2 on these
// machines). They need no guest: QEMU starts paused (-S) with no devices.
// They do not skip when QEMU is missing; CI installs it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
	"unsafe"

	gqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qvirt/qvirt/qmp"
	"github.com/qvirt/qvirt/test/testutil"
)

const qemuBinary = "qemu-system-x86_64"

// qemuProc is one QEMU started by a test, tracked by its PID only.
type qemuProc struct {
	cmd    *exec.Cmd
	dir    string
	stderr *testutil.SyncBuffer
	exited chan struct{} // closed when Wait returned
	err    error         // Wait's result, readable after exited
}

type qemuConfig struct {
	args  []string
	netns bool // run QEMU in a private network namespace
}

// startQEMU starts a paused q35 QEMU under TCG and connects to its QMP
// socket. Cleanup kills that process (by PID) if it is still running.
func startQEMU(t *testing.T, cfg qemuConfig) (*qmp.Monitor, *qemuProc) {
	t.Helper()
	bin, err := exec.LookPath(qemuBinary)
	if err != nil {
		t.Fatalf("%s not found (%v): these tests need Debian's qemu-system-x86 (apt-get install qemu-system-x86 qemu-utils); they do not skip", qemuBinary, err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "qmp.sock")
	args := []string{
		"-machine", "q35,accel=tcg", "-nodefaults", "-no-user-config", "-display", "none", "-S",
		"-qmp", "unix:" + sock + ",server=on,wait=off", "-m", "64",
	}
	p := &qemuProc{cmd: exec.Command(bin, append(args, cfg.args...)...), dir: dir, stderr: &testutil.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	if cfg.netns {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", qemuBinary, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	m := p.dial(t, sock)
	t.Cleanup(func() { _ = m.Close() })
	return m, p
}

// qemuTimeout bounds each test against a real QEMU: under TCG on a loaded machine, starting,
// migrating or stopping one takes far longer than a fake server's exchange (testTimeout).
const qemuTimeout = time.Minute

func qemuContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), qemuTimeout)
	t.Cleanup(cancel)
	return ctx
}

// dial retries until QEMU has created its socket, failing early with QEMU's
// own output if it exits first.
func (p *qemuProc) dial(t *testing.T, sock string) *qmp.Monitor {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		m, err := qmp.Dial(ctx, sock)
		cancel()
		if err == nil {
			return m
		}
		select {
		case <-p.exited:
			t.Fatalf("qemu (pid %d) exited before QMP was ready: %v\n%s", p.cmd.Process.Pid, p.err, p.stderr)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("qemu (pid %d) QMP not ready: %v\n%s", p.cmd.Process.Pid, err, p.stderr)
		}
	}
}

func (p *qemuProc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Kill() // this PID only
	<-p.exited
}

func (p *qemuProc) waitExit(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(within):
		t.Fatalf("qemu (pid %d) still running %s after quit\n%s", p.cmd.Process.Pid, within, p.stderr)
	}
}

func TestQEMULifecycle(t *testing.T) {
	m, p := startQEMU(t, qemuConfig{})
	ctx := qemuContext(t)

	v, err := m.QueryVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.QEMU.Major < 7 || v.String() != m.Version().String() {
		t.Errorf("query-version %s (%s), greeting %s; want 7.x or later, and equal", v, v.Package, m.Version())
	}
	t.Logf("QEMU %s (%s)", v, v.Package)

	st, err := m.QueryStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Running || (st.Status != qmp.StatePrelaunch && st.Status != qmp.StatePaused) {
		t.Errorf("status at start = %+v, want not running, prelaunch or paused", st)
	}

	if _, _, err := m.ExecuteAndWait(ctx, "cont", nil, qmp.EventResume, nil); err != nil {
		t.Fatalf("cont: %v", err)
	}
	assertStatus(ctx, t, m, true, qmp.StateRunning)

	if _, _, err := m.ExecuteAndWait(ctx, "stop", nil, qmp.EventStop, nil); err != nil {
		t.Fatalf("stop: %v", err)
	}
	assertStatus(ctx, t, m, false, qmp.StatePaused)

	out, err := m.HumanMonitorCommand(ctx, "info version")
	if err != nil || !bytes.Contains([]byte(out), []byte(v.String())) {
		t.Errorf("HMP info version = %q, %v; want it to mention %s", out, err, v)
	}
	for name, want := range map[string]bool{"query-status": true, "blockdev-add": true, "no-such-command": false} {
		if got, err := m.HasCommand(ctx, name); err != nil || got != want {
			t.Errorf("HasCommand(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	_, err = m.Execute(ctx, "no-such-command", nil)
	var qerr *qmp.Error
	if !errors.As(err, &qerr) || qerr.Class != qmp.ClassCommandNotFound {
		t.Errorf("unknown command = %v, want CommandNotFound", err)
	}

	// go-qemu's interface on the real thing.
	raw, err := gqmp.Monitor(m).Run([]byte(`{"execute": "query-status"}`))
	if err != nil || !bytes.Contains(raw, []byte(`"return"`)) {
		t.Errorf("Run(query-status) = %s, %v", raw, err)
	}

	shutdown := m.NewWaiter(qmp.EventShutdown, nil)
	defer shutdown.Cancel()
	if err := m.Quit(ctx); err != nil {
		t.Fatalf("quit: %v", err)
	}
	ev, err := shutdown.Wait(ctx)
	if err != nil {
		t.Fatalf("SHUTDOWN after quit: %v", err)
	}
	if ev.Data["reason"] != "host-qmp-quit" {
		t.Errorf("SHUTDOWN reason %v, want host-qmp-quit", ev.Data["reason"])
	}
	p.waitExit(t, 10*time.Second)
	select {
	case <-m.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("monitor did not notice QEMU exiting")
	}
	if err := m.Cont(ctx); !errors.Is(err, qmp.ErrDisconnected) {
		t.Errorf("command after QEMU exited = %v, want ErrDisconnected", err)
	}
}

func assertStatus(ctx context.Context, t *testing.T, m *qmp.Monitor, running bool, state qmp.RunState) {
	t.Helper()
	st, err := m.QueryStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Running != running || st.Status != state {
		t.Errorf("status = %+v, want running=%v status=%s", st, running, state)
	}
}

func TestQEMUHotplugBlockDevice(t *testing.T) {
	m, _ := startQEMU(t, qemuConfig{args: []string{"-device", "pcie-root-port,id=rp1,bus=pcie.0,chassis=1"}})
	ctx := qemuContext(t)

	err := m.BlockdevAdd(ctx, qmp.BlockdevOptions{Driver: "null-co", NodeName: "null0", Props: map[string]any{"size": 64 << 20, "read-zeroes": true}})
	if err != nil {
		t.Fatal(err)
	}
	// q35's root bus refuses hot-plug; the root port takes it.
	err = m.DeviceAdd(ctx, qmp.Device{Driver: "virtio-blk-pci", ID: "bad0", Bus: "pcie.0", Props: map[string]any{"drive": "null0"}})
	var qerr *qmp.Error
	if !errors.As(err, &qerr) || qerr.Class != qmp.ClassGenericError {
		t.Errorf("device_add on pcie.0 = %v, want a GenericError", err)
	}
	if err := m.DeviceAdd(ctx, qmp.Device{Driver: "virtio-blk-pci", ID: "disk0", Bus: "rp1", Props: map[string]any{"drive": "null0", "serial": "qvirt0"}}); err != nil {
		t.Fatal(err)
	}

	var blocks []struct {
		QDev     string `json:"qdev"`
		Inserted *struct {
			NodeName string `json:"node-name"`
			Drv      string `json:"drv"`
		} `json:"inserted"`
	}
	if err := m.Call(ctx, "query-block", nil, &blocks); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, b := range blocks {
		if b.Inserted != nil && b.Inserted.NodeName == "null0" {
			found = true
			if b.Inserted.Drv != "null-co" || !bytes.Contains([]byte(b.QDev), []byte("disk0")) {
				t.Errorf("query-block entry qdev=%q drv=%q, want disk0's null-co", b.QDev, b.Inserted.Drv)
			}
		}
	}
	if !found {
		t.Errorf("query-block does not show node null0 attached: %+v", blocks)
	}

	var props []struct{ Name, Type string }
	if err := m.Call(ctx, "qom-list", map[string]string{"path": "/machine/peripheral"}, &props); err != nil {
		t.Fatal(err)
	}
	if !hasQOMChild(props, "disk0", "child<virtio-blk-pci>") {
		t.Errorf("qom-list /machine/peripheral = %+v, want disk0 as child<virtio-blk-pci>", props)
	}

	// The node is in use: removing it must fail and leave it in place.
	if err := m.BlockdevDel(ctx, "null0"); !errors.As(err, &qerr) {
		t.Errorf("blockdev-del of an attached node = %v, want a QMP error", err)
	}
}

func hasQOMChild(props []struct{ Name, Type string }, name, typ string) bool {
	for _, p := range props {
		if p.Name == name && p.Type == typ {
			return true
		}
	}
	return false
}

func TestQEMUGetFD(t *testing.T) {
	m, _ := startQEMU(t, qemuConfig{})
	ctx := qemuContext(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := m.SendFD(ctx, "pipe0", w); err != nil {
		t.Fatal(err)
	}
	if err := m.SendFD(ctx, "pipe0", w); err != nil {
		t.Errorf("getfd again under the same name: %v", err)
	}
	if err := m.CloseFD(ctx, "pipe0"); err != nil {
		t.Fatal(err)
	}
	var qerr *qmp.Error
	if err := m.CloseFD(ctx, "pipe0"); !errors.As(err, &qerr) {
		t.Errorf("closefd of a closed name = %v, want a QMP error", err)
	}
	// getfd without a descriptor is refused by QEMU.
	if err := m.Call(ctx, "getfd", map[string]string{"fdname": "none"}, nil); !errors.As(err, &qerr) {
		t.Errorf("getfd without SCM_RIGHTS = %v, want a QMP error", err)
	}
}

// TestQEMUNetdevTap runs QEMU in a private network namespace so the taps it
// opens never touch the host's.
func TestQEMUNetdevTap(t *testing.T) {
	m, _ := startQEMU(t, qemuConfig{netns: true})
	ctx := qemuContext(t)

	// By name: QEMU creates the tap itself (it is root here) and, because
	// NetdevTap sends script=no, runs no /etc/qemu-ifup.
	if err := m.NetdevAddTap(ctx, qmp.NetdevTap{ID: "net0", Ifname: "qvtap0", VNetHdr: ptr(true)}); err != nil {
		t.Fatalf("netdev_add tap by ifname: %v", err)
	}
	if err := m.NetdevDel(ctx, "net0"); err != nil {
		t.Fatal(err)
	}

	// By descriptor: the launcher's path when the handler hands it a tap.
	tap, err := openTapInPrivateNetns("qvtap1")
	if err != nil {
		t.Fatalf("create tap for the test: %v", err)
	}
	defer tap.Close()
	if err := m.SendFD(ctx, "tapfd1", tap); err != nil {
		t.Fatal(err)
	}
	if err := m.NetdevAddTap(ctx, qmp.NetdevTap{ID: "net1", FD: "tapfd1"}); err != nil {
		t.Fatalf("netdev_add tap by fd: %v", err)
	}
	// netdev_add consumed the descriptor: the name is gone.
	var qerr *qmp.Error
	if err := m.CloseFD(ctx, "tapfd1"); !errors.As(err, &qerr) {
		t.Errorf("closefd after netdev_add took the fd = %v, want a QMP error", err)
	}
}

// openTapInPrivateNetns creates a non-persistent tap in a new network
// namespace. The namespace lives as long as the descriptor; the thread that
// entered it is never returned to the scheduler's pool.
func openTapInPrivateNetns(name string) (*os.File, error) {
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread exits with this goroutine
		f, err := createTap(name)
		ch <- result{f, err}
	}()
	r := <-ch
	return r.f, r.err
}

func createTap(name string) (*os.File, error) {
	if err := syscall.Unshare(syscall.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("unshare netns: %w", err)
	}
	f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	const (
		tunSetIff = 0x400454ca
		iffTap    = 0x0002
		iffNoPI   = 0x1000
	)
	var ifr [40]byte
	copy(ifr[:16], name)
	*(*uint16)(unsafe.Pointer(&ifr[16])) = iffTap | iffNoPI
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), tunSetIff, uintptr(unsafe.Pointer(&ifr[0]))); errno != 0 {
		f.Close()
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, errno)
	}
	return f, nil
}

func TestQEMUMigrationLoopback(t *testing.T) {
	src, _ := startQEMU(t, qemuConfig{})
	dst, _ := startQEMU(t, qemuConfig{args: []string{"-incoming", "defer"}})
	ctx := qemuContext(t)

	assertStatus(ctx, t, dst, false, qmp.StateInMigrate)
	// Migrate a running source (the BIOS spins with no boot device): the
	// destination takes over the source's run state unless it was running.
	if err := src.Cont(ctx); err != nil {
		t.Fatal(err)
	}
	caps := []qmp.MigrationCapabilityStatus{{Capability: qmp.CapEvents, State: true}}
	for _, m := range []*qmp.Monitor{src, dst} {
		if err := m.MigrateSetCapabilities(ctx, caps); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.MigrateSetParameters(ctx, qmp.MigrateParameters{MaxBandwidth: ptr(int64(1 << 30)), DowntimeLimit: ptr(int64(500))}); err != nil {
		t.Fatal(err)
	}
	uri := "unix:" + filepath.Join(t.TempDir(), "mig.sock")
	if err := dst.MigrateIncoming(ctx, uri); err != nil {
		t.Fatal(err)
	}
	done := src.NewWaiter(qmp.EventMigration, func(ev gqmp.Event) bool {
		s := ev.Data["status"]
		return s == string(qmp.MigrationCompleted) || s == string(qmp.MigrationFailed)
	})
	defer done.Cancel()
	if err := src.Migrate(ctx, qmp.MigrateOptions{URI: uri}); err != nil {
		t.Fatal(err)
	}
	ev, err := done.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Data["status"] != string(qmp.MigrationCompleted) {
		info, _ := src.QueryMigrate(ctx)
		t.Fatalf("migration ended %v: %s", ev.Data["status"], info.ErrorDesc)
	}
	// QEMU 7.2 sends the completed event while still in finish-migrate, before it fills in
	// total-time: the final figures are there once the source is in postmigrate.
	waitStatus(ctx, t, src, qmp.StatePostMigrate)
	info, err := src.QueryMigrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Status != qmp.MigrationCompleted || info.RAM == nil || info.RAM.Total < 64<<20 || info.TotalTime <= 0 {
		t.Errorf("query-migrate = %+v (ram %+v), want completed with 64 MiB of RAM", info, info.RAM)
	}
	t.Logf("migration: total %d ms, downtime %d ms, setup %d ms, %d bytes transferred", info.TotalTime, info.Downtime, info.SetupTime, info.RAM.Transferred)
	assertStatus(ctx, t, src, false, qmp.StatePostMigrate)
	// A running source and -S on the destination: it waits paused for cont. Without a return path
	// the source completes before the destination has left inmigrate, so wait for it.
	waitStatus(ctx, t, dst, qmp.StatePaused)
	assertStatus(ctx, t, dst, false, qmp.StatePaused)
	if err := src.MigrateCancel(ctx); err != nil {
		t.Errorf("migrate_cancel with no migration running: %v", err)
	}
}

// waitStatus polls query-status until the run state is want.
func waitStatus(ctx context.Context, t *testing.T, m *qmp.Monitor, want qmp.RunState) {
	t.Helper()
	for {
		st, err := m.QueryStatus(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run state %s, want %s: %v", st.Status, want, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
