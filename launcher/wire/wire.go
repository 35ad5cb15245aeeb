// Package wire is the part of HTTP/1.1 the launcher's command socket speaks (DESIGN.md: HTTP+JSON
// over a unix socket), written for it so that the launcher does not link net/http.
//
// Why not net/http: the launcher runs once per VM, and most of its resident memory is its binary's
// pages. net/http cannot be linked without crypto/tls, x509 and HTTP/2 (a server type-asserts
// *tls.Conn, a client dials TLS), which made 3.3 MiB of the launcher's 8.9 MiB of mapped code and
// data. The command socket is a unix socket between two local processes, so it needs none of
// that: requests with a Content-Length body, replies with a Content-Length or chunked body,
// persistent connections. curl and net/http speak it on either side.
//
// Both sides treat the peer as untrusted (a tenant can exec into the launcher's pod): headers,
// bodies and chunk lines are bounded, reads have deadlines, and malformed input is an error that
// says what was wrong, never a panic.
package wire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/textproto"
	"strconv"
	"strings"
	"time"
)

// aLongTimeAgo is a deadline that has passed: setting it interrupts a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// Status codes the command protocol answers with.
const (
	StatusOK                    = 200
	StatusAccepted              = 202
	StatusNoContent             = 204
	StatusBadRequest            = 400
	StatusNotFound              = 404
	StatusMethodNotAllowed      = 405
	StatusConflict              = 409
	StatusLengthRequired        = 411
	StatusRequestEntityTooLarge = 413
	StatusHeaderFieldsTooLarge  = 431
	StatusInternalServerError   = 500
	StatusNotImplemented        = 501
	StatusVersionNotSupported   = 505
)

var statusText = map[int]string{
	StatusOK:                    "OK",
	StatusAccepted:              "Accepted",
	StatusNoContent:             "No Content",
	StatusBadRequest:            "Bad Request",
	StatusNotFound:              "Not Found",
	StatusMethodNotAllowed:      "Method Not Allowed",
	StatusConflict:              "Conflict",
	StatusLengthRequired:        "Length Required",
	StatusRequestEntityTooLarge: "Request Entity Too Large",
	StatusHeaderFieldsTooLarge:  "Request Header Fields Too Large",
	StatusInternalServerError:   "Internal Server Error",
	StatusNotImplemented:        "Not Implemented",
	StatusVersionNotSupported:   "HTTP Version Not Supported",
}

// StatusText is the reason phrase of code, "" for a code this package does not name.
func StatusText(code int) string { return statusText[code] }

// bodyless reports whether a reply with this status carries no body (RFC 9112 section 6.3).
func bodyless(code int) bool { return code/100 == 1 || code == StatusNoContent || code == 304 }

// parseVersion reads "HTTP/1.0" or "HTTP/1.1" and reports whether it is 1.1.
func parseVersion(v string) (bool, error) {
	switch v {
	case "HTTP/1.1":
		return true, nil
	case "HTTP/1.0":
		return false, nil
	}
	return false, fmt.Errorf("HTTP version %q: want HTTP/1.1 or HTTP/1.0", v)
}

// contentLength reads a Content-Length header: -1 when there is none. Repeated values must agree.
func contentLength(h textproto.MIMEHeader) (int64, error) {
	vals := h.Values("Content-Length")
	if len(vals) == 0 {
		return -1, nil
	}
	n := int64(-1)
	for _, v := range vals {
		m, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || m < 0 || strings.TrimSpace(v)[0] == '+' {
			return 0, fmt.Errorf("header Content-Length %q: want a number of bytes", v)
		}
		if n >= 0 && m != n {
			return 0, fmt.Errorf("header Content-Length: %d and %d disagree", n, m)
		}
		n = m
	}
	return n, nil
}

// chunked reports whether h's Transfer-Encoding is chunked; any other coding is an error, as is a
// chunked body that also names a Content-Length (a request smuggling trick).
func chunked(h textproto.MIMEHeader) (bool, error) {
	te := h.Values("Transfer-Encoding")
	if len(te) == 0 {
		return false, nil
	}
	if len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked") {
		return false, fmt.Errorf("header Transfer-Encoding %q: %w", strings.Join(te, ", "), errUnknownCoding)
	}
	if len(h.Values("Content-Length")) > 0 {
		return false, errors.New("both Transfer-Encoding and Content-Length are set")
	}
	return true, nil
}

// limitedReader is a connection's reader that can be bounded while a message's head is read, so
// a peer sending an endless header line costs a bounded buffer.
type limitedReader struct {
	r      io.Reader
	remain int64 // bytes still allowed; < 0: unbounded
	total  int64 // bytes read
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.remain == 0 {
		return 0, errHeadTooLarge
	}
	if l.remain > 0 && int64(len(p)) > l.remain {
		p = p[:l.remain]
	}
	n, err := l.r.Read(p)
	l.total += int64(n)
	if l.remain > 0 {
		l.remain -= int64(n)
	}
	return n, err
}

var (
	errHeadTooLarge  = errors.New("message head too large")
	errUnknownCoding = errors.New("only chunked is spoken")
)

// limitHead bounds what br reads through lr to limit bytes for a message's head, and returns the
// check for each step of reading it: the head is too large once it took limit bytes. (bufio hands
// over a line cut by the limit as a whole one, and the error only at the next read.)
func limitHead(br *bufio.Reader, lr *limitedReader, limit int64) func(error) error {
	start := lr.total - int64(br.Buffered())
	lr.remain = max(limit-int64(br.Buffered()), 1)
	return func(err error) error {
		if err == nil && lr.total-int64(br.Buffered())-start >= limit {
			return errHeadTooLarge
		}
		return err
	}
}
