package qmp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qvirt/qvirt/qmp"
	"github.com/qvirt/qvirt/qmp/qmptest"
)

// testTimeout bounds every fake-server scenario; a deadlock fails the test
// instead of hanging the suite.
const testTimeout = 10 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// connect dials a fresh fake server and returns both ends.
func connect(t *testing.T, opts ...qmptest.Option) (*qmp.Monitor, *qmptest.Conn) {
	t.Helper()
	ctx := testContext(t)
	srv := qmptest.NewServer(t, opts...)
	m, err := qmp.Dial(ctx, srv.Path)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	c, err := srv.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	return m, c
}

// serve answers requests with h on a goroutine until the connection ends.
// Handler failures are reported after the test body, from the test
// goroutine.
func serve(t *testing.T, c *qmptest.Conn, h qmptest.Handler) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- c.Serve(h) }()
	t.Cleanup(func() {
		_ = c.Close()
		if err := <-errc; err != nil {
			t.Errorf("fake server: %v", err)
		}
	})
}

// replyEmpty answers every request with {}.
// async runs f on a goroutine and returns its result on a channel.
func async[T any](f func() T) <-chan T {
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	return ch
}

func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testTimeout):
		t.Fatal("timed out")
		panic("unreachable")
	}
}

func TestDialHandshake(t *testing.T) {
	m, _ := connect(t, qmptest.WithGreeting(7, 2, 22, "Debian 1:7.2+dfsg-7", "oob"))
	v := m.Version()
	if v.String() != "7.2.22" || v.Package != "Debian 1:7.2+dfsg-7" {
		t.Errorf("Version() = %s %q, want 7.2.22 \"Debian 1:7.2+dfsg-7\"", v, v.Package)
	}
	if caps := m.Capabilities(); len(caps) != 1 || caps[0] != "oob" {
		t.Errorf("Capabilities() = %v, want [oob]", caps)
	}
	if err := m.Connect(); err != nil {
		t.Errorf("Connect() on a live monitor = %v, want nil", err)
	}
}

// Out-of-band execution is enabled where the greeting offers it, and ExecuteOOB then sends
// exec-oob; where it is not offered, ExecuteOOB runs the command in band.
func TestExecuteOOB(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offered []string
		want    string // how the command is sent
	}{
		{"offered", []string{"oob"}, "exec-oob"},
		{"not offered", nil, "execute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			m, c := connect(t, qmptest.WithGreeting(7, 2, 0, "", tc.offered...))
			if !slices.Equal(c.Enabled, tc.offered) {
				t.Errorf("the client enabled %v, want %v", c.Enabled, tc.offered)
			}
			got := async(func() error {
				_, err := m.ExecuteOOB(ctx, "migrate-recover", map[string]string{"uri": "tcp:127.0.0.1:4444"})
				return err
			})
			req, err := c.ReadRequest()
			if err != nil {
				t.Fatal(err)
			}
			sent := "execute"
			if req.ExecOOB != "" {
				sent = "exec-oob"
			}
			if sent != tc.want || req.Execute+req.ExecOOB != "migrate-recover" || len(req.ID) == 0 {
				t.Errorf("sent %+v, want migrate-recover by %s with an id", req, tc.want)
			}
			if err := c.Reply(req, struct{}{}); err != nil {
				t.Fatal(err)
			}
			if err := receive(t, got); err != nil {
				t.Errorf("ExecuteOOB: %v", err)
			}
		})
	}
}

// An event ahead of the greeting is passed over: the handshake completes and nothing is lost.
func TestDialSkipsEventsBeforeGreeting(t *testing.T) {
	ctx := testContext(t)
	srv := qmptest.NewServer(t, qmptest.WithoutHandshake())
	scripted := async(func() error {
		c, err := srv.Accept(ctx)
		if err != nil {
			return err
		}
		if err := c.SendEvent("RESUME", nil); err != nil {
			return err
		}
		if err := c.WriteRaw([]byte(`{"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}, "package": ""}, "capabilities": []}}`)); err != nil {
			return err
		}
		req, err := c.ReadRequest()
		if err != nil {
			return err
		}
		return c.Reply(req, struct{}{})
	})
	m, err := qmp.Dial(ctx, srv.Path)
	if err != nil {
		t.Fatalf("Dial with an event before the greeting: %v", err)
	}
	defer m.Close()
	if v := m.Version(); v.String() != "7.2.0" {
		t.Errorf("Version() = %s, want 7.2.0", v)
	}
	if err := receive(t, scripted); err != nil {
		t.Fatal(err)
	}
}

