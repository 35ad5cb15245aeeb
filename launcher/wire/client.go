package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strconv"
	"strings"
)

// Response is a reply; its Body must be closed, which closes the connection.
type Response struct {
	StatusCode int
	Header     textproto.MIMEHeader
	Body       io.ReadCloser
}

// ClientOptions bound what a Do reads before the body.
type ClientOptions struct {
	// MaxHeadBytes bounds the status line and headers (64 KiB).
	MaxHeadBytes int64
	// BufferSize is the connection's read buffer (1 KiB): a client may hold many streams.
	BufferSize int
}

// Do sends one request on conn, which it owns from then on, and reads the reply's head. The
// request asks to close the connection after the reply: a call's connection is its own. Until the
// Body is closed, ctx ending interrupts the call and its reads, with ctx's error.
func Do(ctx context.Context, conn net.Conn, method, target string, body []byte, opts ClientOptions) (*Response, error) {
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	resp, err := do(conn, method, target, body, opts)
	if err != nil {
		stop()
		_ = conn.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	resp.Body = &connBody{r: resp.Body, close: func() error { stop(); return conn.Close() }, ctx: ctx}
	return resp, nil
}

func do(conn net.Conn, method, target string, body []byte, opts ClientOptions) (*Response, error) {
	if err := writeRequest(conn, method, target, body); err != nil {
		return nil, err
	}
	lr := &limitedReader{r: conn, remain: -1}
	br := bufio.NewReaderSize(lr, max(opts.BufferSize, 1<<10))
	return readResponse(br, lr, orDefault(opts.MaxHeadBytes, defaultMaxHead), method)
}

// writeRequest sends the request in one write.
func writeRequest(conn net.Conn, method, target string, body []byte) error {
	if strings.ContainsAny(method+target, " \r\n") || !strings.HasPrefix(target, "/") {
		return fmt.Errorf("request %s %q: want a method and a path without spaces or line breaks", method, target)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: launcher\r\nConnection: close\r\n", method, target)
	if body != nil {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.Write(body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return fmt.Errorf("send the request: %w", err)
	}
	return nil
}

// readResponse reads a reply's head from br (over lr, which bounds it) and frames its body.
func readResponse(br *bufio.Reader, lr *limitedReader, maxHead int64, method string) (*Response, error) {
	check := limitHead(br, lr, maxHead)
	tp := textproto.NewReader(br)
	var (
		code int
		hdr  textproto.MIMEHeader
		err  error
	)
	// Skip interim replies (100 Continue): none is asked for, but a server may send one.
	for range 5 {
		if code, err = readStatusLine(tp, check); err != nil {
			return nil, err
		}
		hdr, err = tp.ReadMIMEHeader()
		if err = check(err); err != nil {
			return nil, headReadError(err, "read the reply's headers")
		}
		if code/100 != 1 {
			break
		}
	}
	if code/100 == 1 {
		return nil, errors.New("read the reply: only interim replies")
	}
	lr.remain = -1
	resp := &Response{StatusCode: code, Header: hdr}
	resp.Body, err = bodyReader(br, hdr, code, method)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func readStatusLine(tp *textproto.Reader, check func(error) error) (int, error) {
	line, err := tp.ReadLine()
	if err = check(err); err != nil {
		return 0, headReadError(err, "read the reply's status line")
	}
	version, rest, _ := strings.Cut(line, " ")
	if _, err := parseVersion(version); err != nil {
		return 0, fmt.Errorf("reply status line %q: %w", line, err)
	}
	codeText, _, _ := strings.Cut(rest, " ")
	code, err := strconv.Atoi(codeText)
	if err != nil || len(codeText) != 3 || code < 100 {
		return 0, fmt.Errorf("reply status line %q: want a three-digit status", line)
	}
	return code, nil
}

func headReadError(err error, what string) error {
	if errors.Is(err, errHeadTooLarge) {
		return fmt.Errorf("%s: the reply's status line and headers are too large", what)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// bodyReader frames a reply's body: none, Content-Length bytes, chunks, or up to the end of the
// connection.
func bodyReader(br *bufio.Reader, hdr textproto.MIMEHeader, code int, method string) (io.ReadCloser, error) {
	if method == "HEAD" || bodyless(code) {
		return io.NopCloser(strings.NewReader("")), nil
	}
	isChunked, err := chunked(hdr)
	if err != nil {
		return nil, fmt.Errorf("reply: %w", err)
	}
	if isChunked {
		return io.NopCloser(&chunkedReader{br: br}), nil
	}
	n, err := contentLength(hdr)
	if err != nil {
		return nil, fmt.Errorf("reply: %w", err)
	}
	if n >= 0 {
		return io.NopCloser(&fixedReader{r: br, remain: n}), nil
	}
	return io.NopCloser(br), nil
}

// fixedReader reads a Content-Length body: an early end is io.ErrUnexpectedEOF.
type fixedReader struct {
	r      io.Reader
	remain int64
}

func (f *fixedReader) Read(p []byte) (int, error) {
	if f.remain == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > f.remain {
		p = p[:f.remain]
	}
	n, err := f.r.Read(p)
	f.remain -= int64(n)
	if errors.Is(err, io.EOF) && f.remain > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err == nil && f.remain == 0 {
		err = io.EOF
	}
	return n, err
}

// maxChunkLine bounds a chunk's size line (with extensions) and each trailer line.
const maxChunkLine = 4 << 10

// chunkedReader decodes a chunked body (RFC 9112 section 7.1).
type chunkedReader struct {
	br     *bufio.Reader
	remain int64 // of the current chunk
	inData bool
	done   bool
	err    error
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	for c.err == nil && !c.done && !c.inData {
		c.err = c.nextChunk()
	}
	if c.err != nil {
		return 0, c.err
	}
	if c.done {
		return 0, io.EOF
	}
	if int64(len(p)) > c.remain {
		p = p[:c.remain]
	}
	n, err := c.br.Read(p)
	c.remain -= int64(n)
	if c.remain == 0 {
		c.inData = false
		if err == nil {
			err = c.crlf()
		}
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	c.err = err
	return n, err
}

// nextChunk reads a chunk's size line; the last chunk's trailers are read and dropped.
func (c *chunkedReader) nextChunk() error {
	line, err := c.line()
	if err != nil {
		return err
	}
	sizeText, _, _ := strings.Cut(line, ";")
	sizeText = strings.TrimSpace(sizeText)
	size, err := strconv.ParseInt(sizeText, 16, 64)
	if err != nil || size < 0 || sizeText == "" || strings.ContainsAny(sizeText, "+-xX") {
		return fmt.Errorf("chunked body: chunk size %q: want hexadecimal digits", sizeText)
	}
	if size > 0 {
		c.remain, c.inData = size, true
		return nil
	}
	for read := 0; ; {
		trailer, err := c.line()
		if err != nil {
			return err
		}
		if trailer == "" {
			c.done = true
			return nil
		}
		if read += len(trailer); read > maxChunkLine {
			return fmt.Errorf("chunked body: trailers longer than %d bytes", maxChunkLine)
		}
	}
}

// line reads a CRLF (or LF) ended line of at most maxChunkLine bytes.
func (c *chunkedReader) line() (string, error) {
	var b []byte
	for {
		part, isPrefix, err := c.br.ReadLine()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return "", fmt.Errorf("chunked body: %w", err)
		}
		b = append(b, part...)
		if len(b) > maxChunkLine {
			return "", fmt.Errorf("chunked body: a line longer than %d bytes", maxChunkLine)
		}
		if !isPrefix {
			return string(b), nil
		}
	}
}

// crlf reads the line end after a chunk's data.
func (c *chunkedReader) crlf() error {
	line, err := c.line()
	if err != nil {
		return err
	}
	if line != "" {
		return fmt.Errorf("chunked body: %d bytes past the chunk's size", len(line))
	}
	return nil
}

// connBody is a reply body that reports ctx's error once ctx ended, and closes the connection.
type connBody struct {
	r     io.ReadCloser
	close func() error
	ctx   context.Context
}

func (b *connBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.ctx.Err() != nil {
		err = b.ctx.Err()
	}
	return n, err
}

func (b *connBody) Close() error { return b.close() }
