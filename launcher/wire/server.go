package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/internal/quietconn"
)

// ErrServerClosed is what Serve returns after Shutdown or Close.
var ErrServerClosed = errors.New("wire: server closed")

// Request is one request, its body read whole before the handler runs.
type Request struct {
	Method string
	// Path is the request target's unescaped path, Query its query.
	Path    string
	rawPath string
	Query   url.Values
	Header  textproto.MIMEHeader
	Body    []byte
	// proto11 is an HTTP/1.1 request; close asks to end the connection after the reply.
	proto11, close bool
	ctx            context.Context
	params         map[string]string
}

// Context ends when the client goes away or the server closes.
func (r *Request) Context() context.Context { return r.ctx }

// PathValue is the path segment the route's {name} matched.
func (r *Request) PathValue(name string) string { return r.params[name] }

// HandlerFunc answers a request.
type HandlerFunc func(w *ResponseWriter, r *Request)

// Server serves HTTP/1.1 on a listener. Its zero limits take the defaults below.
type Server struct {
	Handler HandlerFunc
	// ReadTimeout bounds reading a request, head and body, from its first byte, and a new
	// connection's wait for its first request (10 s).
	ReadTimeout time.Duration
	// IdleTimeout ends a kept-alive connection that sends no further request (2 minutes).
	IdleTimeout time.Duration
	// WriteTimeout ends a connection whose client reads nothing of a reply for this long (1
	// minute): a peer that stops reading a status watch holds no handler for ever.
	WriteTimeout time.Duration
	// MaxHeadBytes bounds a request's line and headers (64 KiB); MaxBodyBytes its body (4 MiB).
	MaxHeadBytes int64
	MaxBodyBytes int64
	// ErrorBody formats the body of a refusal the server makes itself (a malformed request, an
	// unknown route), with its Content-Type; nil: plain text.
	ErrorBody func(code int, msg string) (contentType string, body []byte)
	// Log records a handler's panic, which ends only its connection.
	Log logr.Logger

	mu         sync.Mutex
	listeners  map[net.Listener]struct{}
	conns      map[*conn]struct{}
	onShutdown []func()
	closing    atomic.Bool
	active     sync.WaitGroup
}

const (
	defaultReadTimeout  = 10 * time.Second
	defaultIdleTimeout  = 2 * time.Minute
	defaultWriteTimeout = time.Minute
	defaultMaxHead      = 64 << 10
	defaultMaxBody      = 4 << 20
	bufferSize          = 4 << 10
)

// RegisterOnShutdown adds fn to what Shutdown calls, for long replies (a watch) to end.
func (s *Server) RegisterOnShutdown(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onShutdown = append(s.onShutdown, fn)
}

// Serve accepts connections on ln and serves each in its own goroutine until Shutdown or Close.
func (s *Server) Serve(ln net.Listener) error {
	if !s.track(ln) {
		_ = ln.Close()
		return ErrServerClosed
	}
	defer s.untrack(ln)
	defer ln.Close()
	var backoff time.Duration
	for {
		rwc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return ErrServerClosed
			}
			if !temporary(err) {
				return fmt.Errorf("accept: %w", err)
			}
			// Out of descriptors or memory for a moment: the launcher must not end its VM for it.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.Log.Info("accept failed; retrying", "error", err.Error(), "after", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		// Quiet reads and writes: what reaches an idle launcher here is a status watch's heartbeat
		// (on a timerfd, whose firing does not wake the runtime's monitor thread) and a probe's
		// request, and a plain read or write would wake that thread (package quietconn).
		c := &conn{srv: s, rwc: quietconn.Wrap(rwc)}
		if !s.add(c) {
			_ = rwc.Close()
			return ErrServerClosed
		}
		go c.serve()
	}
}

// Shutdown stops accepting, lets the requests being served finish and closes idle connections,
// until ctx ends (then it returns ctx's error; Close ends the rest).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	for ln := range s.listeners {
		_ = ln.Close()
	}
	fns := slices.Clone(s.onShutdown)
	// A connection waiting for a request wakes and ends; one reading or serving a request ends
	// after its reply (setIdle sees closing). Both under mu, so none is missed.
	for c := range s.conns {
		if c.idle {
			_ = c.rwc.SetReadDeadline(aLongTimeAgo)
		}
	}
	s.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close closes the listeners and every connection at once.
func (s *Server) Close() error {
	s.closing.Store(true)
	s.mu.Lock()
	defer s.mu.Unlock()
	for ln := range s.listeners {
		_ = ln.Close()
	}
	for c := range s.conns {
		_ = c.rwc.Close()
	}
	return nil
}

func (s *Server) track(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
	}
	s.listeners[ln] = struct{}{}
	return true
}

func (s *Server) untrack(ln net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.listeners, ln)
}

