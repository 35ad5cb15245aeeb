package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	gqmp "github.com/digitalocean/go-qemu/qmp"
)

// Event names of QEMU 7.2 that the launcher reacts to.
const (
	EventShutdown      = "SHUTDOWN"
	EventPowerdown     = "POWERDOWN"
	EventReset         = "RESET"
	EventStop          = "STOP"
	EventResume        = "RESUME"
	EventSuspend       = "SUSPEND"
	EventWakeup        = "WAKEUP"
	EventDeviceDeleted = "DEVICE_DELETED"
	EventGuestPanicked = "GUEST_PANICKED"
	EventMigration     = "MIGRATION"
	EventMigrationPass = "MIGRATION_PASS"
	EventBlockIOError  = "BLOCK_IO_ERROR"
	// EventMemoryDeviceSizeChange: a virtio-mem device's plugged size changed (the guest plugged or
	// unplugged blocks); data: id, size (bytes), qom-path.
	EventMemoryDeviceSizeChange = "MEMORY_DEVICE_SIZE_CHANGE"
)

// ErrWaiterCancelled is returned by Waiter.Wait after Waiter.Cancel.
var ErrWaiterCancelled = errors.New("qmp: waiter cancelled")

// Subscription is a stream of every event QEMU sends, in order, from the
// moment of Subscribe. Its buffer is fixed; when it is full the oldest
// buffered event is dropped to make room, so the stream always holds the
// newest events and the reader of the connection never waits for a slow
// subscriber. Dropped counts the losses.
//
// Event.Data maps are shared with other subscribers: treat them as
// read-only.
type Subscription struct {
	m       *Monitor
	ch      chan gqmp.Event
	dropped atomic.Uint64

	mu     sync.Mutex // orders delivery against close
	closed bool
}

// Subscribe starts a subscription with room for bufSize events (at least
// one). On a monitor that has already stopped, the channel is closed at
// once. The channel is closed when the subscription or the monitor is.
func (m *Monitor) Subscribe(bufSize int) *Subscription {
	s := &Subscription{m: m, ch: make(chan gqmp.Event, max(bufSize, 1))}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		s.close()
		return s
	}
	m.subs[s] = struct{}{}
	return s
}

// Events is the subscription's stream.
func (s *Subscription) Events() <-chan gqmp.Event { return s.ch }

// Dropped is how many events were discarded because the buffer was full.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close ends the subscription and closes its channel. It is idempotent.
func (s *Subscription) Close() {
	s.m.mu.Lock()
	if s.m.subs != nil {
		delete(s.m.subs, s)
	}
	s.m.mu.Unlock()
	s.close()
}

func (s *Subscription) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	close(s.ch)
}

// deliver never blocks: it is called by the reading goroutine, which is the
// channel's only sender, so after one event is drained there is room.
func (s *Subscription) deliver(ev gqmp.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	for {
		select {
		case s.ch <- ev:
			return
		default:
		}
		select {
		case <-s.ch:
			s.dropped.Add(1)
		default:
		}
	}
}

// Waiter catches the first event with a given name (and, optionally, one
// that match accepts) from the moment it is created. Create it before the
// command that causes the event, so an event that arrives before Wait is
// called is not missed. A Waiter sees every event: it has no buffer to
// overflow.
type Waiter struct {
	m     *Monitor
	name  string
	match func(gqmp.Event) bool

	once sync.Once
	done chan struct{}
	ev   gqmp.Event
	err  error
}

// NewWaiter registers interest in the next event called name ("" for any
// event) for which match returns true (nil match accepts all). match runs on
// the goroutine that reads the connection: it must be quick and must not
// call the Monitor. Call Cancel when the waiter is no longer needed.
func (m *Monitor) NewWaiter(name string, match func(gqmp.Event) bool) *Waiter {
	w := &Waiter{m: m, name: name, match: match, done: make(chan struct{})}
	m.mu.Lock()
	err := m.err
	if err == nil {
		m.waiters[w] = struct{}{}
	}
	m.mu.Unlock()
	if err != nil {
		w.finish(gqmp.Event{}, err)
	}
	return w
}

// Wait returns the matched event, or an error if ctx ends first, the waiter
// was cancelled or the monitor stopped. It may be called again after a
// context error, and returns the same result every time once there is one.
func (w *Waiter) Wait(ctx context.Context) (gqmp.Event, error) {
	select {
	case <-w.done:
		if w.err != nil {
			return gqmp.Event{}, fmt.Errorf("qmp wait %s: %w", w.label(), w.err)
		}
		return w.ev, nil
	case <-ctx.Done():
		return gqmp.Event{}, fmt.Errorf("qmp wait %s: %w", w.label(), ctx.Err())
	}
}

// Cancel unregisters the waiter; a pending or later Wait returns
// ErrWaiterCancelled unless an event was already matched. It is idempotent.
func (w *Waiter) Cancel() {
	w.m.removeWaiter(w)
	w.finish(gqmp.Event{}, ErrWaiterCancelled)
}

func (w *Waiter) label() string {
	if w.name == "" {
		return "any event"
	}
	return w.name
}

// offer is called by the reading goroutine for every event.
func (w *Waiter) offer(ev gqmp.Event) {
	if w.name != "" && ev.Event != w.name {
		return
	}
	ok, err := w.matches(ev)
	if !ok && err == nil {
		return
	}
	w.m.removeWaiter(w)
	w.finish(ev, err)
}

// matches shields the reading goroutine from a panicking match function: the
// panic becomes this waiter's error instead of killing the connection.
func (w *Waiter) matches(ev gqmp.Event) (ok bool, err error) {
	if w.match == nil {
		return true, nil
	}
	defer func() {
		if p := recover(); p != nil {
			ok, err = false, fmt.Errorf("match function panicked: %v", p)
		}
	}()
	return w.match(ev), nil
}

func (w *Waiter) finish(ev gqmp.Event, err error) {
	w.once.Do(func() {
		w.ev, w.err = ev, err
		close(w.done)
	})
}

func (m *Monitor) removeWaiter(w *Waiter) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waiters != nil {
		delete(m.waiters, w)
	}
}

// WaitEvent waits for the next event called name that match accepts (nil
// accepts all). Only events arriving after the call are seen: to wait for
// the effect of a command, use ExecuteAndWait or a Waiter made beforehand.
func (m *Monitor) WaitEvent(ctx context.Context, name string, match func(gqmp.Event) bool) (gqmp.Event, error) {
	w := m.NewWaiter(name, match)
	defer w.Cancel()
	return w.Wait(ctx)
}

// ExecuteAndWait runs cmd and then waits for the event it causes. The waiter
// is registered before the command is sent, so the event is caught even
// when QEMU emits it before the reply (as it does for quit's SHUTDOWN).
func (m *Monitor) ExecuteAndWait(ctx context.Context, cmd string, args any, event string, match func(gqmp.Event) bool) (json.RawMessage, gqmp.Event, error) {
	w := m.NewWaiter(event, match)
	defer w.Cancel()
	ret, err := m.Execute(ctx, cmd, args)
	if err != nil {
		return nil, gqmp.Event{}, err
	}
	ev, err := w.Wait(ctx)
	if err != nil {
		return ret, gqmp.Event{}, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	return ret, ev, nil
}
