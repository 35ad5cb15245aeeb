package streams_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/handler/streams"
	"github.com/qvirt/qvirt/launcher/protocol"
)

const bootTimeout = 3 * time.Minute

// TestGuestStreams boots one guest and drives its console, VNC, QMP shell and actions through the
// stream server, in order (later steps rely on the guest state earlier ones left).
func TestGuestStreams(t *testing.T) {
	p := newPKI(t)
	podsDir := t.TempDir()
	srv := startServer(t, podsDir, p, nil)
	vmi := createVMI(t, "guest-streams", nil)
	g := bootGuest(t, podsDir, vmi)
	ctx := context.Background()

	// Attach right away: the guest prints its banner once, some seconds into the boot.
	con := read(srv.mustDial(t, vmi, streams.Console, alice, streams.SubprotocolPlain))

	t.Run("console shows the guest's banner and runs a typed command", func(t *testing.T) {
		end := con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
		end = con.Expect(t, end, "# ", time.Minute) // the shell's prompt
		con.Send(t, websocket.MessageBinary, "echo qvirt-$((6*7))\n")
		con.Expect(t, end, "qvirt-42", time.Minute)
		if types := con.Types(); types[websocket.MessageText] != 0 || types[websocket.MessageBinary] == 0 {
			t.Fatalf("console frames by type: %v, want only binary", types)
		}
	})

	t.Run("a second console session takes over and the first is told why", func(t *testing.T) {
		bob := read(srv.mustDial(t, vmi, streams.Console, caller{user: "bob"}, streams.SubprotocolPlain))
		code, reason := con.ClosedWith(t, 10*time.Second)
		if code != streams.StatusTakenOver || !strings.Contains(reason, `"bob"`) {
			t.Fatalf("first session closed with %d %q, want %d naming bob", code, reason, streams.StatusTakenOver)
		}
		bob.Send(t, websocket.MessageBinary, "echo again-$((1+1))\n")
		bob.Expect(t, 0, "again-2", time.Minute)
		con = bob
	})

	t.Run("VNC greets with RFB 003.008", func(t *testing.T) {
		vnc := read(srv.mustDial(t, vmi, streams.VNC, alice, streams.SubprotocolPlain))
		vnc.Expect(t, 0, "RFB 003.008\n", 30*time.Second)
		if got := vnc.Bytes.String(); !strings.HasPrefix(got, "RFB 003.008\n") {
			t.Fatalf("VNC stream starts with %q", got)
		}
		if err := vnc.Conn.Close(websocket.StatusNormalClosure, "done"); err != nil {
			t.Fatalf("close VNC: %v", err)
		}
	})

	t.Run("read-only QMP shell answers queries and refuses stop, staying up", func(t *testing.T) {
		q := read(srv.mustDial(t, vmi, streams.QMP, alice, streams.SubprotocolQMP))
		greeting, _ := q.Find(t, 0, "the QMP greeting", 30*time.Second, func(m map[string]any) bool { return m["QMP"] != nil })
		if v := greeting["QMP"].(map[string]any)["version"]; v == nil {
			t.Fatalf("greeting without version: %v", greeting)
		}
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"early"}`)
		if e := errorOf(q.Reply(t, "early")); e["class"] != "CommandNotFound" {
			t.Fatalf("command before qmp_capabilities: %v, want CommandNotFound", e)
		}
		q.Send(t, websocket.MessageText, `{"execute":"qmp_capabilities","id":"caps"}`)
		if r := q.Reply(t, "caps"); r["return"] == nil {
			t.Fatalf("qmp_capabilities: %v", r)
		}
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"s1"}`)
		if st := statusOf(t, q.Reply(t, "s1")); st != "running" {
			t.Fatalf("query-status: %s, want running", st)
		}

		q.Send(t, websocket.MessageText, `{"execute":"stop","id":"stop1"}`)
		e := errorOf(q.Reply(t, "stop1"))
		desc, _ := e["desc"].(string)
		if e["class"] != "GenericError" || !strings.Contains(desc, `"stop"`) || !strings.Contains(desc, "qmp-write") || !strings.Contains(desc, "alice") {
			t.Fatalf("stop without write permission: %v, want a GenericError naming stop, alice and qmp-write", e)
		}
		// Pipelined: the refusal queued behind a forwarded command keeps the client's order.
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"s2"}`)
		q.Send(t, websocket.MessageText, `{"execute":"system_reset","id":"reset"}`)
		q.Send(t, websocket.MessageText, `{not json`)
		q.Send(t, websocket.MessageText, `{"execute":"human-monitor-command","arguments":{"command-line":"info status"},"id":"hmp"}`)
		_, iS2 := q.Find(t, 0, "s2", 30*time.Second, func(m map[string]any) bool { return m["id"] == "s2" })
		_, iReset := q.Find(t, 0, "reset", 30*time.Second, func(m map[string]any) bool { return m["id"] == "reset" })
		if iReset < iS2 {
			t.Fatalf("the refusal of system_reset (message %d) overtook query-status's reply (message %d)", iReset, iS2)
		}
		if st := statusOf(t, q.Reply(t, "s2")); st != "running" {
			t.Fatalf("guest is %s after a refused stop, want running", st)
		}
		malformed, _ := q.Find(t, 0, "the reply to malformed JSON", 30*time.Second, func(m map[string]any) bool {
			d, _ := errorOf(m)["desc"].(string)
			return strings.Contains(d, "JSON parse error")
		})
		if malformed["id"] != nil {
			t.Fatalf("reply to malformed JSON has an id: %v", malformed)
		}
		if ret, _ := q.Reply(t, "hmp")["return"].(string); !strings.Contains(ret, "running") {
			t.Fatalf("HMP info status: %q", ret)
		}

		_, resp, err := srv.dial(t, vmi, streams.QMP, caller{user: "carol"}, streams.SubprotocolQMP)
		if err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
			t.Fatalf("a second QMP session: %v %s, want 409", err, body(resp))
		}
		if b := body(resp); !strings.Contains(b, `\"alice\"`) {
			t.Fatalf("409 does not name the user holding the shell: %s", b)
		}
		if err := q.Conn.Close(websocket.StatusNormalClosure, "done"); err != nil {
			t.Fatalf("close QMP: %v", err)
		}
	})

	t.Run("QMP shell with write permission stops and continues the guest, with events", func(t *testing.T) {
		var q *stream
		// The previous session's release races with this dial by a few microseconds.
		waitFor(t, 5*time.Second, "the QMP shell to be free", func() bool {
			c, _, err := srv.dial(t, vmi, streams.QMP, caller{user: "root-op", write: true}, streams.SubprotocolQMP)
			if err == nil {
				q = read(c)
			}
			return err == nil
		})
		q.Send(t, websocket.MessageText, `{"execute":"qmp_capabilities","id":"caps"}`)
		q.Reply(t, "caps")
		q.Send(t, websocket.MessageText, `{"execute":"stop","id":"stop"}`)
		if r := q.Reply(t, "stop"); r["return"] == nil {
			t.Fatalf("stop with write permission: %v", r)
		}
		q.Event(t, "STOP")
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"s"}`)
		if st := statusOf(t, q.Reply(t, "s")); st != "paused" {
			t.Fatalf("after stop the guest is %s, want paused", st)
		}
		q.Send(t, websocket.MessageText, `{"execute":"cont","id":"cont"}`)
		q.Reply(t, "cont")
		q.Event(t, "RESUME")
		q.Send(t, websocket.MessageText, `{"execute":"query-status","id":"s3"}`)
		if st := statusOf(t, q.Reply(t, "s3")); st != "running" {
			t.Fatalf("after cont the guest is %s, want running", st)
		}
		_ = q.Conn.Close(websocket.StatusNormalClosure, "done")
	})

	t.Run("pause and unpause actions pause and resume the guest", func(t *testing.T) {
		code, st, err := srv.do(t, http.MethodPut, pathOf(vmi, streams.Pause), alice, &p.client.tls)
		if err != nil || code != http.StatusOK || st.Status != "Success" {
			t.Fatalf("pause: %d %+v %v", code, st, err)
		}
		if ls, err := g.client.Status(ctx); err != nil || !ls.Paused {
			t.Fatalf("after pause the launcher says paused=%v (%v)", ls.Paused, err)
		}
		code, st, err = srv.do(t, http.MethodPut, pathOf(vmi, streams.Unpause), alice, &p.client.tls)
		if err != nil || code != http.StatusOK {
			t.Fatalf("unpause: %d %+v %v", code, st, err)
		}
		if ls, err := g.client.Status(ctx); err != nil || ls.Paused {
			t.Fatalf("after unpause the launcher says paused=%v (%v)", ls.Paused, err)
		}
		// A second unpause is refused, as in KubeVirt.
		code, st, err = srv.do(t, http.MethodPut, pathOf(vmi, streams.Unpause), alice, &p.client.tls)
		if err != nil || code != http.StatusConflict || !strings.Contains(st.Message, "VMI is not paused") {
			t.Fatalf("unpause of a running guest: %d %+v %v, want 409 saying it is not paused", code, st, err)
		}
	})

	t.Run("screenshot answers a PNG of the VGA text screen", func(t *testing.T) {
		// SeaBIOS leaves the VGA in 80x25 text mode (9x16 cells); the guest's console is ttyS0.
		if w, h := getScreenshot(t, srv, vmi, alice, &p.client.tls); w != 720 || h != 400 {
			t.Fatalf("screenshot is %dx%d, want 720x400", w, h)
		}
	})

	t.Run("soft reboot is refused while paused, then reboots the guest in the same QEMU", func(t *testing.T) {
		before, err := g.client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if code, st, err := srv.do(t, http.MethodPut, pathOf(vmi, streams.Pause), alice, &p.client.tls); err != nil || code != http.StatusOK {
			t.Fatalf("pause: %d %+v %v", code, st, err)
		}
		code, st, err := srv.do(t, http.MethodPut, pathOf(vmi, streams.SoftReboot), alice, &p.client.tls)
		if err != nil || code != http.StatusConflict || st.Reason != metav1.StatusReasonConflict || !strings.Contains(st.Message, "VMI is paused; unpause it first") {
			t.Fatalf("soft reboot while paused: %d %+v %v, want 409 saying to unpause first", code, st, err)
		}
		if code, st, err := srv.do(t, http.MethodPut, pathOf(vmi, streams.Unpause), alice, &p.client.tls); err != nil || code != http.StatusOK {
			t.Fatalf("unpause: %d %+v %v", code, st, err)
		}
		// The takeover subtest's session ended with it: a console of our own, released at the end
		// (QEMU's serial socket serves one client at a time).
		c := read(srv.mustDial(t, vmi, streams.Console, alice, streams.SubprotocolPlain))
		defer func() {
			_ = c.Conn.Close(websocket.StatusNormalClosure, "done")
			<-c.Closed()
		}()
		code, st, err = srv.do(t, http.MethodPut, pathOf(vmi, streams.SoftReboot), alice, &p.client.tls)
		if err != nil || code != http.StatusOK || st.Status != metav1.StatusSuccess {
			t.Fatalf("soft reboot: %d %+v %v", code, st, err)
		}
		// Graceful: the guest's init stops its processes before the kernel restarts.
		end := c.Expect(t, 0, "Requesting system reboot", time.Minute)
		end = c.Expect(t, end, "QVIRT-GUEST-READY", bootTimeout)
		c.Expect(t, end, "# ", time.Minute) // the shell is back for the next subtests
		after, err := g.client.Status(ctx)
		if err != nil || after.PID != before.PID || after.Phase != protocol.PhaseRunning || after.RunState != "running" {
			t.Fatalf("after the soft reboot: %+v (%v); want QEMU %d still Running", after, err, before.PID)
		}
	})

	t.Run("a handler shutting down closes streams with 1001", func(t *testing.T) {
		// QEMU's serial socket serves one client at a time: let go of it first.
		// (The takeover subtest's cleanup may already have closed it.)
		_ = con.Conn.Close(websocket.StatusNormalClosure, "done")
		<-con.Closed()
		other := startServer(t, podsDir, p, nil)
		c := read(other.mustDial(t, vmi, streams.Console, alice, streams.SubprotocolPlain))
		c.Send(t, websocket.MessageBinary, "echo other-$((2+3))\n")
		c.Expect(t, 0, "other-5", time.Minute)
		other.shutdown(t)
		if code, reason := c.ClosedWith(t, 10*time.Second); code != websocket.StatusGoingAway {
			t.Fatalf("on shutdown the console closed with %d %q, want 1001", code, reason)
		}
	})

	t.Run("QEMU exiting closes the console with 1000 and a reason", func(t *testing.T) {
		c := read(srv.mustDial(t, vmi, streams.Console, alice, streams.SubprotocolPlain))
		if err := g.client.Kill(ctx); err != nil {
			t.Fatalf("kill: %v", err)
		}
		code, reason := c.ClosedWith(t, 30*time.Second)
		if code != websocket.StatusNormalClosure || !strings.Contains(reason, "QEMU exited") {
			t.Fatalf("console closed with %d %q, want 1000 saying QEMU exited", code, reason)
		}
	})
}

func errorOf(m map[string]any) map[string]any {
	e, _ := m["error"].(map[string]any)
	return e
}

func statusOf(t *testing.T, reply map[string]any) string {
	t.Helper()
	ret, ok := reply["return"].(map[string]any)
	if !ok {
		t.Fatalf("query-status: %v", reply)
	}
	return fmt.Sprint(ret["status"])
}
