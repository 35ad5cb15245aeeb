package wire

import (
	"bufio"
	"errors"
	"fmt"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// ResponseWriter writes one reply. The status line and headers go out on the first Write (or
// WriteHeader); the body is chunked unless the handler set Content-Length.
type ResponseWriter struct {
	bw          *bufio.Writer
	header      textproto.MIMEHeader
	proto11     bool
	closeAfter  bool
	wroteHeader bool
	code        int
	chunked     bool
	remain      int64 // of a Content-Length body; -1: not fixed
	err         error
	head        bool // a HEAD request's reply: the headers only
	headDone    func()
	closing     *atomic.Bool // the server's: a reply written while it closes says Connection: close
}

// ErrBodyNotAllowed is a Write to a reply whose status carries no body.
var ErrBodyNotAllowed = errors.New("wire: this status carries no body")

// Header is the reply's headers, to set before WriteHeader.
func (w *ResponseWriter) Header() textproto.MIMEHeader { return w.header }

// WriteHeader sends the status line and the headers; later calls do nothing.
func (w *ResponseWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}
	w.wroteHeader, w.code, w.remain = true, code, -1
	if n, err := contentLength(w.header); err != nil {
		w.header.Del("Content-Length") // the handler's mistake must not frame the reply
	} else if n >= 0 {
		w.remain = n
	}
	switch {
	case bodyless(code):
		w.header.Del("Content-Length")
		w.header.Del("Transfer-Encoding")
	case w.remain >= 0:
	case w.proto11:
		w.chunked = true
		w.header.Set("Transfer-Encoding", "chunked")
	default:
		w.closeAfter = true // an HTTP/1.0 body ends with the connection
	}
	if w.closing != nil && w.closing.Load() {
		w.closeAfter = true
	}
	if w.closeAfter {
		w.header.Set("Connection", "close")
	}
	text := StatusText(code)
	if text == "" {
		text = "Status " + strconv.Itoa(code)
	}
	fmt.Fprintf(w.bw, "HTTP/1.1 %d %s\r\n", code, text)
	keys := make([]string, 0, len(w.header))
	for k := range w.header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range w.header[k] {
			// A value is the handler's own; no CR or LF may split it into another header.
			v = headerValueBreaks.Replace(v)
			fmt.Fprintf(w.bw, "%s: %s\r\n", k, v)
		}
	}
	_, w.err = w.bw.WriteString("\r\n")
	if w.head && w.headDone != nil {
		w.headDone()
	}
}

// headerValueBreaks turns the line breaks a header value must not hold into spaces.
var headerValueBreaks = strings.NewReplacer("\r", " ", "\n", " ")

// Write sends body bytes, as one chunk of a chunked body.
func (w *ResponseWriter) Write(p []byte) (int, error) {
	w.WriteHeader(StatusOK)
	if w.err != nil {
		return 0, w.err
	}
	if bodyless(w.code) {
		return 0, ErrBodyNotAllowed
	}
	if len(p) == 0 || w.head {
		return len(p), nil
	}
	if w.remain >= 0 {
		if int64(len(p)) > w.remain {
			w.err = fmt.Errorf("wire: reply body longer than its Content-Length")
			return 0, w.err
		}
		w.remain -= int64(len(p))
	}
	if w.chunked {
		fmt.Fprintf(w.bw, "%x\r\n", len(p))
	}
	n, err := w.bw.Write(p)
	if err == nil && w.chunked {
		_, err = w.bw.WriteString("\r\n")
	}
	w.err = err
	return n, err
}

// Flush sends what was written so far.
func (w *ResponseWriter) Flush() {
	w.WriteHeader(StatusOK)
	if w.err == nil {
		w.err = w.bw.Flush()
	}
}

// finish ends the reply; an error leaves the connection unusable.
func (w *ResponseWriter) finish() error {
	w.WriteHeader(StatusOK)
	if w.err != nil {
		return w.err
	}
	if w.chunked && !w.head {
		_, w.err = w.bw.WriteString("0\r\n\r\n")
	}
	if w.err == nil {
		w.err = w.bw.Flush()
	}
	if w.err == nil && w.remain > 0 && !w.head {
		w.err = fmt.Errorf("wire: reply body %d bytes shorter than its Content-Length", w.remain)
	}
	return w.err
}
