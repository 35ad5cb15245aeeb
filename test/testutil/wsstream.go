package testutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// WSStream reads a websocket (a console, VNC or QMP stream) in the background and keeps what it
// received, for tests that wait for bytes or messages on it.
type WSStream struct {
	Conn *websocket.Conn
	// Bytes is every message received, concatenated.
	Bytes SyncBuffer

	mu     sync.Mutex
	types  map[websocket.MessageType]int
	msgs   [][]byte
	closed chan struct{}
	err    error // why reading stopped; read after closed
}

// ReadWS starts reading c until it closes.
func ReadWS(c *websocket.Conn) *WSStream {
	s := &WSStream{Conn: c, types: map[websocket.MessageType]int{}, closed: make(chan struct{})}
	go func() {
		defer close(s.closed)
		for {
			typ, data, err := c.Read(context.Background())
			if err != nil {
				s.err = err
				return
			}
			s.mu.Lock()
			s.types[typ]++
			s.msgs = append(s.msgs, data)
			s.mu.Unlock()
			_, _ = s.Bytes.Write(data)
		}
	}()
	return s
}

// Closed is closed once reading has stopped.
func (s *WSStream) Closed() <-chan struct{} { return s.closed }

// Types counts the messages received by type (text, binary).
func (s *WSStream) Types() map[websocket.MessageType]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[websocket.MessageType]int, len(s.types))
	for k, v := range s.types {
		out[k] = v
	}
	return out
}

// Expect waits until the bytes received after offset from contain want; it returns the end of the
// match.
func (s *WSStream) Expect(t testing.TB, from int, want string, d time.Duration) int {
	t.Helper()
	end := -1
	Eventually(t, d, fmt.Sprintf("%q on the stream", want), func() bool {
		text := s.Bytes.String()
		if i := strings.Index(text[min(from, len(text)):], want); i >= 0 {
			end = from + i + len(want)
			return true
		}
		return false
	}, func() string { return Tail(s.Bytes.String(), 400) })
	return end
}

// Send writes one message of type typ.
func (s *WSStream) Send(t testing.TB, typ websocket.MessageType, data string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Conn.Write(ctx, typ, []byte(data)); err != nil {
		t.Fatalf("write to websocket: %v", err)
	}
}

// ClosedWith waits up to d for the stream to end and returns the close status and reason it got.
func (s *WSStream) ClosedWith(t testing.TB, d time.Duration) (websocket.StatusCode, string) {
	t.Helper()
	select {
	case <-s.closed:
	case <-time.After(d):
		t.Fatalf("the websocket stayed open for %s", d)
	}
	var ce websocket.CloseError
	if !errors.As(s.err, &ce) {
		t.Fatalf("the websocket ended without a close frame: %v", s.err)
	}
	return ce.Code, ce.Reason
}

// Find waits for a JSON message at index from or later that match accepts; it returns it and its
// index.
func (s *WSStream) Find(t testing.TB, from int, what string, d time.Duration, match func(map[string]any) bool) (map[string]any, int) {
	t.Helper()
	var found map[string]any
	at := -1
	Eventually(t, d, what, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for i := from; i < len(s.msgs); i++ {
			var m map[string]any
			if json.Unmarshal(s.msgs[i], &m) == nil && match(m) {
				found, at = m, i
				return true
			}
		}
		return false
	}, func() string { return Tail(s.Bytes.String(), 400) })
	return found, at
}

// Reply waits for the QMP reply carrying id.
func (s *WSStream) Reply(t testing.TB, id string) map[string]any {
	t.Helper()
	m, _ := s.Find(t, 0, "the QMP reply with id "+id, 30*time.Second, func(m map[string]any) bool { return m["id"] == id })
	return m
}

// Event waits for the QMP event name.
func (s *WSStream) Event(t testing.TB, name string) map[string]any {
	t.Helper()
	m, _ := s.Find(t, 0, "the QMP event "+name, 30*time.Second, func(m map[string]any) bool { return m["event"] == name })
	return m
}
