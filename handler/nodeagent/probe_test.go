package nodeagent

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The check guest is the real test of KVM; on these machines KVM is absent or broken, so the same
// guest is proven under TCG: it must finish there, and a guest that never runs must be reported as
// a hang.

func TestCheckGuestFinishesUnderTCG(t *testing.T) {
	start := time.Now()
	if err := runCheckGuest(context.Background(), ProbeOptions{accel: "tcg"}.withDefaults()); err != nil {
		t.Fatalf("check guest under TCG: %v", err)
	}
	t.Logf("check guest under TCG finished in %s (QEMU start included)", time.Since(start).Round(time.Millisecond))
}

func TestCheckGuestHangIsReported(t *testing.T) {
	// -S keeps the vCPU stopped: from the probe's side exactly a guest that hangs.
	opts := ProbeOptions{accel: "tcg", CheckTimeout: time.Second, extraArgs: []string{"-S"}}.withDefaults()
	start := time.Now()
	err := runCheckGuest(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "did not finish within 1s") {
		t.Fatalf("hanging guest: got %v, want a timeout", err)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("the timeout took %s", d)
	}
}

func TestCheckGuestWithoutSuccessReportFails(t *testing.T) {
	// Without an isa-debug-exit the guest's success write goes nowhere and it halts with
	// interrupts off; the probe must call that a hang, never success.
	opts := ProbeOptions{accel: "tcg", CheckTimeout: 2 * time.Second}.withDefaults()
	opts.QEMU = writeWrapper(t, `exec qemu-system-x86_64 "${@/isa-debug-exit,iobase=0xf4,iosize=4/isa-debug-exit,iobase=0x80,iosize=1}"`)
	err := runCheckGuest(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "did not finish") {
		t.Fatalf("a guest that cannot report success: got %v, want a timeout", err)
	}
}

func TestProbeReportsKVMOnThisMachine(t *testing.T) {
	caps, err := Probe(context.Background(), ProbeOptions{CheckTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capabilities: %+v", caps)
	if !regexp.MustCompile(`^\d+\.\d+\.\d+$`).MatchString(caps.QEMUVersion) {
		t.Fatalf("QEMU version %q is not major.minor.micro", caps.QEMUVersion)
	}
	if caps.KVM == (caps.KVMReason != "") {
		t.Fatalf("KVM=%v with reason %q", caps.KVM, caps.KVMReason)
	}
	if _, err := os.Stat("/dev/kvm"); errors.Is(err, os.ErrNotExist) {
		if caps.KVM || caps.KVMReason != "/dev/kvm is absent" {
			t.Fatalf("without /dev/kvm: KVM=%v, reason %q", caps.KVM, caps.KVMReason)
		}
	}
}

func TestProbeRunsQEMUUnderKVMPastTheDeviceCheck(t *testing.T) {
	// An openable "device" lets the probe go on to QEMU, which opens /dev/kvm itself: the real
	// check guest under KVM. Without /dev/kvm QEMU refuses to start, and the reason carries its
	// words; with a /dev/kvm whose guests hang (nested virtualisation) it times out.
	caps, err := Probe(context.Background(), ProbeOptions{KVMDevice: os.DevNull, CheckTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capabilities: %+v", caps)
	if _, err := os.Stat("/dev/kvm"); errors.Is(err, os.ErrNotExist) {
		if caps.KVM || !strings.Contains(caps.KVMReason, "qemu exited with status 1") || !strings.Contains(caps.KVMReason, "kvm") {
			t.Fatalf("QEMU without /dev/kvm: KVM=%v, reason %q", caps.KVM, caps.KVMReason)
		}
	}
}

func TestProbeMissingDevice(t *testing.T) {
	caps, err := Probe(context.Background(), ProbeOptions{KVMDevice: "/nonexistent/kvm"})
	if err != nil {
		t.Fatal(err)
	}
	if caps.KVM || caps.KVMReason != "/nonexistent/kvm is absent" {
		t.Fatalf("got %+v", caps)
	}
}

func TestQEMUVersionMatchesBanner(t *testing.T) {
	v, err := QEMUVersion(context.Background(), DefaultQEMU)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(DefaultQEMU, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "version "+v) {
		t.Fatalf("QMP says %s, --version says %q", v, out)
	}
}

func TestQEMUVersionMissingBinary(t *testing.T) {
	_, err := Probe(context.Background(), ProbeOptions{QEMU: "/nonexistent/qemu"})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/qemu") {
		t.Fatalf("got %v, want an error naming the binary", err)
	}
}

func TestCheckGuestImageLayout(t *testing.T) {
	img, err := CheckGuestImage()
	if err != nil {
		t.Fatal(err)
	}
	// QEMU takes -bios images in 64 KiB multiples; the CPU starts 16 bytes from the end, with
	// a far jump to the code at the start of the low alias.
	if len(img) != checkGuestROMSize {
		t.Fatalf("image is %d bytes", len(img))
	}
	if got := img[resetVector : resetVector+5]; string(got) != "\xEA\x00\x00\x00\xF0" {
		t.Fatalf("reset vector % x, want jmp far F000:0000", got)
	}
}

// writeWrapper writes an executable shell script running body with the caller's arguments.
func writeWrapper(t *testing.T, body string) string {
	t.Helper()
	p := t.TempDir() + "/qemu"
	if err := os.WriteFile(p, []byte("#!/bin/bash\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
