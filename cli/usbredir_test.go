package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// TestUSBRedirRefusesABadDevice: the device is checked before anything is dialled or run.
func TestUSBRedirRefusesABadDevice(t *testing.T) {
	for _, dev := range []string{"", "usb0", "12345:1", "1d6b", "1-2-3", "x1:2"} {
		_, errOut, code := run(t, nil, "usbredir", dev, "v1", "--kubeconfig", "/nonexistent")
		if code == 0 || !strings.Contains(errOut, "want VENDOR:PRODUCT in hex") {
			t.Errorf("device %q: exit %d, %q", dev, code, errOut)
		}
	}
}

// TestUSBRedirWithoutTheDevice: Debian's usbredirect, asked for a device this machine does not
// have, exits (with status 0) without connecting; qvirtctl says so and what to check.
func TestUSBRedirWithoutTheDevice(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "u1", qv1.Running)
	_, errOut, code := run(t, nil, "usbredir", "1d6b:0002", "u1", "--kubeconfig", kc)
	if code == 0 || !strings.Contains(errOut, "usbredirect --device 1d6b:0002: exited without connecting: is the device plugged in") {
		t.Errorf("exit %d, %q", code, errOut)
	}
}

// TestUSBRedirCarriesTheDevice: what usbredirect sends reaches the VMI's stream and the stream's
// bytes reach usbredirect; qvirtctl ends when usbredirect does. A script stands in for
// usbredirect (no USB device can be plugged into this machine): it connects where qvirtctl tells
// it, reads the slot's greeting, sends bytes and reads them back from the fake API's echo.
func TestUSBRedirCarriesTheDevice(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "u2", qv1.Running)
	dir := t.TempDir()
	script := filepath.Join(dir, "usbredirect")
	if err := os.WriteFile(script, []byte(`#!/bin/bash
[ "$1" = --device ] && [ "$3" = --to ] || exit 2
to=$4
exec 3<>"/dev/tcp/${to%:*}/${to#*:}"
head -c 14 <&3 > "`+dir+`/greeting"
msg="DEVICE-$2"
printf %s "$msg" >&3
head -c ${#msg} <&3 > "`+dir+`/echo"
`), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, nil, "usbredir", "1d6b:0002", "u2", "--usbredirect", script, "--kubeconfig", kc)
	if code != 0 || out != "USB device 1d6b:0002 redirected to VMI u2; Ctrl+C to take it back\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// usbredirect ended the redirection, not the VMI: saying otherwise sends the user looking at
	// the wrong end.
	if strings.Contains(errOut, "closed the USB redirection") {
		t.Errorf("stderr blames the VMI for an end usbredirect made: %q", errOut)
	}
	for file, want := range map[string]string{"greeting": "USBREDIR-HELLO", "echo": "DEVICE-1d6b:0002"} {
		if got, err := os.ReadFile(filepath.Join(dir, file)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", file, got, err, want)
		}
	}
}

// TestUSBRedirEndedByTheVMI: when the VMI's side closes the stream, qvirtctl gives usbredirect
// its end and says the VMI closed the redirection. The script stands in for usbredirect as above.
func TestUSBRedirEndedByTheVMI(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "u3", qv1.Running)
	script := filepath.Join(t.TempDir(), "usbredirect")
	if err := os.WriteFile(script, []byte(`#!/bin/bash
to=$4
exec 3<>"/dev/tcp/${to%:*}/${to#*:}"
head -c 14 <&3 >/dev/null
printf BYE >&3
cat <&3 >/dev/null
`), 0o755); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := run(t, nil, "usbredir", "1d6b:0002", "u3", "--usbredirect", script, "--kubeconfig", kc)
	if code != 0 || !strings.Contains(errOut, "VMI u3 closed the USB redirection of 1d6b:0002") {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}
