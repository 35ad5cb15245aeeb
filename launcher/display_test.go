package launcher_test

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// TestSoftRebootAndScreenshot boots one guest with a VGA display and, in order: takes a
// screenshot, soft-reboots the guest (it boots again in the same QEMU while the launcher keeps
// reporting Running), and checks both actions against a paused guest.
func TestSoftRebootAndScreenshot(t *testing.T) {
	t.Parallel()
	v := newLauncher(t)
	ctx := context.Background()
	req := guestSpec(t)
	req.Machine.Graphics = true
	st, err := v.client.Sync(ctx, req)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	c := attach(t, v.runDir)
	end := c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	// The shell's prompt: busybox init runs, and has told the kernel to hand it Ctrl+Alt+Del
	// (before that, the kernel's default is an immediate restart, without a clean shutdown).
	c.Expect(t, end, "# ", time.Minute)
	pid := st.PID

	t.Run("screenshot is a PNG of the VGA text screen, and leaves no file behind", func(t *testing.T) {
		w, h := screenshot(t, v.client)
		// SeaBIOS leaves the VGA in 80x25 text mode (9x16 cells) and the guest's console is on
		// ttyS0, so no framebuffer driver changes it.
		if w != 720 || h != 400 {
			t.Fatalf("screenshot is %dx%d, want 720x400 (VGA text mode)", w, h)
		}
		left, _ := filepath.Glob(filepath.Join(v.runDir, "screenshot-*"))
		if len(left) != 0 {
			t.Fatalf("screenshot files left in the run directory: %v", left)
		}
	})

	t.Run("soft reboot boots the guest again in the same QEMU, the launcher staying Running", func(t *testing.T) {
		var (
			mu   sync.Mutex
			seen []protocol.Status
		)
		watchCtx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			_ = v.client.Watch(watchCtx, func(s protocol.Status) bool {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, s)
				return true
			})
		}()
		from := len(c.Text())
		start := time.Now()
		if err := v.client.SoftReboot(ctx); err != nil {
			t.Fatalf("soft reboot: %v", err)
		}
		// Graceful: busybox init runs its ctrlaltdel action (/sbin/reboot), which stops the
		// guest's processes before the kernel restarts; then the guest boots again.
		end := c.Expect(t, from, "Requesting system reboot", time.Minute)
		c.Expect(t, end, "QVIRT-GUEST-READY", bootTimeout)
		t.Logf("the guest was back %s after the soft reboot", time.Since(start).Round(time.Millisecond))
		stopWatch()
		<-watched
		st, err := v.client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.PID != pid || st.Phase != protocol.PhaseRunning || st.RunState != "running" || st.Exit != nil {
			t.Fatalf("after the reboot: pid %d (was %d) phase %s runState %s exit %+v; want the same QEMU, Running",
				st.PID, pid, st.Phase, st.RunState, st.Exit)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, s := range seen {
			if s.Phase != protocol.PhaseRunning || s.Exit != nil {
				t.Fatalf("during the reboot the launcher reported phase %s exit %+v", s.Phase, s.Exit)
			}
		}
	})

	t.Run("a paused guest refuses a soft reboot but still has a screenshot", func(t *testing.T) {
		if err := v.client.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		err := v.client.SoftReboot(ctx)
		var ae *launcher.APIError
		if !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Msg != "VMI is paused; unpause it first" {
			t.Fatalf("soft reboot while paused: %v, want 409 \"VMI is paused; unpause it first\"", err)
		}
		if w, h := screenshot(t, v.client); w == 0 || h == 0 {
			t.Fatalf("screenshot while paused is %dx%d", w, h)
		}
		if err := v.client.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		// The refused keys were never sent: the guest does not reboot after the unpause.
		from := len(c.Text())
		c.Send(t, "echo still-$((40+2))")
		c.Expect(t, from, "still-42", time.Minute)
		if strings.Contains(c.Text()[from:], "QVIRT-GUEST-READY") {
			t.Fatal("the guest rebooted after the refused soft reboot")
		}
	})
}

// TestScreenshotWithoutGraphicsIsRefused needs only a started QEMU, not a booted guest.
func TestScreenshotWithoutGraphicsIsRefused(t *testing.T) {
	v := newLauncher(t)
	ctx := context.Background()
	req := guestSpec(t) // autoattachGraphicsDevice: false
	if _, err := v.client.Sync(ctx, req); err != nil {
		t.Fatalf("sync: %v", err)
	}
	_, err := v.client.Screenshot(ctx)
	var ae *launcher.APIError
	if !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Field != "machine.graphics" ||
		!strings.Contains(ae.Msg, "no graphics device") {
		t.Fatalf("screenshot without graphics: %v (%+v), want a 400 naming machine.graphics", err, ae)
	}
}

// screenshot fetches and decodes one screenshot, returning its size.
func screenshot(t *testing.T, c *launcher.Client) (int, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rc, err := c.Screenshot(ctx)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read screenshot: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("screenshot does not decode as PNG (%d bytes): %v", len(data), err)
	}
	b := img.Bounds()
	t.Logf("screenshot: %dx%d, %d bytes", b.Dx(), b.Dy(), len(data))
	return b.Dx(), b.Dy()
}
