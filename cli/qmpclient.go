package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"
)

// qmpReadLimit bounds one QMP message; query-qmp-schema alone is a few hundred KiB.
const qmpReadLimit = 64 << 20

// qmpMessage is any message QEMU (through qvirt-api) sends: greeting, reply or event.
type qmpMessage struct {
	Greeting json.RawMessage `json:"QMP,omitempty"`
	Return   json.RawMessage `json:"return,omitempty"`
	Error    *qmpError       `json:"error,omitempty"`
	Event    string          `json:"event,omitempty"`
	ID       json.RawMessage `json:"id,omitempty"`
	raw      []byte
}

// qmpError is a QMP error reply; as a Go error it reads "CLASS: desc".
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return e.Class + ": " + e.Desc }

// qmpClient speaks QMP over a websocket: one reader goroutine sorts replies from events, and
// commands run one at a time, each matched to its reply by id.
type qmpClient struct {
	conn   *websocket.Conn
	mu     sync.Mutex // serialises commands
	nextID int
	// replies carries replies in order; events carries events (dropped when nobody listens).
	replies chan qmpMessage
	events  chan qmpMessage
	done    chan struct{}
	err     error // why the reader stopped; read after done is closed
}

// newQMPClient reads the greeting, starts the reader and negotiates capabilities.
func newQMPClient(ctx context.Context, conn *websocket.Conn) (*qmpClient, error) {
	conn.SetReadLimit(qmpReadLimit)
	_, b, err := conn.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("read QMP greeting: %w", err)
	}
	var greet qmpMessage
	if err := json.Unmarshal(b, &greet); err != nil || greet.Greeting == nil {
		return nil, fmt.Errorf("expected a QMP greeting, got %q", truncate(b, 200))
	}
	q := &qmpClient{conn: conn, replies: make(chan qmpMessage, 1), events: make(chan qmpMessage, 64), done: make(chan struct{})}
	go q.read(ctx)
	if _, err := q.Execute(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, fmt.Errorf("negotiate QMP capabilities: %w", err)
	}
	return q, nil
}

func (q *qmpClient) read(ctx context.Context) {
	defer close(q.done)
	for {
		_, b, err := q.conn.Read(ctx)
		if err != nil {
			q.err = err
			return
		}
		var m qmpMessage
		if err := json.Unmarshal(b, &m); err != nil {
			q.err = fmt.Errorf("undecodable QMP message %q: %w", truncate(b, 200), err)
			return
		}
		m.raw = b
		if m.Event != "" {
			select {
			case q.events <- m:
			default:
			}
			continue
		}
		select {
		case q.replies <- m:
		case <-ctx.Done():
			q.err = ctx.Err()
			return
		}
	}
}

// Execute runs one command and returns its "return" value; a QMP error reply is a *qmpError.
func (q *qmpClient) Execute(ctx context.Context, command string, args json.RawMessage) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	id := "qvirtctl-" + strconv.Itoa(q.nextID)
	req := map[string]any{"execute": command, "id": id}
	if len(args) > 0 {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", command, err)
	}
	if err := q.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return nil, q.lost(fmt.Errorf("send %s: %w", command, err))
	}
	want, _ := json.Marshal(id)
	for {
		select {
		case m := <-q.replies:
			if m.ID != nil && !bytes.Equal(m.ID, want) {
				continue // a reply to a command whose caller gave up
			}
			if m.Error != nil {
				return nil, m.Error
			}
			return m.Return, nil
		case <-q.done:
			return nil, q.lost(fmt.Errorf("QMP connection closed before the reply to %s", command))
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// lost prefers the reader's reason (a close status with its reason) to err.
func (q *qmpClient) lost(err error) error {
	select {
	case <-q.done:
		var ce websocket.CloseError
		if errors.As(q.err, &ce) {
			return fmt.Errorf("QMP session closed by the server (status %d): %s", ce.Code, ce.Reason)
		}
	default:
	}
	return err
}

// Close ends the session.
func (q *qmpClient) Close() { q.conn.Close(websocket.StatusNormalClosure, "bye") }

// parseQMPArgs checks a one-shot command line (COMMAND [JSON-ARGS]) before anything is sent.
func parseQMPArgs(words []string) (string, json.RawMessage, error) {
	if len(words) == 0 {
		return "", nil, errors.New("no QMP command after --; for example: -- query-status")
	}
	if len(words) > 2 {
		return "", nil, fmt.Errorf("too many arguments after --: want COMMAND [JSON-ARGS], got %d words (quote the JSON as one argument)", len(words))
	}
	cmd := words[0]
	if err := checkCommandName(cmd); err != nil {
		return "", nil, err
	}
	if len(words) == 1 {
		return cmd, nil, nil
	}
	args, err := parseJSONArgs(words[1])
	if err != nil {
		return "", nil, fmt.Errorf("JSON-ARGS of %s: %w", cmd, err)
	}
	return cmd, args, nil
}

// checkCommandName accepts QMP's command names: letters, digits, '-' and '_' (and '.' for
// vendor extensions such as x-foo.bar).
func checkCommandName(s string) error {
	if s == "" {
		return errors.New("empty QMP command name")
	}
	for _, r := range s {
		ok := r == '-' || r == '_' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return fmt.Errorf("QMP command %q: names contain only letters, digits, '-', '_' and '.'", s)
		}
	}
	return nil
}

// parseJSONArgs accepts one JSON object (QMP's "arguments"), compacted.
func parseJSONArgs(s string) (json.RawMessage, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, fmt.Errorf("%q is not a JSON object: %w", truncate([]byte(s), 80), err)
	}
	if obj == nil {
		return nil, fmt.Errorf("%q is not a JSON object (QMP arguments are {\"name\": value, ...})", truncate([]byte(s), 80))
	}
	if strings.TrimSpace(s[dec.InputOffset():]) != "" {
		return nil, fmt.Errorf("%q: unexpected data after the JSON object", truncate([]byte(s), 80))
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(s)); err != nil {
		return nil, fmt.Errorf("%q: %w", truncate([]byte(s), 80), err)
	}
	return buf.Bytes(), nil
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}
