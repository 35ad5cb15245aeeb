package quiettimer

import (
	"os"
	"testing"
	"time"
)

// kinds runs a test on a timerfd timer and on the Go timer a Timer falls back to.
func kinds(t *testing.T, f func(t *testing.T, newTimer func() *Timer)) {
	t.Run("timerfd", func(t *testing.T) {
		f(t, func() *Timer {
			tm := New()
			if !tm.onFD() {
				t.Fatal("no timerfd: the timer fell back to a Go timer")
			}
			t.Cleanup(func() { _ = tm.Close() })
			return tm
		})
	})
	t.Run("fallback", func(t *testing.T) {
		f(t, func() *Timer {
			tm := newFallback()
			t.Cleanup(func() { _ = tm.Close() })
			return tm
		})
	})
}

// newFallback is a Timer as New returns it when no timerfd can be made.
func newFallback() *Timer {
	t := &Timer{c: make(chan time.Time, 1)}
	t.C = t.c
	return t
}

// onFD reports whether tm still runs on its timerfd.
func (tm *Timer) onFD() bool {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.raw != nil
}

// firesAfter fails t unless tm fires within 5s, and no sooner than d after start.
func firesAfter(t *testing.T, tm *Timer, start time.Time, d time.Duration, what string) {
	t.Helper()
	if !fired(tm, 5*time.Second) {
		t.Fatalf("%s did not fire within 5s", what)
	}
	if got := time.Since(start); got < d {
		t.Fatalf("%s fired after %v, before its %v", what, got, d)
	}
}

// fired waits up to within for a firing.
func fired(tm *Timer, within time.Duration) bool {
	select {
	case <-tm.C:
		return true
	case <-time.After(within):
		return false
	}
}

func TestFiresOnceAfterItsDuration(t *testing.T) {
	kinds(t, func(t *testing.T, newTimer func() *Timer) {
		tm := newTimer()
		start := time.Now()
		tm.Reset(50 * time.Millisecond)
		firesAfter(t, tm, start, 50*time.Millisecond, "a timer set for 50ms")
		if fired(tm, 200*time.Millisecond) {
			t.Fatal("a one-shot timer fired twice")
		}
		// And again, once set again.
		start = time.Now()
		tm.Reset(10 * time.Millisecond)
		firesAfter(t, tm, start, 10*time.Millisecond, "the timer set a second time")
	})
}

func TestNotPositiveFiresAtOnce(t *testing.T) {
	kinds(t, func(t *testing.T, newTimer func() *Timer) {
		tm := newTimer()
		for _, d := range []time.Duration{0, -time.Second} {
			tm.Reset(d)
			if !fired(tm, 5*time.Second) {
				t.Fatalf("Reset(%v) did not fire", d)
			}
		}
	})
}

// Stop keeps a timer from firing. And a firing nobody received yet belongs to the old setting:
// Reset and Stop discard it, as time.Timer does, so a caller that sets the timer again never reads
// a stale firing.
func TestStopAndResetDiscardTheOldSetting(t *testing.T) {
	kinds(t, func(t *testing.T, newTimer func() *Timer) {
		tm := newTimer()
		tm.Reset(50 * time.Millisecond)
		tm.Stop()
		if fired(tm, 300*time.Millisecond) {
			t.Fatal("a stopped timer fired")
		}
		tm.Reset(time.Millisecond)
		time.Sleep(100 * time.Millisecond) // fired, not received
		start := time.Now()
		tm.Reset(300 * time.Millisecond)
		firesAfter(t, tm, start, 300*time.Millisecond, "the timer set again (an earlier firing received?)")
		tm.Reset(time.Millisecond)
		time.Sleep(100 * time.Millisecond)
		tm.Stop()
		if fired(tm, 100*time.Millisecond) {
			t.Fatal("received a firing after Stop")
		}
	})
}

