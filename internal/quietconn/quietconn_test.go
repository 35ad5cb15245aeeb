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

func TestCloseEndsAWaitingWrite(t *testing.T) {
	q, _ := pair(t)
	big := make([]byte, 2<<20)
	errc := make(chan error, 1)
	go func() {
		_, err := q.Write(big) // nobody reads: it waits for room
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_ = q.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("write on a closed connection: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write kept waiting after Close")
	}
}

// TestReadAndWriteAtOnce has one goroutine write while another reads the echo: each waits on its
// own readiness.
func TestReadAndWriteAtOnce(t *testing.T) {
	q, p := pair(t)
	go func() { _, _ = io.Copy(p, p) }()
	want := bytes.Repeat([]byte("qvirt"), 400_000)
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < len(want); off += 4096 {
			if _, err := q.Write(want[off:min(off+4096, len(want))]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(q, got); err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the echo differs from what was written")
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
