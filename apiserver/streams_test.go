package apiserver_test

import (
	"bytes"
	"context"
	"image/png"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"k8s.io/client-go/rest"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// One guest serves every stream test: RBAC on the console and the QMP shell, the console's
// bytes both ways, takeover and a client vanishing mid-stream, QMP reads and writes, pause,
// unpause and screenshot, all through kube-apiserver and qvirt-api to a real handler.
func TestStreams(t *testing.T) {
	e := setup(t)
	podsDir := t.TempDir()
	const node = "node-streams"
	createNode(t, node, startHandler(t, e, node, podsDir))
	vmi := testVMI(t, "guest", node, v1alpha1.Running)
	guest := bootGuest(t, podsDir, vmi)
	view, edit, admin := e.users["view"], e.users["edit"], e.users["admin"]

	t.Run("view is refused the console", func(t *testing.T) {
		_, resp, err := dial(t, view, vmi.Name, sub.Console, sub.SubprotocolPlain)
		if err == nil {
			t.Fatal("the view user opened the console")
		}
		st := status(t, resp)
		if st.Code != http.StatusForbidden || !strings.Contains(st.Message, `"virtualmachineinstances/console"`) || !strings.Contains(st.Message, "view-user") {
			t.Errorf("got %d %q, want 403 naming view-user and virtualmachineinstances/console", st.Code, st.Message)
		}
	})

	t.Run("edit reads and writes the console; a new session takes over", func(t *testing.T) {
		c, resp, err := dial(t, edit, vmi.Name, sub.Console, sub.SubprotocolPlain)
		if err != nil {
			t.Fatalf("console as edit: %v (%s)", err, bodyOf(resp))
		}
		if c.Subprotocol() != sub.SubprotocolPlain {
			t.Errorf("subprotocol %q, want %q", c.Subprotocol(), sub.SubprotocolPlain)
		}
		s := read(c)
		s.Expect(t, 0, "QVIRT-GUEST-READY", 90*time.Second)
		s.Send(t, websocket.MessageBinary, "echo qvirt-$((6*7))\n")
		s.Expect(t, 0, "qvirt-42", 30*time.Second)

		c2, resp, err := dial(t, admin, vmi.Name, sub.Console, sub.SubprotocolPlain)
		if err != nil {
			t.Fatalf("second console as admin: %v (%s)", err, bodyOf(resp))
		}
		code, reason := s.ClosedWith(t, 15*time.Second)
		if code != 4001 || !strings.Contains(reason, "admin-user") {
			t.Errorf("the first session closed with %d %q, want 4001 naming admin-user", code, reason)
		}
		// The admin's client vanishes without a close frame; the next session works.
		_ = c2.CloseNow()
		c3, resp, err := dial(t, edit, vmi.Name, sub.Console, sub.SubprotocolPlain)
		if err != nil {
			t.Fatalf("console after a vanished client: %v (%s)", err, bodyOf(resp))
		}
		s3 := read(c3)
		s3.Send(t, websocket.MessageBinary, "echo again-$((1+1))\n")
		s3.Expect(t, 0, "again-2", 30*time.Second)
		// A message above coder/websocket's default 32 KiB read limit but within qvirt-api's
		// reaches the guest (a large paste): both sides accept the same size.
		big := strings.Repeat(": "+strings.Repeat("p", 98)+"\n", 400) // 40,000 bytes of no-op lines
		s3.Send(t, websocket.MessageBinary, big+"echo pasted-$((3*4))\n")
		s3.Expect(t, 0, "pasted-12", 90*time.Second)
		_ = c3.Close(websocket.StatusNormalClosure, "done")
	})

	t.Run("edit queries QMP but may not write", func(t *testing.T) {
		q := openQMP(t, edit, vmi.Name)
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"s"}`)
		if st := q.Reply(t, "s"); returned(st)["status"] != "running" {
			t.Errorf("query-status: %v", st)
		}
		q.Send(t, websocket.MessageText, `{"execute":"stop","id":"w"}`)
		if desc := errorDesc(q.Reply(t, "w")); !strings.Contains(desc, "virtualmachineinstances/qmp-write") {
			t.Errorf("stop as edit: error %q, want one naming virtualmachineinstances/qmp-write", desc)
		}
		// The handler's refusal before the upgrade reaches the user with its code and message.
		_, resp, err := dial(t, admin, vmi.Name, sub.QMP, sub.SubprotocolQMP)
		if err == nil {
			t.Fatal("a second QMP shell opened")
		}
		if st := status(t, resp); st.Code != http.StatusConflict || !strings.Contains(st.Message, "edit-user") {
			t.Errorf("second QMP shell: %d %q, want 409 naming edit-user", st.Code, st.Message)
		}
		q.Send(t, websocket.MessageText, `{"execute": nope`)
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"s2"}`)
		q.Reply(t, "s2") // the session survives a malformed message
		_ = q.Conn.Close(websocket.StatusNormalClosure, "done")
		logs := e.logs.String()
		for _, want := range []string{`"command"="query-status"`, `"command"="stop"`, `"errorClass"="GenericError"`} {
			if !logLine(logs, `"user"="edit-user"`, want) {
				t.Errorf("no qvirt-api log line naming edit-user with %s in:\n%s", want, testutil.Tail(logs, 3000))
			}
		}
	})

	t.Run("admin may write over QMP", func(t *testing.T) {
		q := openQMP(t, admin, vmi.Name)
		q.Send(t, websocket.MessageText, `{"execute":"stop","id":"w"}`)
		if r := q.Reply(t, "w"); r["error"] != nil {
			t.Fatalf("stop as admin: %v", r)
		}
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"s"}`)
		if st := q.Reply(t, "s"); returned(st)["status"] != "paused" {
			t.Errorf("query-status after stop: %v", st)
		}
		q.Send(t, websocket.MessageText, `{"execute":"cont","id":"c"}`)
		q.Reply(t, "c")
		q.Send(t, websocket.MessageText, `{"execute":"human-monitor-command","arguments":{"command-line":"stop"},"id":"h"}`)
		q.Reply(t, "h")
		q.Send(t, websocket.MessageText, `{"execute":"cont","id":"c2"}`)
		q.Reply(t, "c2")
		_ = q.Conn.Close(websocket.StatusNormalClosure, "done")
		// Both qvirt-api and the handler audit what a write carried, not only its name: the
		// arguments as JSON and an HMP command line on its own.
		for side, logs := range map[string]string{"qvirt-api": e.logs.String(), "handler": e.handlerLogs.String()} {
			if !logLine(logs, `"user"="admin-user"`, `"groups"=[`, `"namespace"="default"`, `"vmi"="default/guest"`,
				`"command"="human-monitor-command"`, `"commandLine"="stop"`, `"arguments"="{\"command-line\":\"stop\"}"`) {
				t.Errorf("no %s audit line naming admin-user, the VMI, human-monitor-command and its arguments in:\n%s", side, testutil.Tail(logs, 4000))
			}
		}
	})

	t.Run("pause, unpause and screenshot through the handler", func(t *testing.T) {
		if code, body := put(t, view, sub.VirtualMachineInstances, vmi.Name, sub.Pause, ""); code != http.StatusForbidden {
			t.Errorf("pause as view: %d %s", code, body)
		}
		for _, action := range []string{sub.Pause, sub.Unpause} {
			if code, body := put(t, edit, sub.VirtualMachineInstances, vmi.Name, action, ""); code != http.StatusOK {
				t.Errorf("%s as edit: %d %s", action, code, body)
			}
		}
		code, data, hdr := get(t, edit, sub.Path(testNS, sub.VirtualMachineInstances, vmi.Name, sub.Screenshot))
		if code != http.StatusOK || hdr.Get("Content-Type") != "image/png" {
			t.Fatalf("screenshot: %d %s %.300q", code, hdr.Get("Content-Type"), data)
		}
		img, err := png.Decode(bytes.NewReader(data))
		if err != nil || img.Bounds().Dx() < 320 {
			t.Errorf("screenshot: not a PNG of a screen: %v", err)
		}
	})

	t.Run("VNC", func(t *testing.T) {
		c, resp, err := dial(t, edit, vmi.Name, sub.VNC, sub.SubprotocolPlain)
		if err != nil {
			t.Fatalf("vnc as edit: %v (%s)", err, bodyOf(resp))
		}
		read(c).Expect(t, 0, "RFB 003.008", 10*time.Second)
		_ = c.Close(websocket.StatusNormalClosure, "done")
	})

	t.Run("USB redirection", func(t *testing.T) {
		if _, resp, err := dial(t, view, vmi.Name, sub.USBRedir, sub.SubprotocolPlain); err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("usbredir as view: %v (%s), want 403", err, bodyOf(resp))
		}
		// Each of the four slots takes one device: QEMU greets each client as usbredir's guest.
		var open []*websocket.Conn
		for i := range 4 {
			c, resp, err := dial(t, edit, vmi.Name, sub.USBRedir, sub.SubprotocolPlain)
			if err != nil {
				t.Fatalf("usbredir %d as edit: %v (%s)", i, err, bodyOf(resp))
			}
			read(c).Expect(t, 0, "qemu usb-redir guest", 10*time.Second)
			open = append(open, c)
		}
		_, resp, err := dial(t, edit, vmi.Name, sub.USBRedir, sub.SubprotocolPlain)
		if body := bodyOf(resp); err == nil || resp.StatusCode != http.StatusConflict || !strings.Contains(body, "all 4 USB redirection slots of VMI default/guest are in use") {
			t.Errorf("a fifth usbredir: %v (%s), want 409 saying the slots are in use", err, body)
		}
		// A client that leaves frees its slot for the next.
		_ = open[2].Close(websocket.StatusNormalClosure, "done")
		testutil.Eventually(t, 10*time.Second, "a freed slot", func() bool {
			c, _, err := dial(t, edit, vmi.Name, sub.USBRedir, sub.SubprotocolPlain)
			if err == nil {
				read(c).Expect(t, 0, "qemu usb-redir guest", 10*time.Second)
				_ = c.Close(websocket.StatusNormalClosure, "done")
			}
			return err == nil
		})
		for _, c := range open {
			_ = c.Close(websocket.StatusNormalClosure, "done")
		}
	})

	// Last: the guest goes away under an open console; the user learns it with the handler's code.
	t.Run("QEMU exits under an open console", func(t *testing.T) {
		c, resp, err := dial(t, edit, vmi.Name, sub.Console, sub.SubprotocolPlain)
		if err != nil {
			t.Fatalf("console as edit: %v (%s)", err, bodyOf(resp))
		}
		s := read(c)
		st, err := guest.Status(context.Background())
		if err != nil || st.PID <= 0 {
			t.Fatalf("launcher status: %+v %v", st, err)
		}
		_ = syscall.Kill(st.PID, syscall.SIGKILL)
		code, reason := s.ClosedWith(t, 15*time.Second)
		if code != websocket.StatusNormalClosure || reason == "" {
			t.Errorf("closed with %d %q, want 1000 with the handler's reason", code, reason)
		}
	})
}

// openQMP opens a QMP shell as the user of cfg and negotiates capabilities. The handler serves one
// shell per VMI, so a shell just closed may still hold it for a moment.
func openQMP(t *testing.T, cfg *rest.Config, name string) *stream {
	t.Helper()
	var c *websocket.Conn
	testutil.Eventually(t, 10*time.Second, "a QMP shell", func() bool {
		var err error
		c, _, err = dial(t, cfg, name, sub.QMP, sub.SubprotocolQMP)
		return err == nil
	})
	q := read(c)
	q.Expect(t, 0, `"QMP"`, 10*time.Second)
	q.Send(t, websocket.MessageText, `{"execute":"qmp_capabilities","id":"cap"}`)
	q.Reply(t, "cap")
	return q
}

func returned(m map[string]any) map[string]any {
	r, _ := m["return"].(map[string]any)
	return r
}

func errorDesc(m map[string]any) string {
	e, _ := m["error"].(map[string]any)
	d, _ := e["desc"].(string)
	return d
}

// logLine is true when one line of logs holds every string of want.
func logLine(logs string, want ...string) bool {
	for _, line := range strings.Split(logs, "\n") {
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(line, w)
		}
		if ok {
			return true
		}
	}
	return false
}

func bodyOf(resp *http.Response) string {
	if resp == nil {
		return "no response"
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.Status + ": " + b.String()
}
