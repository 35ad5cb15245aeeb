// Package qmptest is a scripted fake QEMU QMP endpoint for tests: a unix
// socket server that greets like QEMU, negotiates capabilities and then
// hands each connection to the test, which reads requests and writes
// replies and events in whatever order the scenario needs.
//
// It does not import package qmp, so it also serves tests of other QMP
// clients.
package qmptest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server listens on a unix socket in a test's temporary directory. Every
// accepted connection is greeted and negotiated (unless WithoutHandshake)
// in the background, then queued for Accept. Cleanup closes the listener
// and every connection.
type Server struct {
	// Path is the socket to dial.
	Path string

	cfg      config
	ln       *net.UnixListener
	accepted chan accepted
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns []*Conn
}

type accepted struct {
	c   *Conn
	err error
}

type config struct {
	greeting  []byte
	handshake bool
}

// Option configures NewServer.
type Option func(*config)

// WithGreeting replaces the default greeting, which announces QEMU 7.2.0
// with the "oob" capability, as Debian bookworm's QEMU does.
func WithGreeting(major, minor, micro int, pkg string, capabilities ...string) Option {
	return func(c *config) { c.greeting = greeting(major, minor, micro, pkg, capabilities) }
}

// WithoutHandshake hands connections over before anything is sent: the test
// writes the greeting (or something else) itself.
func WithoutHandshake() Option {
	return func(c *config) { c.handshake = false }
}

func greeting(major, minor, micro int, pkg string, caps []string) []byte {
	if caps == nil {
		caps = []string{}
	}
	var g struct {
		QMP struct {
			Version struct {
				QEMU struct {
					Micro int `json:"micro"`
					Minor int `json:"minor"`
					Major int `json:"major"`
				} `json:"qemu"`
				Package string `json:"package"`
			} `json:"version"`
			Capabilities []string `json:"capabilities"`
		} `json:"QMP"`
	}
	g.QMP.Version.QEMU.Major, g.QMP.Version.QEMU.Minor, g.QMP.Version.QEMU.Micro = major, minor, micro
	g.QMP.Version.Package = pkg
	g.QMP.Capabilities = caps
	b, _ := json.Marshal(g) // cannot fail: fixed types
	return b
}

// NewServer starts a fake QMP server. Call it from the test goroutine.
func NewServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	cfg := config{greeting: greeting(7, 2, 0, "qmptest", []string{"oob"}), handshake: true}
	for _, o := range opts {
		o(&cfg)
	}
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("qmptest: listen %s: %v", path, err)
	}
	s := &Server{Path: path, cfg: cfg, ln: ln, accepted: make(chan accepted, 16)}
	s.wg.Add(1)
	go s.acceptLoop()
	t.Cleanup(s.close)
	return s
}

// Accept returns the next connection, after its handshake. A failed
// handshake is returned as the error.
func (s *Server) Accept(ctx context.Context) (*Conn, error) {
	select {
	case a := <-s.accepted:
		return a.c, a.err
	case <-ctx.Done():
		return nil, fmt.Errorf("qmptest: accept: %w", ctx.Err())
	}
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		uc, err := s.ln.AcceptUnix()
		if err != nil {
			return // listener closed by cleanup
		}
		c := newConn(uc)
		s.track(c)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.accepted <- accepted{c: c, err: s.handshake(c)}
		}()
	}
}

func (s *Server) track(c *Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns = append(s.conns, c)
}

func (s *Server) handshake(c *Conn) error {
	if !s.cfg.handshake {
		return nil
	}
	if err := c.WriteRaw(s.cfg.greeting); err != nil {
		return err
	}
	req, err := c.ReadRequest()
	if err != nil {
		return fmt.Errorf("qmptest: handshake: %w", err)
	}
	if req.Execute != "qmp_capabilities" {
		return fmt.Errorf("qmptest: handshake: got %q, want qmp_capabilities", req.Execute)
	}
	var args struct {
		Enable []string `json:"enable"`
	}
	if len(req.Arguments) > 0 {
		if err := json.Unmarshal(req.Arguments, &args); err != nil {
			return fmt.Errorf("qmptest: handshake: qmp_capabilities arguments: %w", err)
		}
	}
	c.Enabled = args.Enable
	return c.Reply(req, struct{}{})
}

func (s *Server) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	// Handshake goroutines may be blocked on a full accepted queue.
	go func() {
		for range s.accepted {
		}
	}()
	s.wg.Wait()
	close(s.accepted)
}

