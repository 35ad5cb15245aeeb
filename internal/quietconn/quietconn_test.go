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

// TestRoundTripLargerThanTheSocketBuffer sends 8 MiB each way, far more than a socket's buffer,
// so writes wait for room and reads come in pieces.
func TestRoundTripLargerThanTheSocketBuffer(t *testing.T) {
	q, p := pair(t)
	want := bytes.Repeat([]byte("0123456789abcdef"), 512*1024)
	// The plain end echoes what it reads.
	go func() { _, _ = io.CopyN(p, p, int64(len(want))) }()
	errc := make(chan error, 1)
	go func() {
		n, err := q.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		errc <- err
	}()
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
	if err := q.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// Nobody reads the other end: the buffer fills and the write waits until its deadline.
	n, err := q.Write(make([]byte, 16<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("write past the deadline: %d bytes, %v, want a timeout", n, err)
	}
	if n == 0 || n >= 16<<20 {
		t.Fatalf("write past the deadline reported %d bytes written, want what fitted the buffer", n)
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

func TestCloseEndsAWaitingRead(t *testing.T) {
	q, _ := pair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := q.Read(make([]byte, 10))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	_ = q.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read on a closed connection: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a read kept waiting after Close")
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

func TestWrapLeavesConnectionsWithoutADescriptor(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap(net.Pipe) = %T, want the pipe itself", got)
	}
}
