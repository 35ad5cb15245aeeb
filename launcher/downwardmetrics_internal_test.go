package launcher

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

type rw struct {
	io.Reader
	io.Writer
}

// TestServeMetricsRequests: each metrics request, and only those, gets the document and a blank
// line; junk, requests of other kinds and overlong lines get nothing.
func TestServeMetricsRequests(t *testing.T) {
	in := "GET /metrics/XML\n\nGET /other\n\n" + strings.Repeat("x", 4*maxMetricsRequest) + "\n\n\n" +
		"GET /metrics/XML\r\n\r\nGET /metrics/\nXML\n\n"
	var out bytes.Buffer
	err := serveMetrics(rw{strings.NewReader(in), &out}, func() ([]byte, error) { return []byte("<metrics/>"), nil })
	if !errors.Is(err, io.EOF) {
		t.Fatalf("serveMetrics ended with %v, want EOF", err)
	}
	// The last request spans two lines, which vhostmd joins too.
	if got, want := out.String(), strings.Repeat("<metrics/>\n\n", 3); got != want {
		t.Errorf("answers %q, want %q", got, want)
	}
}

// FuzzServeMetrics: whatever the guest writes, the server answers at most once per request and
// ends at the end of its input.
func FuzzServeMetrics(f *testing.F) {
	f.Add([]byte("GET /metrics/XML\n\n"))
	f.Add([]byte(strings.Repeat("GET /metrics/XML", 40) + "\n\n"))
	f.Add([]byte("\n\n\n\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		answers := 0
		err := serveMetrics(rw{bytes.NewReader(in), &out}, func() ([]byte, error) { answers++; return []byte("M"), nil })
		if !errors.Is(err, io.EOF) {
			t.Fatalf("ended with %v, want EOF", err)
		}
		if max := bytes.Count(in, []byte("\n\n")) + bytes.Count(in, []byte("\n\r\n")); answers > max {
			t.Fatalf("%d answers to %d blank lines", answers, max)
		}
	})
}