func TestDialRejectsBadHandshake(t *testing.T) {
	tests := []struct {
		name   string
		script func(c *qmptest.Conn) error
		want   string
	}{
		{
			name:   "reply before greeting",
			script: func(c *qmptest.Conn) error { return c.WriteRaw([]byte(`{"return": {}}`)) },
			want:   "got a return message first",
		},
		{
			name: "only events",
			script: func(c *qmptest.Conn) error {
				for range 9 {
					if err := c.WriteRaw([]byte(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 0}}`)); err != nil {
						return err
					}
				}
				return nil
			},
			want: "more than 8 events and no greeting",
		},
		{
			name:   "not JSON",
			script: func(c *qmptest.Conn) error { return c.WriteRaw([]byte(`QEMU says hi`)) },
			want:   "read greeting",
		},
		{
			name: "capabilities refused",
			script: func(c *qmptest.Conn) error {
				if err := c.WriteRaw([]byte(`{"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}, "package": ""}, "capabilities": []}}`)); err != nil {
					return err
				}
				req, err := c.ReadRequest()
				if err != nil {
					return err
				}
				return c.ReplyError(req, qmp.ClassCommandNotFound, "Capabilities negotiation is already complete")
			},
			want: "qmp qmp_capabilities: CommandNotFound",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			srv := qmptest.NewServer(t, qmptest.WithoutHandshake())
			scripted := async(func() error {
				c, err := srv.Accept(ctx)
				if err != nil {
					return err
				}
				return tt.script(c)
			})
			m, err := qmp.Dial(ctx, srv.Path)
			if err == nil {
				_ = m.Close()
				t.Fatal("Dial succeeded, want error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Dial error = %q, want it to contain %q", err, tt.want)
			}
			if err := receive(t, scripted); err != nil {
				t.Errorf("script: %v", err)
			}
		})
	}
}

func TestDialNoSocket(t *testing.T) {
	_, err := qmp.Dial(testContext(t), filepath.Join(t.TempDir(), "missing.sock"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Dial(missing) = %v, want an error wrapping ErrNotExist", err)
	}
}

func TestDialTimesOutWithoutGreeting(t *testing.T) {
	srv := qmptest.NewServer(t, qmptest.WithoutHandshake())
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := qmp.Dial(ctx, srv.Path)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial to a silent server = %v, want DeadlineExceeded", err)
	}
}

func TestRepliesMatchedByID(t *testing.T) {
	m, c := connect(t)
	ctx := testContext(t)
	type result struct {
		ret json.RawMessage
		err error
	}
	first := async(func() result {
		r, err := m.Execute(ctx, "query-first", nil)
		return result{r, err}
	})
	second := async(func() result {
		r, err := m.Execute(ctx, "query-second", nil)
		return result{r, err}
	})
	reqs := map[string]qmptest.Request{}
	for range 2 {
		req, err := c.ReadRequest()
		if err != nil {
			t.Fatal(err)
		}
		reqs[req.Execute] = req
	}
	// Answer in the opposite order of arrival neither caller controls.
	for _, name := range []string{"query-second", "query-first"} {
		if err := c.Reply(reqs[name], name+"-reply"); err != nil {
			t.Fatal(err)
		}
	}
	for name, ch := range map[string]<-chan result{"query-first": first, "query-second": second} {
		r := receive(t, ch)
		if r.err != nil {
			t.Fatalf("%s: %v", name, r.err)
		}
		if want := `"` + name + `-reply"`; string(r.ret) != want {
			t.Errorf("%s got %s, want %s", name, r.ret, want)
		}
	}
}

func TestLargeReply(t *testing.T) {
	m, c := connect(t)
	big := strings.Repeat("0123456789abcdef", 300*1024/16) // 300 KiB
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		return c.Reply(req, map[string]string{"blob": big})
	})
	var out struct{ Blob string }
	if err := m.Call(testContext(t), "query-qmp-schema", nil, &out); err != nil {
		t.Fatal(err)
	}
	if out.Blob != big {
		t.Errorf("reply of %d bytes came back as %d bytes", len(big), len(out.Blob))
	}
}