// Request is one command read from the client.
type Request struct {
	Execute   string          `json:"execute"`
	ExecOOB   string          `json:"exec-oob,omitempty"` // a command sent out of band
	Arguments json.RawMessage `json:"arguments,omitempty"`
	ID        json.RawMessage `json:"id,omitempty"`
	// FDs are descriptors received as SCM_RIGHTS up to and with this
	// request. The test owns them and should close them.
	FDs []*os.File `json:"-"`
}

// Conn is one client connection. ReadRequest must not be called from two
// goroutines at once; the write methods are safe for concurrent use.
type Conn struct {
	uc  *net.UnixConn
	r   *fdReader
	dec *json.Decoder

	writeMu sync.Mutex

	// Enabled are the capabilities the client enabled in its qmp_capabilities.
	Enabled []string
}

func newConn(uc *net.UnixConn) *Conn {
	r := &fdReader{uc: uc}
	return &Conn{uc: uc, r: r, dec: json.NewDecoder(r)}
}

// ReadRequest reads the next command. It returns io.EOF once the client
// closed the connection.
func (c *Conn) ReadRequest() (Request, error) {
	var req Request
	if err := c.dec.Decode(&req); err != nil {
		return Request{}, err
	}
	req.FDs = c.r.take()
	return req, nil
}

// Reply answers req successfully with ret as "return".
func (c *Conn) Reply(req Request, ret any) error {
	return c.writeJSON(struct {
		Return any             `json:"return"`
		ID     json.RawMessage `json:"id,omitempty"`
	}{ret, req.ID})
}

// ReplyError answers req with a QMP error.
func (c *Conn) ReplyError(req Request, class, desc string) error {
	type qerr struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	}
	return c.writeJSON(struct {
		Error qerr            `json:"error"`
		ID    json.RawMessage `json:"id,omitempty"`
	}{qerr{class, desc}, req.ID})
}

// SendEvent sends an event with the current time as its timestamp. data
// may be nil.
func (c *Conn) SendEvent(name string, data any) error {
	now := time.Now()
	type ts struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	}
	return c.writeJSON(struct {
		Event     string `json:"event"`
		Data      any    `json:"data,omitempty"`
		Timestamp ts     `json:"timestamp"`
	}{name, data, ts{now.Unix(), int64(now.Nanosecond() / 1000)}})
}

// WriteRaw writes b and QEMU's line ending as they are.
func (c *Conn) WriteRaw(b []byte) error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if _, err := c.uc.Write(append(b[:len(b):len(b)], '\r', '\n')); err != nil {
		return fmt.Errorf("qmptest: write: %w", err)
	}
	return nil
}

func (c *Conn) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("qmptest: encode: %w", err)
	}
	return c.WriteRaw(b)
}

// Close drops the connection, as QEMU exiting would.
func (c *Conn) Close() error {
	err := c.uc.Close()
	c.r.closeFDs()
	return err
}

// Handler answers one request. Returning an error stops Serve.
type Handler func(c *Conn, req Request) error

// Serve answers requests with h until the client disconnects (nil) or
// reading, or h, fails.
func (c *Conn) Serve(h Handler) error {
	for {
		req, err := c.ReadRequest()
		if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := h(c, req); err != nil {
			return err
		}
	}
}

// fdReader reads the stream with recvmsg so descriptors sent with
// SCM_RIGHTS are collected instead of discarded.
type fdReader struct {
	uc *net.UnixConn

	mu  sync.Mutex
	fds []*os.File
}

func (r *fdReader) Read(p []byte) (int, error) {
	oob := make([]byte, syscall.CmsgSpace(16*4))
	n, oobn, _, _, err := r.uc.ReadMsgUnix(p, oob)
	n = max(n, 0) // recvmsg's -1 leaks through on some errors
	if oobn > 0 {
		r.keep(oob[:oobn])
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	return n, err
}

func (r *fdReader) keep(oob []byte) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			r.fds = append(r.fds, os.NewFile(uintptr(fd), fmt.Sprintf("qmptest-fd-%d", fd)))
		}
	}
}

func (r *fdReader) take() []*os.File {
	r.mu.Lock()
	defer r.mu.Unlock()
	fds := r.fds
	r.fds = nil
	return fds
}

func (r *fdReader) closeFDs() {
	for _, f := range r.take() {
		_ = f.Close()
	}
}
