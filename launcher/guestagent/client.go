// Package guestagent is a client for QEMU's guest agent (qemu-ga) on the host end of its
// virtio-serial channel. The protocol looks like QMP (one JSON command, one JSON reply a line) but
// has no greeting and no events, and a connection may hold replies to commands of an earlier
// client, so every session starts with guest-sync-delimited. go-qemu's qmp.Monitor expects the
// QMP greeting and capabilities handshake, so it does not fit.
//
// The guest is untrusted: every reply is bounded (MaxReplyBytes), every call has a deadline, and
// what a reply holds is cut to MaxItems entries and MaxString bytes per string before it leaves
// this package. A transport error, a timeout or an oversized or garbled reply breaks the client
// (Broken): the caller closes it and dials again. Standard library only (and quietconn): the
// launcher links it.
package guestagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"time"

	"github.com/qvirt/qvirt/internal/quietconn"
)

// Bounds on what the guest can make the launcher hold.
const (
	// MaxReplyBytes is the longest reply line read; a longer one breaks the client.
	MaxReplyBytes = 1 << 20
	// MaxItems caps every list in a reply (interfaces, users, filesystems, commands, disks).
	MaxItems = 64
	// MaxString caps every string in a reply, in bytes.
	MaxString = 256
	// DefaultTimeout bounds a call whose context has no deadline.
	DefaultTimeout = 5 * time.Second
	// maxSkipped bounds the stale lines Sync discards before its own reply.
	maxSkipped = 64
)

// ErrBroken is returned once the connection is out of step with the agent; close and dial again.
var ErrBroken = errors.New("guest agent connection broken")

// ErrBusy is returned when the context ended while another call held the connection; the
// client is still usable.
var ErrBusy = errors.New("guest agent connection busy")

// ErrReplyTooLarge is a reply line over MaxReplyBytes.
var ErrReplyTooLarge = fmt.Errorf("guest agent reply exceeds %d bytes", MaxReplyBytes)

// Error is an error reply of the agent (the command ran and failed, or is disabled).
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return "guest agent: " + e.Class + ": " + e.Desc }

// Client talks to one agent over one connection. Calls are serialised (one command in flight);
// a caller waiting for another's call gives up when its context ends. Safe for concurrent use.
type Client struct {
	conn   net.Conn
	rd     *bufio.Reader
	turn   chan struct{} // holds a token while a call runs
	broken bool          // guarded by turn
}

// Dial connects to the agent's channel socket and synchronises with the agent. The connection
// reads and writes quietly (quietconn): an idle instance's launcher polls its agent once a minute,
// and the wake-ups the Go runtime adds to a plain socket's exchange cost more than the exchange.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to the guest agent channel %s: %w", path, err)
	}
	c := New(quietconn.Wrap(conn))
	if err := c.Sync(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// New wraps a connection; call Sync before anything else.
func New(conn net.Conn) *Client {
	return &Client{conn: conn, rd: bufio.NewReaderSize(conn, 4096), turn: make(chan struct{}, 1)}
}

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error { return c.conn.Close() }

// Sync resets the agent's parser (a 0xFF byte, invalid in JSON) and sends guest-sync-delimited
// with a fresh id, then discards whatever comes before the reply carrying that id: replies meant
// for an earlier client, or the agent's complaint about the 0xFF.
func (c *Client) Sync(ctx context.Context) error {
	id := rand.Int64N(1 << 53) // JSON numbers are exact up to 2^53
	req, _ := json.Marshal(map[string]any{"execute": "guest-sync-delimited", "arguments": map[string]any{"id": id}})
	return c.do(ctx, func() error {
		if err := c.write(append([]byte{0xff}, req...)); err != nil {
			return err
		}
		for range maxSkipped {
			line, err := c.readLine()
			if err != nil {
				return err
			}
			ret, err := ParseReply(line)
			if err != nil {
				continue // a stale error reply or garbage: keep looking for ours
			}
			var got int64
			if json.Unmarshal(ret, &got) == nil && got == id {
				return nil
			}
		}
		return fmt.Errorf("guest agent sync: no reply to id %d in %d lines", id, maxSkipped)
	})
}

// call runs one command and returns its "return" value. An *Error reply leaves the client usable.
func (c *Client) call(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", cmd, err)
	}
	var ret json.RawMessage
	err = c.do(ctx, func() error {
		if err := c.write(b); err != nil {
			return err
		}
		line, err := c.readLine()
		if err != nil {
			return err
		}
		ret, err = ParseReply(line)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("guest agent %s: %w", cmd, err)
	}
	return ret, nil
}

// do runs f with the connection to itself and a deadline from ctx (DefaultTimeout at most when
// ctx has none). Any error but an *Error reply breaks the client.
func (c *Client) do(ctx context.Context, f func() error) error {
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", ErrBusy, ctx.Err())
	}
	defer func() { <-c.turn }()
	if c.broken {
		return ErrBroken
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DefaultTimeout)
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		c.broken = true
		return err
	}
	// A context cancelled early (the caller went away) ends the wait too.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = c.conn.SetDeadline(time.Now())
	})
	err := f()
	if !stop() {
		<-fired // its deadline must not land on the next call's
	}
	// A deadline left set is a timer that wakes the idle launcher when it expires, after the call.
	if clearErr := c.conn.SetDeadline(time.Time{}); clearErr != nil && err == nil {
		err = fmt.Errorf("clear the deadline: %w", clearErr)
	}
	var agentErr *Error
	if err != nil && !errors.As(err, &agentErr) {
		c.broken = true
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
	}
	return err
}

func (c *Client) write(b []byte) error {
	_, err := c.conn.Write(append(b, '\n'))
	return err
}

// readLine reads one reply line of at most MaxReplyBytes, without the 0xFF bytes the agent puts
// before a delimited sync reply. Blank lines are skipped.
func (c *Client) readLine() ([]byte, error) {
	var line []byte
	for {
		chunk, err := c.rd.ReadSlice('\n')
		if len(line)+len(chunk) > MaxReplyBytes {
			return nil, ErrReplyTooLarge
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		line = bytes.TrimSpace(trimDelimiters(line))
		if len(line) == 0 {
			continue
		}
		return line, nil
	}
}

// trimDelimiters drops the 0xFF bytes at the start of b (byte-wise: 0xFF is no UTF-8).
func trimDelimiters(b []byte) []byte {
	for len(b) > 0 && b[0] == 0xff {
		b = b[1:]
	}
	return b
}

// ParseReply decodes one reply line: its "return" value, or an *Error.
func ParseReply(line []byte) (json.RawMessage, error) {
	if len(line) > MaxReplyBytes {
		return nil, ErrReplyTooLarge
	}
	var r struct {
		Return json.RawMessage `json:"return"`
		Error  *Error          `json:"error"`
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("malformed reply: %w", err)
	}
	if r.Error != nil {
		r.Error.Class, r.Error.Desc = clip(r.Error.Class), clip(r.Error.Desc)
		return nil, r.Error
	}
	if r.Return == nil {
		return nil, errors.New("malformed reply: neither return nor error")
	}
	return r.Return, nil
}