func TestUndrainedEventsDoNotBlockReplies(t *testing.T) {
	m, c := connect(t)
	const events = 5000
	sub := m.Subscribe(4)
	defer sub.Close()
	// go-qemu's Events: nobody reads it either.
	if _, err := m.Events(testContext(t)); err != nil {
		t.Fatal(err)
	}
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		for i := range events {
			if err := c.SendEvent("TEST", map[string]int{"seq": i}); err != nil {
				return err
			}
		}
		return c.Reply(req, struct{}{})
	})
	if _, err := m.Execute(testContext(t), "cont", nil); err != nil {
		t.Fatal(err)
	}
	// The newest events survive, in order.
	for i := events - 4; i < events; i++ {
		ev := receive(t, sub.Events())
		if got := int(ev.Data["seq"].(float64)); got != i {
			t.Fatalf("buffered event seq %d, want %d", got, i)
		}
	}
	if got := sub.Dropped(); got != events-4 {
		t.Errorf("Dropped() = %d, want %d", got, events-4)
	}
}

func TestContextCancelsPendingCommand(t *testing.T) {
	m, c := connect(t)
	ctx, cancel := context.WithCancel(testContext(t))
	done := async(func() error {
		_, err := m.Execute(ctx, "query-slow", nil)
		return err
	})
	slow, err := c.ReadRequest()
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := receive(t, done); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Execute = %v, want context.Canceled", err)
	}
	// The late reply is discarded; the connection stays usable.
	if err := c.Reply(slow, "late"); err != nil {
		t.Fatal(err)
	}
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error { return c.Reply(req, "fresh") })
	ret, err := m.Execute(testContext(t), "query-next", nil)
	if err != nil || string(ret) != `"fresh"` {
		t.Errorf("Execute after cancel = %s, %v; want \"fresh\"", ret, err)
	}
}

func TestDeadlineExceeded(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(*qmptest.Conn, qmptest.Request) error { return nil }) // never answers
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := m.Cont(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "qmp cont: ") {
		t.Errorf("Cont past deadline = %v, want \"qmp cont: \" wrapping DeadlineExceeded", err)
	}
}

func TestQMPErrorIsTyped(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		return c.ReplyError(req, qmp.ClassDeviceNotFound, "Device 'disk9' not found")
	})
	err := m.DeviceDel(testContext(t), "disk9")
	var qerr *qmp.Error
	if !errors.As(err, &qerr) {
		t.Fatalf("DeviceDel error %v (%T) is not a *qmp.Error", err, err)
	}
	if qerr.Class != qmp.ClassDeviceNotFound || qerr.Desc != "Device 'disk9' not found" {
		t.Errorf("error = %+v", qerr)
	}
	if want := "qmp device_del: DeviceNotFound: Device 'disk9' not found"; err.Error() != want {
		t.Errorf("error text = %q, want %q", err, want)
	}
}

func TestConnectionDropFailsEverything(t *testing.T) {
	m, c := connect(t)
	ctx := testContext(t)
	sub := m.Subscribe(1)
	waiter := m.NewWaiter(qmp.EventShutdown, nil)
	const pending = 3
	results := make([]<-chan error, pending)
	for i := range results {
		results[i] = async(func() error { return m.Stop(ctx) })
	}
	for range pending {
		if _, err := c.ReadRequest(); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Close()
	for _, ch := range results {
		err := receive(t, ch)
		if !errors.Is(err, qmp.ErrDisconnected) || !errors.Is(err, io.EOF) {
			t.Errorf("pending call = %v, want ErrDisconnected wrapping io.EOF", err)
		}
	}
	receive(t, m.Done())
	if err := m.Err(); !errors.Is(err, qmp.ErrDisconnected) {
		t.Errorf("Err() = %v, want ErrDisconnected", err)
	}
	if _, ok := <-sub.Events(); ok {
		t.Error("subscription channel still open after disconnect")
	}
	if _, err := waiter.Wait(ctx); !errors.Is(err, qmp.ErrDisconnected) {
		t.Errorf("Waiter.Wait = %v, want ErrDisconnected", err)
	}
	if err := m.Cont(ctx); !errors.Is(err, qmp.ErrDisconnected) {
		t.Errorf("call after disconnect = %v, want ErrDisconnected", err)
	}
	if err := m.Connect(); !errors.Is(err, qmp.ErrDisconnected) {
		t.Errorf("Connect() after disconnect = %v, want ErrDisconnected", err)
	}
}

func TestMalformedStreamDisconnects(t *testing.T) {
	m, c := connect(t)
	done := async(func() error { return m.Cont(testContext(t)) })
	if _, err := c.ReadRequest(); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteRaw([]byte(`{"return": }`)); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, done); !errors.Is(err, qmp.ErrDisconnected) {
		t.Errorf("call answered by garbage = %v, want ErrDisconnected", err)
	}
}

