package launcher_test

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// testLink stands in for the node agents' tunnel between two launchers: it listens on a unix
// socket of its own (Path, URI) and carries each connection on to its target, in the order
// accepted (QEMU 7.2 takes the first connection it accepts for the main stream, as migproxy's
// tunnel also keeps). It counts the bytes sent towards the target (Sent, once a stream ended);
// with a limit it carries at most that many per connection and then reads no more, so that the
// source's writes back up (a target or network that stopped taking data); Cut closes every
// connection, as a broken link or the agent's Cut does.
type testLink struct {
	Path string
	URI  string
	Sent atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
}

// newLink links to target: tcp:HOST:PORT, or the path of a unix socket.
func newLink(t *testing.T, target string, limit int64) *testLink {
	t.Helper()
	l := &testLink{Path: filepath.Join(t.TempDir(), "link.sock")}
	l.URI = "unix:" + l.Path
	ln, err := net.Listen("unix", l.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ln.Close()
		l.Cut()
	})
	network, addr := "unix", target
	if a, ok := strings.CutPrefix(target, "tcp:"); ok {
		network, addr = "tcp", a
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r, err := net.Dial(network, addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			l.mu.Lock()
			l.conns = append(l.conns, c, r)
			l.mu.Unlock()
			go l.carry(c, r, limit)
		}
	}()
	return l
}

// carry copies c to r (up to limit bytes when limit > 0) and r back to c, the return path; a
// stream carried whole ends as it would through the tunnel: the target sees the source's end,
// and both connections close once the target ended its side too.
func (l *testLink) carry(c, r net.Conn, limit int64) {
	back := make(chan struct{})
	go func() {
		_, _ = io.Copy(c, r)
		close(back)
	}()
	if limit > 0 {
		n, _ := io.CopyN(r, c, limit)
		l.Sent.Add(n)
		return // then read no more: the source's writes back up until Cut
	}
	n, _ := io.Copy(r, c)
	l.Sent.Add(n)
	if hc, ok := r.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
	<-back
	_ = c.Close()
	_ = r.Close()
}

// Cut closes every connection the link carries.
func (l *testLink) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
}
