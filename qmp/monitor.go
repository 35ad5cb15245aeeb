package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"
)

var (
	// ErrClosed is returned by calls made after, or pending during,
	// Monitor.Close.
	ErrClosed = errors.New("qmp: monitor closed")
	// ErrDisconnected is wrapped, together with the cause, in the error of
	// every call pending or made after the connection to QEMU was lost.
	ErrDisconnected = errors.New("qmp: connection to QEMU lost")
)

// DefaultRunTimeout bounds the context-free calls of go-qemu's qmp.Monitor
// interface (Run) unless WithRunTimeout says otherwise.
const DefaultRunTimeout = 30 * time.Second

// Option configures Dial.
type Option func(*options)

type options struct {
	runTimeout time.Duration
}

// WithRunTimeout sets the deadline applied to Run, the go-qemu interface
// method that takes no context. Zero or negative means no deadline.
func WithRunTimeout(d time.Duration) Option {
	return func(o *options) { o.runTimeout = d }
}

// Monitor is a QMP connection to one QEMU process. It is safe for concurrent
// use; see the package documentation for the full contract.
type Monitor struct {
	conn       *net.UnixConn
	dec        *json.Decoder // owned by the reading goroutine after Dial
	greeting   greeting
	oob        bool // out-of-band execution enabled; set by the handshake, before Dial returns
	runTimeout time.Duration

	nextID  atomic.Uint64
	writeMu sync.Mutex // serialises writes so commands never interleave

	mu       sync.Mutex // guards the fields below
	pending  map[string]chan reply
	subs     map[*Subscription]struct{}
	waiters  map[*Waiter]struct{}
	err      error           // set once, when the reading goroutine stops
	closing  bool            // Close was called: the final error is ErrClosed
	broken   error           // why the monitor itself cut the connection, if it did
	commands map[string]bool // query-commands cache for HasCommand

	closeOnce sync.Once
	closeErr  error
	done      chan struct{} // closed after the reader stopped and failed everyone
}

// reply is what the reading goroutine hands to a waiting command.
type reply struct {
	raw json.RawMessage // the whole reply message, for go-qemu's Run
	ret json.RawMessage // the "return" value
	err error           // *Error, or the connection's final error
}

// request is the wire form of a command: Execute for one run in QEMU's main loop, ExecOOB for one
// run out of band. go-qemu's Command has no id.
type request struct {
	Execute   string `json:"execute,omitempty"`
	ExecOOB   string `json:"exec-oob,omitempty"`
	Arguments any    `json:"arguments,omitempty"`
	ID        string `json:"id"`
}

// Dial connects to the QMP unix socket at socketPath, reads QEMU's greeting
// and leaves capabilities negotiation. ctx bounds the whole handshake but not
// the returned Monitor's lifetime. Dial does not retry: a socket that does
// not exist yet is an error.
func Dial(ctx context.Context, socketPath string, opts ...Option) (*Monitor, error) {
	o := options{runTimeout: DefaultRunTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("qmp dial %s: %w", socketPath, err)
	}
	m := newMonitor(c.(*net.UnixConn), o)
	if err := m.handshake(ctx); err != nil {
		_ = m.Close()
		return nil, fmt.Errorf("qmp dial %s: %w", socketPath, err)
	}
	return m, nil
}

func newMonitor(c *net.UnixConn, o options) *Monitor {
	return &Monitor{
		conn:       c,
		dec:        json.NewDecoder(c),
		runTimeout: o.runTimeout,
		pending:    make(map[string]chan reply),
		subs:       make(map[*Subscription]struct{}),
		waiters:    make(map[*Waiter]struct{}),
		done:       make(chan struct{}),
	}
}

// handshake reads the greeting synchronously, then starts the reading
// goroutine and negotiates capabilities through the ordinary command path.
// QEMU sends no events before qmp_capabilities, so nothing is lost by
// starting the reader late.
func (m *Monitor) handshake(ctx context.Context) error {
	g, err := m.readGreeting(ctx)
	if err != nil {
		close(m.done) // no reader will ever run; let Close return.
		return err
	}
	m.greeting = g
	go m.readLoop()
	// Out-of-band execution is enabled where QEMU offers it, for the few commands that must
	// answer while QEMU's main loop is blocked (ExecuteOOB).
	var args any
	if slices.Contains(g.Capabilities, "oob") {
		args = map[string][]string{"enable": {"oob"}}
	}
	if _, err := m.Execute(ctx, "qmp_capabilities", args); err != nil {
		return err
	}
	m.oob = args != nil
	return nil
}

// maxEventsBeforeGreeting bounds the events readGreeting passes over. QEMU should send none before
// its greeting, yet one was seen once under load (the probe's QEMU, -machine none): an event
// carries no state the handshake needs, so it is skipped rather than failing the connection.
const maxEventsBeforeGreeting = 8