// add tracks a new connection, idle until its first request, which it waits for ReadTimeout.
func (s *Server) add(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	if s.conns == nil {
		s.conns = map[*conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	s.active.Add(1)
	c.idle = true
	_ = c.rwc.SetReadDeadline(time.Now().Add(orDefault(s.ReadTimeout, defaultReadTimeout)))
	return true
}

// setActive marks c as reading a request whose first byte arrived
// and gives it ReadTimeout to arrive whole (in place of a past deadline Shutdown may have set
// since it arrived). It reports whether the server is closing: the request is answered all the
// same, and the connection closed after.
func (s *Server) setActive(c *conn) (closing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.idle = false
	_ = c.rwc.SetReadDeadline(time.Now().Add(orDefault(s.ReadTimeout, defaultReadTimeout)))
	return s.closing.Load()
}

// setIdle marks c as waiting for its next request, IdleTimeout at most, unless the server is
// closing.
func (s *Server) setIdle(c *conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	c.idle = true
	_ = c.rwc.SetReadDeadline(time.Now().Add(orDefault(s.IdleTimeout, defaultIdleTimeout)))
	return true
}

// temporary reports an accept error worth retrying: the process or the system is out of
// descriptors or memory for now.
func temporary(err error) bool {
	for _, errno := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return isTimeout(err)
}

func (s *Server) remove(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.active.Done()
}

func orDefault[T int64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// requestError is a request the server refuses before any handler sees it.
type requestError struct {
	code int
	msg  string
}

func (e *requestError) Error() string { return e.msg }

func refuse(code int, format string, args ...any) error {
	return &requestError{code: code, msg: fmt.Sprintf(format, args...)}
}

// conn is one client connection.
type conn struct {
	srv *Server
	rwc net.Conn
	lr  *limitedReader
	br  *bufio.Reader
	bw  *bufio.Writer
	// idle: waiting for a request (guarded by srv.mu); Shutdown wakes those.
	idle bool
}

func (c *conn) serve() {
	defer c.srv.remove(c)
	defer c.rwc.Close()
	defer func() {
		if v := recover(); v != nil {
			c.srv.Log.Error(fmt.Errorf("%v", v), "a command handler panicked; its connection ends", "stack", string(debug.Stack()))
		}
	}()
	c.lr = &limitedReader{r: c.rwc, remain: -1}
	c.br = bufio.NewReaderSize(c.lr, bufferSize)
	c.bw = bufio.NewWriterSize(&deadlineWriter{conn: c.rwc, timeout: orDefault(c.srv.WriteTimeout, defaultWriteTimeout)}, bufferSize)
	for {
		req, err := c.next()
		if err != nil {
			c.refuse(err)
			return
		}
		if !c.handle(req) || req.close || !req.proto11 || !c.srv.setIdle(c) {
			return
		}
	}
}

// refuse answers a request that could not be read, unless the client just went away.
func (c *conn) refuse(err error) {
	var re *requestError
	if !errors.As(err, &re) {
		return
	}
	w := &ResponseWriter{bw: c.bw, header: textproto.MIMEHeader{}, proto11: true, closeAfter: true}
	c.srv.writeError(w, re.code, re.msg)
	_ = w.finish()
}

func (s *Server) writeError(w *ResponseWriter, code int, msg string) {
	contentType, body := "text/plain; charset=utf-8", []byte(msg+"\n")
	if s.ErrorBody != nil {
		contentType, body = s.ErrorBody(code, msg)
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// next waits for a request within the idle connection's deadline, then reads it whole within
// ReadTimeout.
func (c *conn) next() (*Request, error) {
	maxHead := orDefault(c.srv.MaxHeadBytes, defaultMaxHead)
	c.lr.remain = maxHead
	if _, err := c.br.Peek(1); err != nil {
		return nil, err
	}
	closing := c.srv.setActive(c)
	defer func() { _ = c.rwc.SetReadDeadline(time.Time{}) }()
	req, err := readRequest(c.br, c.lr, maxHead, orDefault(c.srv.MaxBodyBytes, defaultMaxBody), c.sendContinue)
	if err != nil {
		return nil, err
	}
	req.close = req.close || closing
	return req, nil
}

// sendContinue tells a client that waits for it (curl does, for a body over 1 KiB) to send its
// body.
func (c *conn) sendContinue() error {
	if _, err := c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
		return err
	}
	return c.bw.Flush()
}

// readRequest reads one request from br, whose underlying reader is lr: its head within maxHead
// bytes, its body within maxBody. A malformed or too large request is an error that names what
// was wrong, with the status to refuse it with.
// A request that expects 100-continue gets it through sendContinue before its body is read.
func readRequest(br *bufio.Reader, lr *limitedReader, maxHead, maxBody int64, sendContinue func() error) (*Request, error) {
	check := limitHead(br, lr, maxHead)
	defer func() { lr.remain = -1 }()
	tp := textproto.NewReader(br)
	line, err := tp.ReadLine()
	if err == nil && line == "" {
		line, err = tp.ReadLine() // RFC 9112 section 2.2: an empty line before the request
	}
	if err = check(err); err != nil {
		return nil, headError(err, "read the request line")
	}
	// The headers first: a line cut by the connection's end or a timeout reads as whole, and
	// the headers' read then tells the end from a malformed line.
	hdr, err := tp.ReadMIMEHeader()
	if err = check(err); err != nil {
		return nil, headError(err, "read the request headers")
	}
	req, err := parseRequestLine(line)
	if err != nil {
		return nil, err
	}
	req.Header = hdr
	req.close = connectionClose(hdr, req.proto11)
	lr.remain = -1
	if isChunked, err := chunked(hdr); errors.Is(err, errUnknownCoding) {
		return nil, refuse(StatusNotImplemented, "%v", err)
	} else if err != nil {
		return nil, refuse(StatusBadRequest, "%v", err)
	} else if isChunked {
		return nil, refuse(StatusLengthRequired, "a request body needs a Content-Length header")
	}
	n, err := contentLength(hdr)
	if err != nil {
		return nil, refuse(StatusBadRequest, "%v", err)
	}
	if n > maxBody {
		return nil, refuse(StatusRequestEntityTooLarge, "request body of %d bytes: at most %d are accepted", n, maxBody)
	}
	if n > 0 && req.proto11 && strings.EqualFold(hdr.Get("Expect"), "100-continue") {
		if err := sendContinue(); err != nil {
			return nil, fmt.Errorf("send 100 Continue: %w", err)
		}
	}
	if n > 0 {
		// Read as it arrives: a head that only announces a large body holds no large buffer.
		if req.Body, err = io.ReadAll(io.LimitReader(br, n)); err != nil {
			return nil, fmt.Errorf("read the request body: %w", err)
		}
		if int64(len(req.Body)) < n {
			return nil, fmt.Errorf("read the request body: %w", io.ErrUnexpectedEOF)
		}
	}
	return req, nil
}

func headError(err error, what string) error {
	switch {
	case errors.Is(err, errHeadTooLarge):
		return refuse(StatusHeaderFieldsTooLarge, "%s: the request's line and headers are too large", what)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return err
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return err // a timeout or a broken connection: nobody to answer
	}
	return refuse(StatusBadRequest, "%s: %v", what, err)
}

// parseRequestLine reads "METHOD /path?query HTTP/1.1".
func parseRequestLine(line string) (*Request, error) {
	method, rest, _ := strings.Cut(line, " ")
	target, version, _ := strings.Cut(rest, " ")
	if strings.Count(line, " ") != 2 || method == "" || target == "" || strings.ContainsAny(line, "\t") {
		return nil, refuse(StatusBadRequest, "request line %q: want METHOD /path HTTP/1.1", line)
	}
	proto11, err := parseVersion(version)
	if err != nil {
		return nil, refuse(StatusVersionNotSupported, "request line: %v", err)
	}
	if !strings.HasPrefix(target, "/") {
		return nil, refuse(StatusBadRequest, "request target %q: want a path starting with /", target)
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, refuse(StatusBadRequest, "request target %q: %v", target, err)
	}
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, refuse(StatusBadRequest, "request target %q: query: %v", target, err)
	}
	return &Request{Method: method, Path: u.Path, rawPath: u.EscapedPath(), Query: query, proto11: proto11}, nil
}

// connectionClose reports whether the connection ends after this message: asked by its
// Connection header, or HTTP/1.0 without keep-alive.
func connectionClose(h textproto.MIMEHeader, proto11 bool) bool {
	for _, v := range h.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			switch strings.ToLower(strings.TrimSpace(tok)) {
			case "close":
				return true
			case "keep-alive":
				proto11 = true
			}
		}
	}
	return !proto11
}

// handle runs the handler for req, its context cancelled if the client goes away meanwhile, and
// reports whether the connection can serve another request.
func (c *conn) handle(req *Request) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req.ctx = ctx
	// The client sends nothing more until it has the reply (no pipelining from the clients of
	// this protocol), so a read that ends now is the client gone. A byte that arrives is the next
	// request's and stays in br.
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if _, err := c.br.Peek(1); err != nil && !isTimeout(err) {
			cancel()
		}
	}()
	w := &ResponseWriter{bw: c.bw, header: textproto.MIMEHeader{}, proto11: req.proto11, closeAfter: req.close,
		closing: &c.srv.closing}
	if req.Method == "HEAD" {
		// The reply ends with its headers: a streaming handler (a status watch) must stop then,
		// or the client's next request on the connection waits behind it.
		w.head, w.headDone = true, cancel
	}
	c.srv.Handler(w, req)
	err := w.finish()
	_ = c.rwc.SetReadDeadline(aLongTimeAgo)
	<-watched
	_ = c.rwc.SetReadDeadline(time.Time{})
	return err == nil && !w.closeAfter && ctx.Err() == nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// deadlineWriter gives each write to its connection its own deadline: a client that reads slowly
// keeps its connection, one that stopped reading loses it.
type deadlineWriter struct {
	conn    net.Conn
	timeout time.Duration
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	_ = d.conn.SetWriteDeadline(time.Now().Add(d.timeout))
	n, err := d.conn.Write(p)
	// A deadline left set is a timer that wakes an idle launcher a minute after each status
	// heartbeat, for nothing.
	_ = d.conn.SetWriteDeadline(time.Time{})
	return n, err
}
