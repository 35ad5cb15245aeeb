package quietconn

import (
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/test/testutil"
)

// echoEnv makes the test binary an echo peer on its descriptor 3 (TestMain): the peer of
// BenchmarkIdleExchange is another process, so that its system calls wake nothing in this one.
const echoEnv = "QUIETCONN_ECHO"

func TestMain(m *testing.M) {
	if os.Getenv(echoEnv) == "1" {
		echo(os.NewFile(3, "peer"))
		return
	}
	os.Exit(m.Run())
}

func echo(f *os.File) {
	buf := make([]byte, 4096)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		// An agent in a guest under emulation answers in milliseconds, long enough for the
		// monitor thread of the process waiting for the reply to fall asleep again.
		time.Sleep(50 * time.Millisecond)
		if _, err := f.Write(buf[:n]); err != nil {
			return
		}
	}
}

// BenchmarkIdleExchange is what one small request and reply costs a process that was idle before
// it (the launcher polling an idle guest's agent once a minute): the wake-ups of the
// process's threads and their CPU time per exchange, through a plain connection and through a
// quiet one. Each exchange follows an idle spell long enough for the runtime's monitor thread to
// fall asleep. The process's own reads of its statistics are system calls too, so they are made
// only around the whole loop, and the same loop without the exchanges is subtracted.
func BenchmarkIdleExchange(b *testing.B) {
	for _, quiet := range []bool{false, true} {
		name := "plain"
		if quiet {
			name = "quiet"
		}
		b.Run(name, func(b *testing.B) {
			c := echoPeer(b)
			if quiet {
				c = Wrap(c)
			}
			req := []byte(`{"execute":"guest-network-get-interfaces"}` + "\n")
			buf := make([]byte, 4096)
			exchange := func() {
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write(req); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Read(buf); err != nil {
					b.Fatal(err)
				}
				_ = c.SetDeadline(time.Time{})
			}
			exchange() // the connection's first use
			idleWakeups, idleCPU := idleLoop(b, b.N, nil)
			wakeups, cpu := idleLoop(b, b.N, exchange)
			b.ReportMetric(float64(wakeups-idleWakeups)/float64(b.N), "wakeups/exchange")
			b.ReportMetric(float64((cpu-idleCPU).Microseconds())/float64(b.N), "cpu-µs/exchange")
		})
	}
}

// idleLoop sleeps n times, long enough for the runtime's monitor thread to fall asleep, and calls
// f after each sleep; it returns the wake-ups and CPU time of this process's threads over the loop.
func idleLoop(b *testing.B, n int, f func()) (wakeups int64, cpu time.Duration) {
	c0, w0 := testutil.MustSchedStats(b, 0)
	for range n {
		time.Sleep(200 * time.Millisecond)
		if f != nil {
			f()
		}
	}
	time.Sleep(200 * time.Millisecond) // the monitor's wake-ups after the last
	c1, w1 := testutil.MustSchedStats(b, 0)
	return w1 - w0, c1 - c0
}

// echoPeer starts the echo process and returns this end of its socket.
func echoPeer(b *testing.B) net.Conn {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	peer := os.NewFile(uintptr(fds[1]), "peer")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), echoEnv+"=1")
	cmd.ExtraFiles = []*os.File{peer}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	_ = peer.Close()
	c := fileConn(b, fds[0])
	b.Cleanup(func() {
		_ = c.Close()
		_ = cmd.Wait()
	})
	return c
}