func (m *Monitor) readGreeting(ctx context.Context) (greeting, error) {
	stop := interruptOnDone(ctx, m.conn.SetReadDeadline)
	defer stop()
	for range maxEventsBeforeGreeting + 1 {
		var raw json.RawMessage
		if err := m.dec.Decode(&raw); err != nil {
			return greeting{}, fmt.Errorf("read greeting: %w", contextCause(ctx, err))
		}
		msg, err := decodeMessage(raw)
		if err != nil {
			return greeting{}, fmt.Errorf("read greeting: %w", err)
		}
		switch msg.kind {
		case kindGreeting:
			return msg.greeting, nil
		case kindEvent:
			continue
		}
		return greeting{}, fmt.Errorf("read greeting: got a %s message first", msg.kind)
	}
	return greeting{}, fmt.Errorf("read greeting: more than %d events and no greeting", maxEventsBeforeGreeting)
}

// Version is QEMU's version as announced in the greeting.
func (m *Monitor) Version() gqmp.Version { return m.greeting.Version }

// Capabilities are the QMP capabilities QEMU offered in the greeting; "oob", when offered, is
// enabled.
func (m *Monitor) Capabilities() []string {
	return append([]string(nil), m.greeting.Capabilities...)
}

// Done is closed once the monitor stopped: after Close, or when the
// connection to QEMU was lost. Err then says which.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Err is nil while the monitor works; afterwards it is ErrClosed or an error
// wrapping ErrDisconnected and the cause.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Close closes the connection, fails pending calls with ErrClosed, closes
// every subscription and waits for the reading goroutine to stop. It is safe
// to call more than once and from many goroutines; only the first call
// returns the connection's close error.
func (m *Monitor) Close() error {
	first := false
	m.closeOnce.Do(func() {
		first = true
		m.mu.Lock()
		m.closing = true
		m.mu.Unlock()
		m.closeErr = m.conn.Close()
	})
	<-m.done
	if !first {
		return nil
	}
	return m.closeErr
}

// Execute runs a QMP command and returns its "return" value. args is
// marshalled to the command's "arguments" object; nil sends none. A QMP
// error reply comes back as a wrapped *Error.
func (m *Monitor) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	r, err := m.execute(ctx, cmd, args, nil)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	return r.ret, nil
}

// Call runs a QMP command and unmarshals its return value into out, which
// may be nil to discard it. (It cannot be called Run: go-qemu's qmp.Monitor
// interface takes that name.)
func (m *Monitor) Call(ctx context.Context, cmd string, args, out any) error {
	ret, err := m.Execute(ctx, cmd, args)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(ret, out); err != nil {
		return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
	}
	return nil
}

// ExecuteOOB runs a command out of band where QEMU offers it, in band otherwise, and returns its
// "return" value. QEMU runs an out-of-band command on its monitor thread, so it answers while the
// main loop is blocked (as on a post-copy target whose link broke: any thread that touches a page
// not yet received waits for it), where an in-band command would wait with it. Only commands
// QEMU's schema marks allow-oob may be sent so.
func (m *Monitor) ExecuteOOB(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	req := request{Execute: cmd, Arguments: args}
	if m.oob {
		req = request{ExecOOB: cmd, Arguments: args}
	}
	r, err := m.send(ctx, req, nil)
	if err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	return r.ret, nil
}

// execute sends one command, with oob as SCM_RIGHTS ancillary data when not
// nil, and waits for its reply.
func (m *Monitor) execute(ctx context.Context, cmd string, args any, oob []byte) (reply, error) {
	return m.send(ctx, request{Execute: cmd, Arguments: args}, oob)
}

