package launcher_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/testutil"
)

// readUSBRedirHello reads what QEMU's usb-redir device sends a client that connects: usbredir's
// hello packet (a 12-byte header of type 0, length and id, then a 64-byte version string), and
// returns the version string.
func readUSBRedirHello(t *testing.T, r io.Reader) string {
	t.Helper()
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		t.Fatalf("read the usbredir header: %v", err)
	}
	typ, length := binary.LittleEndian.Uint32(hdr[0:4]), binary.LittleEndian.Uint32(hdr[4:8])
	if typ != 0 || length < 64 || length > 1024 {
		t.Fatalf("usbredir header: type %d length %d, want a hello (type 0) of at least 64 bytes", typ, length)
	}
	body := make([]byte, length)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("read the usbredir hello: %v", err)
	}
	return string(bytes.TrimRight(body[:64], "\x00"))
}

// TestGuestUSBRedirSlots: an instance with clientPassthrough gets an xHCI controller the guest
// finds and four usb-redir slots, each a socket in the launcher's directory where QEMU greets a
// client as usbredir's guest side.
func TestGuestUSBRedirSlots(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.ClientPassthrough = &v1alpha1.ClientPassthroughDevices{}
	req := testutil.SyncRequest(t, vmi, nil)
	if req.Machine.USBRedirSlots != machine.MaxUSBRedirSlots {
		t.Fatalf("clientPassthrough translates to %d slots, want %d", req.Machine.USBRedirSlots, machine.MaxUSBRedirSlots)
	}
	v := newLauncher(t)
	if _, err := v.client.Sync(context.Background(), req); err != nil {
		t.Fatalf("sync: %v", err)
	}
	c := attach(t, v.runDir)
	at := c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Send(t, `echo "XHCI-$(grep -l 0x0c0330 /sys/bus/pci/devices/*/class | wc -l)"`)
	c.Expect(t, at, "XHCI-1", 30*time.Second)

	for i := range machine.MaxUSBRedirSlots {
		conn, err := net.Dial("unix", launcher.Dir(v.runDir).USBRedir(i))
		if err != nil {
			t.Fatalf("slot %d: %v", i, err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		if hello := readUSBRedirHello(t, conn); !strings.HasPrefix(hello, "qemu usb-redir guest") {
			t.Errorf("slot %d greets with %q, want QEMU's usb-redir guest", i, hello)
		}
		_ = conn.Close()
	}
	if st, err := v.client.Status(context.Background()); err != nil || st.Phase != protocol.PhaseRunning {
		t.Errorf("after the clients left: %+v %v, want the guest running", st, err)
	}
}
