// Package nodeagent is what the node agent (qvirt-handler) says about its Node: the capability
// probe (QEMU version, whether KVM really works) run once at start-up, and the Heartbeat, a
// manager.Runnable that keeps the node's qvirt labels and heartbeat annotation fresh.
package nodeagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/qvirt/qvirt/qmp"
)

// Defaults of ProbeOptions.
const (
	DefaultQEMU      = "qemu-system-x86_64"
	DefaultKVMDevice = "/dev/kvm"
	// DefaultCheckTimeout bounds the KVM check guest. It finishes in well under a second where KVM
	// works (QEMU's start-up is most of it); where nested virtualisation is broken it never does.
	DefaultCheckTimeout = 10 * time.Second
)

// Capabilities is what the probe found. It is a value: probe once at start-up and hand it to the
// Heartbeat and the device plugin.
type Capabilities struct {
	// QEMUVersion is major.minor.micro as QEMU's QMP reports it, the form a VMI's
	// status.qemuVersion takes.
	QEMUVersion string
	// KVM is true only when the check guest ran to its end under KVM.
	KVM bool
	// KVMReason says why KVM is not usable; empty when it is.
	KVMReason string
}

// ProbeOptions configure Probe; zero values take the defaults.
type ProbeOptions struct {
	// QEMU is the qemu-system-x86_64 binary.
	QEMU string
	// KVMDevice is the KVM device node.
	KVMDevice string
	// CheckTimeout bounds the KVM check guest.
	CheckTimeout time.Duration

	// accel overrides the check guest's accelerator, so tests can run the same guest under TCG.
	accel string
	// extraArgs are appended to the check guest's QEMU command line, for tests.
	extraArgs []string
}

func (o ProbeOptions) withDefaults() ProbeOptions {
	if o.QEMU == "" {
		o.QEMU = DefaultQEMU
	}
	if o.KVMDevice == "" {
		o.KVMDevice = DefaultKVMDevice
	}
	if o.CheckTimeout <= 0 {
		o.CheckTimeout = DefaultCheckTimeout
	}
	if o.accel == "" {
		o.accel = "kvm"
	}
	return o
}

// Probe finds the node's capabilities: QEMU's version, and whether a guest really runs under KVM.
// An unusable KVM is not an error (it is reported in Capabilities); a QEMU that cannot be run is,
// since the node cannot run any VM then.
func Probe(ctx context.Context, opts ProbeOptions) (Capabilities, error) {
	opts = opts.withDefaults()
	v, err := QEMUVersion(ctx, opts.QEMU)
	if err != nil {
		return Capabilities{}, err
	}
	caps := Capabilities{QEMUVersion: v}
	if err := checkKVM(ctx, opts); err != nil {
		caps.KVMReason = err.Error()
		return caps, nil
	}
	caps.KVM = true
	return caps, nil
}

// QEMUVersion starts a short-lived QEMU without a machine (`-machine none`) and reads its version
// from the QMP greeting, the same source the launcher reports a VMI's status.qemuVersion from. It
// is preferred to parsing `--version`, whose banner distributions decorate ("7.2.22 (Debian
// 1:7.2+dfsg-...)"). The monitor socket is made and listened on here and handed to QEMU as a file
// descriptor, so there is no waiting for QEMU to create it.
func QEMUVersion(ctx context.Context, qemuBinary string) (string, error) {
	dir, err := os.MkdirTemp("", "qvirt-probe-")
	if err != nil {
		return "", fmt.Errorf("probe qemu version: %w", err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return "", fmt.Errorf("probe qemu version: listen on %s: %w", sock, err)
	}
	defer l.Close()
	lf, err := l.File()
	if err != nil {
		return "", fmt.Errorf("probe qemu version: monitor socket file: %w", err)
	}
	defer lf.Close()

	ctx, cancel := context.WithTimeout(ctx, DefaultCheckTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, qemuBinary,
		"-machine", "none", "-nodefaults", "-no-user-config", "-display", "none",
		// The first ExtraFiles entry is fd 3 in QEMU.
		"-chardev", "socket,id=qmp,fd=3,server=on,wait=off", "-mon", "chardev=qmp,mode=control")
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("probe qemu version: start %s: %w", qemuBinary, err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	mon, err := qmp.Dial(ctx, sock)
	if err != nil {
		return "", fmt.Errorf("probe qemu version: %s monitor: %w%s", qemuBinary, err, stderrDetail(&stderr))
	}
	defer mon.Close()
	v := mon.Version().QEMU
	_ = mon.Quit(ctx)
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro), nil
}

// checkKVM runs the check guest under KVM (see CheckGuestImage); nil means it ran to its end.
// A missing or unopenable device is told without starting QEMU.
func checkKVM(ctx context.Context, opts ProbeOptions) error {
	if opts.accel == "kvm" {
		f, err := os.OpenFile(opts.KVMDevice, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s is absent", opts.KVMDevice)
		}
		if err != nil {
			return fmt.Errorf("%s cannot be opened: %w", opts.KVMDevice, err)
		}
		f.Close()
	}
	return runCheckGuest(ctx, opts)
}

// runCheckGuest boots the check guest with the machine and CPU a VM gets and waits for its exit.
func runCheckGuest(ctx context.Context, opts ProbeOptions) error {
	img, err := CheckGuestImage()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "qvirt-kvm-check-")
	if err != nil {
		return fmt.Errorf("check guest: %w", err)
	}
	defer os.RemoveAll(dir)
	bios := filepath.Join(dir, "check-guest.bin")
	if err := os.WriteFile(bios, img, 0o600); err != nil {
		return fmt.Errorf("check guest: %w", err)
	}

	cpu := "host" // what a VM gets under KVM (launcher/argv.go)
	if opts.accel != "kvm" {
		cpu = "qemu64"
	}
	args := []string{
		"-machine", "q35,accel=" + opts.accel, "-cpu", cpu, "-m", "32",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-bios", bios,
		"-device", fmt.Sprintf("isa-debug-exit,iobase=%#x,iosize=4", debugExitPort),
	}
	args = append(args, opts.extraArgs...)

	ctx, cancel := context.WithTimeout(ctx, opts.CheckTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, opts.QEMU, args...)
	cmd.Stderr = &stderr
	start := time.Now()
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("the check guest under %s did not finish within %s (it hangs: nested virtualisation not working?)", opts.accel, opts.CheckTimeout)
	case errors.As(err, &exit) && exit.ExitCode() == CheckGuestSuccess:
		return nil
	case errors.As(err, &exit):
		return fmt.Errorf("the check guest under %s failed: qemu exited with status %d after %s%s", opts.accel, exit.ExitCode(), time.Since(start).Round(time.Millisecond), stderrDetail(&stderr))
	case err != nil:
		return fmt.Errorf("the check guest under %s: run %s: %w", opts.accel, opts.QEMU, err)
	default:
		// Exit 0: the guest reset itself (a triple fault, which -no-reboot turns into an exit).
		return fmt.Errorf("the check guest under %s crashed (triple fault) before finishing%s", opts.accel, stderrDetail(&stderr))
	}
}

// stderrDetail is ": <QEMU's last stderr line>" when it wrote one.
func stderrDetail(b *bytes.Buffer) string {
	s := strings.TrimSpace(b.String())
	if s == "" {
		return ""
	}
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return ": " + s
}
