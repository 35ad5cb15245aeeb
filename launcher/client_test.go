package launcher

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher/protocol"
)

// fakeLauncher serves socket with a raw handler of each connection's first request.
func fakeLauncher(t *testing.T, answer func(net.Conn, *http.Request)) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "launcher.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		close(done)
		_ = ln.Close()
	})
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err != nil {
					return
				}
				answer(conn, req)
				<-done
			}()
		}
	}()
	return socket
}

// TestClientBoundsLaunchers: a launcher that never answers costs one CallTimeout, one that answers
// too much is refused at MaxReplyBytes, and a silent watch ends at WatchIdleTimeout; each error
// names the launcher's socket.
func TestClientBoundsLaunchers(t *testing.T) {
	opts := ClientOptions{CallTimeout: 200 * time.Millisecond, MaxReplyBytes: 1 << 10, WatchIdleTimeout: 300 * time.Millisecond}
	silent := fakeLauncher(t, func(net.Conn, *http.Request) {})
	endless := fakeLauncher(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\n\r\n{\"phase\":\"%s", strings.Repeat("x", 4<<10))
	})
	oneStatus := fakeLauncher(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\n\r\n{\"phase\":\"Running\"}\n{\"phase\":\"Running\"}\n")
	})
	// A status past the stream's first buffer (watchBuffer) and within the limit.
	bigError := strings.Repeat("e", 2*watchBuffer)
	bigStatus := fakeLauncher(t, func(c net.Conn, _ *http.Request) {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\n\r\n{\"phase\":\"Failed\",\"startError\":%q}\n", bigError)
	})
	ctx := context.Background()

	t.Run("no answer", func(t *testing.T) {
		start := time.Now()
		_, err := NewClientWithOptions(silent, opts).Status(ctx)
		var te *TimeoutError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), silent) {
			t.Fatalf("error %v: want a *TimeoutError naming %s", err, silent)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the call took %s, want about %s", d, opts.CallTimeout)
		}
	})
	t.Run("no end", func(t *testing.T) {
		_, err := NewClientWithOptions(endless, opts).Status(ctx)
		var tl *ReplyTooLargeError
		if !errors.As(err, &tl) || !strings.Contains(err.Error(), endless) {
			t.Fatalf("error %v: want a *ReplyTooLargeError naming %s", err, endless)
		}
	})
	t.Run("watch: a status too large", func(t *testing.T) {
		err := NewClientWithOptions(endless, opts).Watch(ctx, func(protocol.Status) bool { return true })
		var tl *ReplyTooLargeError
		if !errors.As(err, &tl) {
			t.Fatalf("error %v: want a *ReplyTooLargeError", err)
		}
	})
	t.Run("watch: silence after a status, repeated statuses passed once", func(t *testing.T) {
		n := 0
		err := NewClientWithOptions(oneStatus, opts).Watch(ctx, func(protocol.Status) bool { n++; return true })
		var te *TimeoutError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), oneStatus) {
			t.Fatalf("error %v: want a *TimeoutError naming %s", err, oneStatus)
		}
		if n != 1 {
			t.Errorf("fn called %d times, want once (the second line repeats the first)", n)
		}
	})
	t.Run("watch: a status larger than the first buffer", func(t *testing.T) {
		var got protocol.Status
		_ = NewClientWithOptions(bigStatus, ClientOptions{WatchIdleTimeout: 300 * time.Millisecond}).Watch(ctx, func(st protocol.Status) bool {
			got = st
			return false
		})
		if got.Phase != protocol.PhaseFailed || got.StartError != bigError {
			t.Errorf("status phase %q with a %d-byte startError, want Failed with the %d bytes sent", got.Phase, len(got.StartError), len(bigError))
		}
	})
	t.Run("the caller's cancellation is not a timeout", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err := NewClientWithOptions(silent, opts).Status(cctx)
		var te *TimeoutError
		if errors.As(err, &te) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("error %v: want the caller's deadline, not a *TimeoutError", err)
		}
	})
}