func TestUnrecognisedMessagesAreSkipped(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		for _, raw := range []string{`{"hello": 1}`, `[1, 2]`, `"text"`, `{"event": 3}`, `{"return": {}, "id": "no-such-id"}`} {
			if err := c.WriteRaw([]byte(raw)); err != nil {
				return err
			}
		}
		return c.Reply(req, "ok")
	})
	if ret, err := m.Execute(testContext(t), "query-x", nil); err != nil || string(ret) != `"ok"` {
		t.Errorf("Execute = %s, %v; want \"ok\"", ret, err)
	}
}

func TestCloseIsIdempotentAndFailsPending(t *testing.T) {
	m, c := connect(t)
	ctx := testContext(t)
	done := async(func() error { return m.Stop(ctx) })
	if _, err := c.ReadRequest(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { _ = m.Close() })
	}
	wg.Wait()
	if err := m.Close(); err != nil {
		t.Errorf("repeated Close() = %v, want nil", err)
	}
	if err := receive(t, done); !errors.Is(err, qmp.ErrClosed) {
		t.Errorf("pending call after Close = %v, want ErrClosed", err)
	}
	if err := m.Disconnect(); err != nil {
		t.Errorf("Disconnect after Close = %v, want nil", err)
	}
	if _, err := m.Events(ctx); !errors.Is(err, qmp.ErrClosed) {
		t.Errorf("Events after Close = %v, want ErrClosed", err)
	}
	if _, ok := <-m.Subscribe(1).Events(); ok {
		t.Error("Subscribe after Close gave an open channel")
	}
}

func TestExecuteAndWaitCatchesEarlyEvent(t *testing.T) {
	m, c := connect(t)
	// Like QEMU 7.2's quit: the event comes before the reply.
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		if err := c.SendEvent(qmp.EventShutdown, map[string]any{"guest": false, "reason": "host-qmp-quit"}); err != nil {
			return err
		}
		return c.Reply(req, struct{}{})
	})
	_, ev, err := m.ExecuteAndWait(testContext(t), "quit", nil, qmp.EventShutdown, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Data["reason"] != "host-qmp-quit" {
		t.Errorf("SHUTDOWN data = %v", ev.Data)
	}
}

func TestWaitEventMatch(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		if err := c.Reply(req, struct{}{}); err != nil {
			return err
		}
		for _, dev := range []string{"nic0", "disk0"} {
			if err := c.SendEvent(qmp.EventDeviceDeleted, map[string]string{"device": dev, "path": "/machine/peripheral/" + dev}); err != nil {
				return err
			}
		}
		return nil
	})
	if err := m.DeviceDelAndWait(testContext(t), "disk0"); err != nil {
		t.Fatal(err)
	}
}

func TestWaiterSurvivesPanickingMatch(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		if err := c.SendEvent(qmp.EventStop, nil); err != nil {
			return err
		}
		return c.Reply(req, struct{}{})
	})
	ctx := testContext(t)
	_, _, err := m.ExecuteAndWait(ctx, "stop", nil, qmp.EventStop, func(ev gqmp.Event) bool {
		return ev.Data["missing"].(string) == "" // nil map lookup, then a failed assertion
	})
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("ExecuteAndWait with panicking match = %v, want a panic error", err)
	}
	if err := m.Cont(ctx); err != nil {
		t.Errorf("monitor unusable after a panicking match: %v", err)
	}
}

func TestWaiterCancelAndContext(t *testing.T) {
	m, _ := connect(t)
	w := m.NewWaiter(qmp.EventResume, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := w.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past deadline = %v, want DeadlineExceeded", err)
	}
	w.Cancel()
	w.Cancel()
	if _, err := w.Wait(testContext(t)); !errors.Is(err, qmp.ErrWaiterCancelled) {
		t.Errorf("Wait after Cancel = %v, want ErrWaiterCancelled", err)
	}
}

func TestSubscriptionsSeeEventsInOrder(t *testing.T) {
	m, c := connect(t)
	a, b := m.Subscribe(16), m.Subscribe(16)
	defer a.Close()
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		for _, name := range []string{qmp.EventStop, qmp.EventResume, qmp.EventPowerdown} {
			if err := c.SendEvent(name, nil); err != nil {
				return err
			}
		}
		return c.Reply(req, struct{}{})
	})
	if err := m.Cont(testContext(t)); err != nil {
		t.Fatal(err)
	}
	b.Close()
	b.Close()
	for _, want := range []string{qmp.EventStop, qmp.EventResume, qmp.EventPowerdown} {
		if ev := receive(t, a.Events()); ev.Event != want {
			t.Errorf("event %s, want %s", ev.Event, want)
		}
	}
	if a.Dropped() != 0 {
		t.Errorf("Dropped() = %d, want 0", a.Dropped())
	}
}