// send sends req under a fresh id and waits for its reply.
func (m *Monitor) send(ctx context.Context, req request, oob []byte) (reply, error) {
	id := strconv.FormatUint(m.nextID.Add(1), 10)
	req.ID = id
	b, err := json.Marshal(req)
	if err != nil {
		return reply{}, fmt.Errorf("encode arguments: %w", err)
	}
	ch, err := m.register(id)
	if err != nil {
		return reply{}, err
	}
	defer m.unregister(id)
	if err := m.write(ctx, b, oob); err != nil {
		return reply{}, err
	}
	select {
	case r := <-ch:
		return r, r.err
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

// register reserves the reply slot for id. The slot is buffered so the
// reading goroutine never waits for a caller that gave up.
func (m *Monitor) register(id string) (chan reply, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	ch := make(chan reply, 1)
	m.pending[id] = ch
	return ch, nil
}

func (m *Monitor) unregister(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, id)
}

// write sends b (and oob) whole or fails. A write cut short by ctx or an
// error leaves a partial command on the stream that QEMU cannot parse, so
// the connection is then closed and every caller learns of it.
func (m *Monitor) write(ctx context.Context, b, oob []byte) error {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	stop := interruptOnDone(ctx, m.conn.SetWriteDeadline)
	n, err := m.writeAll(b, oob)
	stop()
	if err == nil {
		return nil
	}
	err = contextCause(ctx, err)
	if n > 0 {
		m.breakConn(fmt.Errorf("command cut short after %d of %d bytes: %w", n, len(b), err))
	}
	return err
}

// breakConn closes the connection because the stream can no longer be
// trusted; cause becomes the reason every caller is given.
func (m *Monitor) breakConn(cause error) {
	m.mu.Lock()
	if m.broken == nil {
		m.broken = cause
	}
	m.mu.Unlock()
	_ = m.conn.Close()
}

func (m *Monitor) writeAll(b, oob []byte) (int, error) {
	if oob == nil {
		return m.conn.Write(b)
	}
	// sendmsg on a stream socket may send only part of b; the ancillary data
	// travels with the first byte, so the rest goes out as a plain write.
	n, _, err := m.conn.WriteMsgUnix(b, oob, nil)
	if err != nil || n == len(b) {
		return n, err
	}
	k, err := m.conn.Write(b[n:])
	return n + k, err
}

// readLoop is the only reader of the connection. It runs from the end of the
// greeting until the connection fails or is closed.
func (m *Monitor) readLoop() {
	var d dispatcher
	for {
		var raw json.RawMessage
		if err := m.dec.Decode(&raw); err != nil {
			m.shutdown(err)
			return
		}
		msg, err := decodeMessage(raw)
		if err != nil {
			continue // valid JSON QEMU never sends; nothing waits for it.
		}
		d.dispatch(m, msg, raw)
	}
}

// dispatcher holds the reading goroutine's scratch space, so that fanning
// an event out does not allocate per event.
type dispatcher struct {
	subs    []*Subscription
	waiters []*Waiter
}

func (d *dispatcher) dispatch(m *Monitor, msg message, raw json.RawMessage) {
	switch msg.kind {
	case kindReturn:
		m.deliverReply(msg.id, reply{raw: raw, ret: msg.ret})
	case kindError:
		m.deliverReply(msg.id, reply{raw: raw, err: msg.err})
	case kindEvent:
		d.fanOut(m, msg.event)
	}
}

// deliverReply hands a reply to the caller waiting for id, if any. Replies
// without a known id (an abandoned command, or an error QEMU could not tie
// to a request) are dropped.
func (m *Monitor) deliverReply(id string, r reply) {
	m.mu.Lock()
	ch, ok := m.pending[id]
	delete(m.pending, id)
	m.mu.Unlock()
	if ok {
		ch <- r
	}
}

func (d *dispatcher) fanOut(m *Monitor, ev gqmp.Event) {
	m.mu.Lock()
	d.subs = d.subs[:0]
	for s := range m.subs {
		d.subs = append(d.subs, s)
	}
	d.waiters = d.waiters[:0]
	for w := range m.waiters {
		d.waiters = append(d.waiters, w)
	}
	m.mu.Unlock()
	for _, w := range d.waiters {
		w.offer(ev)
	}
	for _, s := range d.subs {
		s.deliver(ev)
	}
	clear(d.subs)
	clear(d.waiters)
}

// shutdown runs once, on the reading goroutine, when reading stops. It
// records the final error and fails everything that waits on the monitor.
func (m *Monitor) shutdown(cause error) {
	m.mu.Lock()
	if m.broken != nil {
		cause = m.broken
	}
	if m.closing {
		m.err = ErrClosed
	} else {
		m.err = fmt.Errorf("%w: %w", ErrDisconnected, cause)
	}
	err := m.err
	pending, subs, waiters := m.pending, m.subs, m.waiters
	m.pending, m.subs, m.waiters = nil, nil, nil
	m.mu.Unlock()

	_ = m.conn.Close()
	for _, ch := range pending {
		ch <- reply{err: err}
	}
	for w := range waiters {
		w.finish(gqmp.Event{}, err)
	}
	for s := range subs {
		s.close()
	}
	close(m.done)
}

// interruptOnDone makes blocked I/O return once ctx is done, by moving the
// connection's deadline into the past. The returned stop function undoes
// that and must be called before the next I/O.
func interruptOnDone(ctx context.Context, setDeadline func(time.Time) error) (stop func()) {
	var mu sync.Mutex
	finished := false
	cancel := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !finished {
			_ = setDeadline(time.Unix(1, 0))
		}
	})
	return func() {
		cancel()
		mu.Lock()
		finished = true
		mu.Unlock()
		_ = setDeadline(time.Time{})
	}
}

// contextCause prefers the context's error over the deadline error that
// interruptOnDone provoked.
func contextCause(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return err
}
