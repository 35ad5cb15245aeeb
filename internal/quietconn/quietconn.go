// Package quietconn wraps a stream socket so that its reads and writes do not wake the Go
// runtime's monitor thread.
//
// An idle Go process's monitor thread (sysmon) sleeps until the next timer. A system call a
// goroutine makes while it sleeps wakes it (runtime entersyscall → entersyscallWakeSysmon) and
// resets its back-off to 20 µs, so that it wakes again and again while any goroutine runs. For a
// process that does one small exchange a minute (the launcher asking an idle guest's agent for its
// interfaces, whose reply comes milliseconds later, once the monitor is asleep again) those
// wake-ups cost more than the exchange: the launcher's BenchmarkLauncherIdle counted 74 wake-ups a
// minute with a plain connection to the agent and 15 with this one (5.6 without an agent).
//
// A read or write on a non-blocking socket never blocks: it returns EAGAIN instead, and the
// runtime's poller waits for readiness without a system call of the goroutine's. Such a call needs
// none of the runtime's system call bookkeeping, so Conn makes it with syscall.RawSyscall and
// waits through the connection's syscall.RawConn, which keeps its deadlines and its close.
//
// RawSyscall is invisible to the race detector: under -race, the bytes the kernel moves and the
// order two goroutines' I/O on one connection imply are not seen, so a test that orders goroutines
// through the socket alone may be reported as racy.
package quietconn

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn is a socket whose Read and Write make raw system calls; everything else (deadlines,
// Close, addresses) is the wrapped connection's.
type Conn struct {
	net.Conn
	raw syscall.RawConn
}

// Wrap returns c reading and writing quietly, or c itself when it is not a stream socket with a
// file descriptor (a net.Pipe in a test, say; a datagram's zero length is no end of file).
func Wrap(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok || !stream(c) {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Conn{Conn: c, raw: raw}
}

// stream reports whether c is a unix or TCP stream socket.
func stream(c net.Conn) bool {
	addr := c.LocalAddr()
	if addr == nil {
		return false
	}
	switch addr.Network() {
	case "unix", "tcp", "tcp4", "tcp6":
		return true
	}
	return false
}

// Read reads up to len(p) bytes, waiting (within the read deadline) until some are there; io.EOF
// once the peer closed its end.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.raw.Read(func(fd uintptr) bool {
		n, errno = rawIO(syscall.SYS_READ, fd, p)
		return errno != syscall.EAGAIN
	})
	if err != nil {
		return 0, err // already a *net.OpError: a deadline, or a closed connection
	}
	if errno != 0 {
		return 0, c.opError("read", os.NewSyscallError("read", errno))
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p, waiting (within the write deadline) while the socket's buffer is full.
func (c *Conn) Write(p []byte) (int, error) {
	written := 0
	var errno syscall.Errno
	err := c.raw.Write(func(fd uintptr) bool {
		for written < len(p) {
			var n int
			n, errno = rawIO(syscall.SYS_WRITE, fd, p[written:])
			if errno != 0 {
				return errno != syscall.EAGAIN
			}
			if n == 0 {
				return true // no progress and no error: io.ErrUnexpectedEOF below, not a spin
			}
			written += n
		}
		return true
	})
	if err != nil {
		return written, err
	}
	if errno != 0 {
		return written, c.opError("write", os.NewSyscallError("write", errno))
	}
	if written < len(p) {
		return written, c.opError("write", io.ErrUnexpectedEOF)
	}
	return written, nil
}

// rawIO makes one read or write system call on fd with b, again if a signal interrupted it.
func rawIO(trap, fd uintptr, b []byte) (int, syscall.Errno) {
	for {
		n, _, errno := syscall.RawSyscall(trap, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if errno != syscall.EINTR {
			return int(n), errno
		}
	}
}

// opError wraps a system call's error as the net package does.
func (c *Conn) opError(op string, err error) error {
	e := &net.OpError{Op: op, Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	if e.Source != nil {
		e.Net = e.Source.Network()
	}
	return e
}