func TestLegacyEventsClosesWithContext(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		if err := c.SendEvent(qmp.EventResume, nil); err != nil {
			return err
		}
		return c.Reply(req, struct{}{})
	})
	ctx, cancel := context.WithCancel(testContext(t))
	events, err := m.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Cont(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if ev := receive(t, events); ev.Event != qmp.EventResume {
		t.Errorf("event %s, want RESUME", ev.Event)
	}
	cancel()
	for range events { // must end
	}
}

func TestLegacyRun(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		if req.Execute == "nosuch" {
			return c.ReplyError(req, qmp.ClassCommandNotFound, "The command nosuch has not been found")
		}
		return c.Reply(req, json.RawMessage(req.Arguments))
	})
	var mon gqmp.Monitor = m
	out, err := mon.Run([]byte(`{"execute": "echo", "arguments": {"a": 1}, "id": "caller-id"}`))
	if err != nil {
		t.Fatal(err)
	}
	var reply struct {
		Return map[string]int `json:"return"`
	}
	if err := json.Unmarshal(out, &reply); err != nil || reply.Return["a"] != 1 {
		t.Errorf("Run reply %s (%v), want the whole reply with return {\"a\":1}", out, err)
	}
	_, err = mon.Run([]byte(`{"execute": "nosuch"}`))
	var qerr *qmp.Error
	if !errors.As(err, &qerr) || qerr.Class != qmp.ClassCommandNotFound {
		t.Errorf("Run(nosuch) = %v, want CommandNotFound", err)
	}
	if _, err := mon.Run([]byte(`{"arguments": {}}`)); err == nil {
		t.Error("Run without execute succeeded")
	}
}

func TestRunTimeout(t *testing.T) {
	srv := qmptest.NewServer(t)
	ctx := testContext(t)
	m, err := qmp.Dial(ctx, srv.Path, qmp.WithRunTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := srv.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, c, func(*qmptest.Conn, qmptest.Request) error { return nil })
	if _, err := m.Run([]byte(`{"execute": "stop"}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run against a silent QEMU = %v, want DeadlineExceeded", err)
	}
}

func TestHasCommandCaches(t *testing.T) {
	m, c := connect(t)
	var mu sync.Mutex
	queries := 0
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		mu.Lock()
		queries++
		mu.Unlock()
		return c.Reply(req, []map[string]string{{"name": "query-status"}, {"name": "cont"}})
	})
	ctx := testContext(t)
	for _, tc := range []struct {
		name string
		want bool
	}{{"cont", true}, {"migrate", false}, {"query-status", true}} {
		got, err := m.HasCommand(ctx, tc.name)
		if err != nil || got != tc.want {
			t.Errorf("HasCommand(%s) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if queries != 1 {
		t.Errorf("query-commands sent %d times, want 1", queries)
	}
}

func TestQuitToleratesDisconnect(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		return c.Close() // QEMU gone before the reply
	})
	if err := m.Quit(testContext(t)); err != nil {
		t.Errorf("Quit = %v, want nil when QEMU hangs up", err)
	}
}

func TestSendFD(t *testing.T) {
	m, c := connect(t)
	path := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(path, []byte("tap-ish"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make(chan string, 1)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		if len(req.FDs) != 1 {
			return c.ReplyError(req, qmp.ClassGenericError, fmt.Sprintf("%d descriptors", len(req.FDs)))
		}
		defer req.FDs[0].Close()
		b, err := io.ReadAll(req.FDs[0])
		if err != nil {
			return err
		}
		got <- req.Execute + " " + string(req.Arguments) + " " + string(b)
		return c.Reply(req, struct{}{})
	})
	if err := m.SendFD(testContext(t), "tap0", f); err != nil {
		t.Fatal(err)
	}
	if want := `getfd {"fdname":"tap0"} tap-ish`; receive(t, got) != want {
		t.Errorf("server saw something else, want %q", want)
	}
}

func TestConcurrentUse(t *testing.T) {
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		if err := c.SendEvent("TICK", nil); err != nil {
			return err
		}
		return c.Reply(req, json.RawMessage(req.Arguments))
	})
	ctx := testContext(t)
	sub := m.Subscribe(8)
	defer sub.Close()
	const workers, calls = 16, 25
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				want := fmt.Sprintf(`{"n":%d}`, w*1000+i)
				ret, err := m.Execute(ctx, "echo", json.RawMessage(want))
				if err != nil || string(ret) != want {
					errs <- fmt.Errorf("worker %d call %d: got %s, %v; want %s", w, i, ret, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
