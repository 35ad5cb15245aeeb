package testutil

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qvirt/qvirt/internal/unixsock"
)

// Console reads a guest's serial socket (the test guest's protocol is in test/guest/README.md)
// and keeps everything it read.
type Console struct {
	conn net.Conn
	mu   sync.Mutex
	buf  bytes.Buffer
}

// AttachConsole connects to the serial socket at path, waiting up to 30 s for it to appear, and
// closes it when the test ends.
func AttachConsole(t testing.TB, path string) *Console {
	t.Helper()
	var conn net.Conn
	Eventually(t, 30*time.Second, "serial socket "+path, func() bool {
		var err error
		conn, err = unixsock.Dial(context.Background(), path)
		return err == nil
	})
	c := &Console{conn: conn}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := conn.Read(b)
			c.mu.Lock()
			c.buf.Write(b[:n])
			c.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { _ = conn.Close() })
	return c
}

// Text is everything the guest printed since the console was attached.
func (c *Console) Text() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// Send types a line.
func (c *Console) Send(t testing.TB, line string) {
	t.Helper()
	if _, err := c.conn.Write([]byte(line + "\n")); err != nil {
		t.Fatalf("write to console: %v", err)
	}
}

// Expect waits until the console shows want after offset from; it returns the end of the match.
func (c *Console) Expect(t testing.TB, from int, want string, d time.Duration) int {
	t.Helper()
	var end int
	Eventually(t, d, fmt.Sprintf("%q on the console", want), func() bool {
		text := c.Text()
		if from > len(text) {
			return false
		}
		i := strings.Index(text[from:], want)
		end = from + i + len(want)
		return i >= 0
	}, func() string { return "console ends with " + strconv.Quote(Tail(c.Text(), 300)) })
	return end
}

// Number types cmd, whose output must end in a line "<tag>-<number>-END" (write the END in cmd
// as E""ND, so the echoed command does not match), and returns the number: what the guest said
// (MemTotal, a count).
func (c *Console) Number(t testing.TB, cmd, tag string) int64 {
	t.Helper()
	from := len(c.Text())
	c.Send(t, cmd)
	re := regexp.MustCompile(regexp.QuoteMeta(tag) + `-(\d+)-END`)
	var n int64
	Eventually(t, time.Minute, tag+"-<number>-END on the console", func() bool {
		text := c.Text()
		m := re.FindStringSubmatch(text[min(from, len(text)):])
		if m == nil {
			return false
		}
		n, _ = strconv.ParseInt(m[1], 10, 64)
		return true
	}, func() string { return "console ends with " + strconv.Quote(Tail(c.Text(), 300)) })
	return n
}

// Run types line and waits until the console shows want after what it showed before, typing the
// line again every 5 s: a line typed while the guest is still booting is lost (the kernel resets
// the UART when it opens the console), so a test that cannot wait for the boot banner (it may
// have attached after it) types until the guest's shell answers.
func (c *Console) Run(t testing.TB, line, want string, d time.Duration) {
	t.Helper()
	from := len(c.Text())
	deadline := time.Now().Add(d)
	for {
		c.Send(t, line)
		retry := time.Now().Add(5 * time.Second)
		for time.Now().Before(retry) && time.Now().Before(deadline) {
			if strings.Contains(c.Text()[from:], want) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %q in answer to %q; console ends with %q", d, want, line, Tail(c.Text(), 300))
		}
	}
}

// A counter line of the guest's tick.
var tickRE = regexp.MustCompile(`tick (\d+)\r\n`)

// LastTick is the highest counter the guest's tick printed: the highest n whose n-1 the console
// shows too. The echo of a typed "tick 100000 &" can look like a counter line when the shell's
// banner breaks it ("tick 1000\r\n...00 &", seen on a loaded machine); a real counter line has its
// predecessor, except the first one a console shows.
func LastTick(text string) int {
	seen := map[int]bool{}
	for _, m := range tickRE.FindAllStringSubmatch(text, -1) {
		n, _ := strconv.Atoi(m[1])
		seen[n] = true
	}
	last := 0
	for n := range seen {
		if seen[n-1] && n > last {
			last = n
		}
	}
	return last
}

// LastTick is the highest counter the guest's tick printed on this console (see LastTick).
func (c *Console) LastTick() int { return LastTick(c.Text()) }

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Eventually polls ok every 50 ms until it holds or d passes, then fails the test naming what it
// waited for, with the details when given.
func Eventually(t testing.TB, d time.Duration, what string, ok func() bool, details ...func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("timed out after %s waiting for %s", d, what)
			for _, f := range details {
				msg += "\n" + f()
			}
			t.Fatal(msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