// Reset racing the firing of the setting before it: whatever the order, no firing of the old
// setting is received after the new one was made.
func TestResetRacingAFiring(t *testing.T) {
	kinds(t, func(t *testing.T, newTimer func() *Timer) {
		tm := newTimer()
		for i := range 300 {
			tm.Reset(time.Duration(i%50) * time.Microsecond)
			time.Sleep(time.Duration(i%7) * 10 * time.Microsecond)
			tm.Reset(time.Hour)
			select {
			case <-tm.C:
				t.Fatalf("round %d: received the earlier setting's firing after Reset(1h)", i)
			default:
			}
		}
		// The goroutine may have read an expiry just before the last Reset: give it the time
		// to send it, which it must not.
		if fired(tm, 50*time.Millisecond) {
			t.Fatal("received the earlier setting's firing after Reset(1h)")
		}
	})
}

func TestCloseEndsIt(t *testing.T) {
	kinds(t, func(t *testing.T, newTimer func() *Timer) {
		tm := newTimer()
		tm.Reset(time.Millisecond)
		time.Sleep(50 * time.Millisecond) // fired, not received
		tm.Reset(time.Hour)
		if err := tm.Close(); err != nil {
			t.Fatal(err)
		}
		if err := tm.Close(); err != nil {
			t.Fatalf("a second Close: %v", err)
		}
		tm.Reset(time.Millisecond) // no effect, and no panic
		if fired(tm, 200*time.Millisecond) {
			t.Fatal("a closed timer fired")
		}
	})
	kinds(t, func(t *testing.T, newTimer func() *Timer) {
		tm := newTimer()
		tm.Reset(time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		_ = tm.Close()
		if fired(tm, 0) {
			t.Fatal("Close left a firing to receive")
		}
	})
	// The reading goroutine ends: it lets go of the descriptor.
	tm := New()
	if !tm.onFD() {
		t.Fatal("no timerfd")
	}
	raw := tm.raw
	_ = tm.Close()
	for deadline := time.Now().Add(5 * time.Second); tm.onFD(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the goroutine reading the descriptor did not end after Close")
		}
	}
	if err := raw.Control(func(uintptr) {}); err == nil {
		t.Fatal("the descriptor is still open after Close")
	}
}

// A descriptor that fails while set (here closed under the timer, as a poller refusing it would
// end its reading) hands the setting to a Go timer: it still fires, at its time, and so do the
// settings after it.
func TestFallsBackWhenTheDescriptorFails(t *testing.T) {
	tm := New()
	t.Cleanup(func() { _ = tm.Close() })
	start := time.Now()
	tm.Reset(200 * time.Millisecond)
	_ = tm.file.Close()
	firesAfter(t, tm, start, 200*time.Millisecond, "the setting made before the descriptor failed")
	if tm.onFD() {
		t.Fatal("still on the failed descriptor")
	}
	start = time.Now()
	tm.Reset(10 * time.Millisecond)
	firesAfter(t, tm, start, 10*time.Millisecond, "a setting after the failure")
	if fired(tm, 100*time.Millisecond) {
		t.Fatal("fired twice")
	}
}

// A setting the descriptor refuses (timerfd_settime failing: here EINVAL, as the descriptor is a
// pipe's) is a Go timer's.
func TestFallsBackWhenSettingFails(t *testing.T) {
	tm := New()
	t.Cleanup(func() { _ = tm.Close() })
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	notTimer, err := r.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	tm.mu.Lock()
	tm.raw = notTimer
	tm.mu.Unlock()
	start := time.Now()
	tm.Reset(10 * time.Millisecond)
	firesAfter(t, tm, start, 10*time.Millisecond, "a setting the descriptor refused")
	if tm.onFD() {
		t.Fatal("still on the descriptor that refused the setting")
	}
}

// Many timers at once each fire once, at their own time.
func TestManyTimers(t *testing.T) {
	kinds(t, func(t *testing.T, newTimer func() *Timer) {
		const n = 64
		type result struct {
			i     int
			late  time.Duration
			twice bool
		}
		results := make(chan result, n)
		start := time.Now()
		for i := range n {
			tm := newTimer()
			d := time.Duration(i%8) * 10 * time.Millisecond
			tm.Reset(d)
			go func() {
				<-tm.C
				late := time.Since(start) - d
				results <- result{i, late, fired(tm, 100*time.Millisecond)}
			}()
		}
		for range n {
			select {
			case r := <-results:
				if r.late < 0 {
					t.Errorf("timer %d fired %v early", r.i, -r.late)
				}
				if r.twice {
					t.Errorf("timer %d fired twice", r.i)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("not every timer fired within 10s")
			}
		}
	})
}
