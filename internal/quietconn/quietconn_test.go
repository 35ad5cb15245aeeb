package quietconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// pair is a connected pair of unix stream sockets: a quiet end and a plain one.
func pair(t testing.TB) (quiet, plain net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := fileConn(t, fds[0]), fileConn(t, fds[1])
	q := Wrap(a)
	if _, ok := q.(*Conn); !ok {
		t.Fatalf("Wrap of a unix socket gave %T, want *Conn", q)
	}
	t.Cleanup(func() { _ = q.Close(); _ = b.Close() })
	return q, b
}

func fileConn(t testing.TB, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socket")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRoundTrip sends 8 MiB through an echo, far more than a socket's buffer, so writes wait for
// room and reads come in pieces; the writes are made by another goroutine than the reads, each
// waiting on its own readiness: in one write, then in writes of 4 KiB.
func TestRoundTrip(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789abcdef"), 512*1024)
	for name, piece := range map[string]int{"one write": len(want), "4 KiB writes": 4096} {
		t.Run(name, func(t *testing.T) {
			q, p := pair(t)
			go func() { _, _ = io.Copy(p, p) }() // the plain end echoes
			errc := make(chan error, 1)
			go func() { errc <- writeInPieces(q, want, piece) }()
			got := make([]byte, len(want))
			if _, err := io.ReadFull(q, got); err != nil {
				t.Fatalf("read back: %v", err)
			}
			if err := <-errc; err != nil {
				t.Fatalf("write: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("the bytes read back differ from those written")
			}
		})
	}
}

// writeInPieces writes b in writes of piece bytes, each of which must write all of its piece.
func writeInPieces(c net.Conn, b []byte, piece int) error {
	for off := 0; off < len(b); off += piece {
		chunk := b[off:min(off+piece, len(b))]
		n, err := c.Write(chunk)
		if err != nil {
			return err
		}
		if n != len(chunk) {
			return io.ErrShortWrite
		}
	}
	return nil
}

func TestReadSeesTheDeadline(t *testing.T) {
	q, _ := pair(t)
	if err := q.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := q.Read(make([]byte, 10))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read past the deadline: %v, want a timeout", err)
	}
}

func TestWriteSeesTheDeadline(t *testing.T) {
	q, _ := pair(t)
	big := make([]byte, 2<<20) // far more than a socket's buffer
	if err := q.SetWriteDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// Nobody reads the other end: the buffer fills and the write waits until its deadline.
	n, err := q.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past the deadline: %d bytes, %v, want a timeout", n, err)
	}
	if n >= len(big) {
		t.Fatalf("write past the deadline reported %d bytes written, want fewer than %d", n, len(big))
	}
}

// TestCloseEndsAWaitingCall closes the connection under a read waiting for data and under a write
// waiting for room (nobody reads the other end).
func TestCloseEndsAWaitingCall(t *testing.T) {
	calls := map[string]func(net.Conn) error{
		"read":  func(c net.Conn) error { _, err := c.Read(make([]byte, 10)); return err },
		"write": func(c net.Conn) error { _, err := c.Write(make([]byte, 2<<20)); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			q, _ := pair(t)
			errc := make(chan error, 1)
			go func() { errc <- call(q) }()
			time.Sleep(50 * time.Millisecond)
			_ = q.Close()
			select {
			case err := <-errc:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("%s on a closed connection: %v, want net.ErrClosed", name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("a %s kept waiting after Close", name)
			}
		})
	}
}

func TestZeroLengthReadAndWrite(t *testing.T) {
	q, _ := pair(t)
	if n, err := q.Write(nil); n != 0 || err != nil {
		t.Fatalf("Write(nil) = %d, %v; want 0, nil", n, err)
	}
	if n, err := q.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v; want 0, nil", n, err)
	}
}

func TestResetByThePeerIsTold(t *testing.T) {
	q, p := pair(t)
	// Unread data at the peer's close makes the close a reset.
	if _, err := q.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	_, err := q.Read(make([]byte, 10))
	if err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after the peer's close: %v, want EOF or ECONNRESET", err)
	}
}

func TestReadAfterThePeerClosedIsEOF(t *testing.T) {
	q, p := pair(t)
	if _, err := p.Write([]byte("last")); err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	got, err := io.ReadAll(q)
	if err != nil || string(got) != "last" {
		t.Fatalf("read to the end: %q, %v; want \"last\" then EOF", got, err)
	}
}

func TestWriteToAClosedPeerFails(t *testing.T) {
	q, p := pair(t)
	_ = p.Close()
	_, err := q.Write([]byte("x"))
	if !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("write to a closed peer: %v, want EPIPE", err)
	}
}

func TestWrapLeavesOtherConnectionsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(net.Pipe) = %T, want the pipe itself", got)
	}
	dgram, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: t.TempDir() + "/d", Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer dgram.Close()
	if got := Wrap(dgram); got != net.Conn(dgram) {
		t.Fatalf("Wrap(a datagram socket) = %T, want the socket itself", got)
	}
}
