// Package quiettimer is a one-shot timer on a Linux timerfd, for a process that sleeps for a
// minute at a time (an idle instance's launcher, between two polls of its guest's agent).
//
// A Go timer wakes more of the runtime than its own goroutine when it fires. The poller thread
// waits for it in epoll_pwait, whose timeout the kernel may stretch by 0.1% (0.5% for a niced
// process; up to 60 ms on a minute). The monitor thread (sysmon) sleeps until the same instant
// exactly, finds the timer overdue, and wakes every 10 ms until the poller has caught up. A
// timerfd's expiry is an event on a file descriptor instead: the kernel fires it on time, the
// poller waits for it with no timeout of its own, and the monitor thread, which sleeps until the
// next Go timer or for a minute at most, is not woken by it. BenchmarkTimerFire counts both.
//
// The descriptor's reads and its setting are raw system calls (syscall.RawSyscall), for the reason
// package quietconn gives: a system call through the runtime's bookkeeping wakes the monitor too.
// Where no timerfd can be made or waited for (the descriptor limit reached, the poller refusing
// it), a Timer falls back to a Go timer: it still fires, only not quietly.
package quiettimer

import (
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Timer sends the time on C once, d after Reset(d), unless Stop or another Reset comes first. A
// Reset or Stop discards a firing not yet received, so a receive after either is always of the new
// setting (as time.Timer does since Go 1.23). Safe for concurrent use.
type Timer struct {
	C <-chan time.Time

	c    chan time.Time
	file *os.File
	raw  syscall.RawConn // nil once the descriptor failed, or when none could be made

	mu     sync.Mutex  // orders a firing's send against Reset's and Stop's drain
	gen    uint64      // settings made, so that the fallback's late firing is known
	when   time.Time   // when the current setting fires; zero while stopped
	fall   *time.Timer // the fallback Go timer of the current setting, if any
	closed bool
}

// New returns a stopped timer. Close it when done: it holds a descriptor and a goroutine.
func New() *Timer {
	t := &Timer{c: make(chan time.Time, 1)}
	t.C = t.c
	if err := t.open(); err == nil {
		go t.wait(t.raw)
	}
	return t
}

// open makes the timerfd and hands it to the runtime's poller.
func (t *Timer) open() error {
	fd, _, errno := syscall.RawSyscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return os.NewSyscallError("timerfd_create", errno)
	}
	// A non-blocking descriptor is registered with the poller (os.NewFile checks the flag).
	file := os.NewFile(fd, "timerfd")
	raw, err := file.SyscallConn()
	if err != nil {
		_ = file.Close()
		return err
	}
	t.file, t.raw = file, raw
	return nil
}

// clockMonotonic is Linux's CLOCK_MONOTONIC, which the syscall package does not name.
const clockMonotonic = 1

// Reset arms the timer to fire once after d (at once when d is not positive), replacing any
// earlier setting and discarding a firing not yet received.
func (t *Timer) Reset(d time.Duration) { t.set(max(d, 1)) }

// Stop disarms the timer and discards a firing not yet received.
func (t *Timer) Stop() { t.set(0) }

// Close stops the timer for good, discards a firing not yet received, and releases its
// descriptor and goroutine. Reset and Stop do nothing after it.
func (t *Timer) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.drain()
	t.stopFallback()
	file := t.file
	t.mu.Unlock()
	if file == nil {
		return nil
	}
	// Outside mu: Close waits for the reading goroutine, whose callback takes mu.
	return file.Close()
}

// set arms the timer for d, or disarms it for 0, and drains C, all under mu: a firing read from
// the descriptor before the new setting cannot then be sent after it. Should the descriptor fail,
// the timer goes on as a Go timer.
func (t *Timer) set(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.drain()
	t.gen++
	t.when = time.Time{}
	if d > 0 {
		t.when = time.Now().Add(d)
	}
	t.stopFallback()
	if t.raw != nil {
		if t.setFD(d) == nil {
			return
		}
		t.raw = nil
	}
	t.armFallback()
}

// armFallback sets a Go timer for the current setting, if there is one.
func (t *Timer) armFallback() {
	if t.when.IsZero() {
		return
	}
	gen := t.gen
	t.fall = time.AfterFunc(time.Until(t.when), func() { t.fireIf(gen) })
}

func (t *Timer) drain() {
	select {
	case <-t.c:
	default:
	}
}

func (t *Timer) stopFallback() {
	if t.fall != nil {
		t.fall.Stop()
		t.fall = nil
	}
}

// setFD sets the descriptor's one expiry d from now (0 disarms it); the kernel also zeroes the
// count of expiries not yet read, so an earlier setting's firing is not read after this one.
func (t *Timer) setFD(d time.Duration) error {
	spec := itimerspec{value: syscall.NsecToTimespec(int64(d))}
	var errno syscall.Errno
	err := t.raw.Control(func(fd uintptr) {
		_, _, errno = syscall.RawSyscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	})
	if err != nil {
		return err
	}
	if errno != 0 {
		return os.NewSyscallError("timerfd_settime", errno)
	}
	return nil
}

// itimerspec is struct itimerspec: no interval (one-shot), and the expiry.
type itimerspec struct {
	interval, value syscall.Timespec
}

// wait reads raw's expiries until the descriptor is closed or fails, sending each on C.
func (t *Timer) wait(raw syscall.RawConn) {
	var expiries uint64
	for {
		var errno syscall.Errno
		err := raw.Read(func(fd uintptr) bool {
			t.mu.Lock()
			defer t.mu.Unlock()
			for {
				_, _, errno = syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&expiries)), unsafe.Sizeof(expiries))
				if errno != syscall.EINTR {
					break
				}
			}
			if errno == syscall.EAGAIN {
				return false // not expired, or set again since: wait for the poller
			}
			if errno == 0 && t.raw != nil && !t.closed {
				t.when = time.Time{}
				t.fireLocked()
			}
			return true
		})
		if err != nil || errno != 0 {
			t.giveUp()
			return
		}
	}
}

// giveUp follows the end of the descriptor's reading: Close, or a failure (the poller refused the
// descriptor, or a read a timerfd does not fail with). After a failure the current setting, and
// every one after it, is a Go timer's.
func (t *Timer) giveUp() {
	t.mu.Lock()
	defer t.mu.Unlock()
	// raw is already nil when set failed, and set has armed the fallback itself; a closed timer
	// has no setting to carry over.
	if t.raw != nil && !t.closed {
		t.armFallback()
	}
	t.raw = nil
}

// fireIf sends the time on C if no setting came after gen (the fallback Go timer's function).
func (t *Timer) fireIf(gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen == gen && !t.closed {
		t.when = time.Time{}
		t.fireLocked()
	}
}

func (t *Timer) fireLocked() {
	select {
	case t.c <- time.Now():
	default: // one is pending, which set would have drained: it is this setting's
	}
}
