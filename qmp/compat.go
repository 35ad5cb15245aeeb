package qmp

import (
	"context"
	"encoding/json"
	"fmt"

	gqmp "github.com/digitalocean/go-qemu/qmp"
)

// Monitor implements go-qemu's interface so code written against go-qemu
// (its qmp/raw wrappers, qemu.Domain) can run on this transport.
var _ gqmp.Monitor = (*Monitor)(nil)

// EventsBuffer is the subscription size behind Events.
const EventsBuffer = 256

// Connect is part of go-qemu's qmp.Monitor. Dial has already connected and
// negotiated, so Connect only reports whether the monitor still works; it
// cannot reconnect a stopped monitor.
func (m *Monitor) Connect() error {
	return m.Err()
}

// Disconnect is part of go-qemu's qmp.Monitor; it is Close.
func (m *Monitor) Disconnect() error {
	return m.Close()
}

// Run is part of go-qemu's qmp.Monitor. command is a whole QMP command,
// {"execute": ..., "arguments": ...}; any "id" in it is replaced by the
// monitor's own. It returns the whole reply message, as go-qemu does, and
// bounds the call with the run timeout (see WithRunTimeout). Prefer Execute.
func (m *Monitor) Run(command []byte) ([]byte, error) {
	var c struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments,omitempty"`
	}
	if err := json.Unmarshal(command, &c); err != nil {
		return nil, fmt.Errorf("qmp run: decode command: %w", err)
	}
	if c.Execute == "" {
		return nil, fmt.Errorf("qmp run: command has no \"execute\"")
	}
	ctx, cancel := m.runContext()
	defer cancel()
	var args any
	if len(c.Arguments) > 0 && string(c.Arguments) != "null" {
		args = c.Arguments
	}
	r, err := m.execute(ctx, c.Execute, args, nil)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", c.Execute, err)
	}
	return r.raw, nil
}

func (m *Monitor) runContext() (context.Context, context.CancelFunc) {
	if m.runTimeout <= 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), m.runTimeout)
}

// Events is part of go-qemu's qmp.Monitor: a stream of events until ctx ends
// or the monitor stops, then the channel is closed. It is a Subscription of
// EventsBuffer events, so an undrained stream loses its oldest events
// instead of blocking commands as go-qemu's does.
func (m *Monitor) Events(ctx context.Context) (<-chan gqmp.Event, error) {
	if err := m.Err(); err != nil {
		return nil, fmt.Errorf("qmp events: %w", err)
	}
	s := m.Subscribe(EventsBuffer)
	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-m.done: // the monitor closed the subscription.
		}
	}()
	return s.Events(), nil
}
