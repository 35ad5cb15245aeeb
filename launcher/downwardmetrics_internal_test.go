package launcher

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

type rw struct {
	io.Reader
	io.Writer
}

// TestServeMetricsRequests: each metrics request, and only those, gets the document and a blank
// line; junk, requests of other kinds and overlong lines (whatever they end with) get nothing, and
// a document that cannot be built leaves its request unanswered without ending the connection.
func TestServeMetricsRequests(t *testing.T) {
	in := "GET /metrics/XML\n\nGET /other\n\n" + strings.Repeat("x", 4*maxMetricsRequest+37) + "GET /metrics/XML\n\n\n" +
		"GET /metrics/XML\r\n\r\nGET /metrics/\nXML\n\nGET /metrics/XML\n\nGET /metrics/XML\n\n"
	var out bytes.Buffer
	calls, failures := 0, 0
	doc := func() ([]byte, error) {
		if calls++; calls == 4 {
			return nil, errors.New("no /proc")
		}
		return []byte("<metrics/>"), nil
	}
	err := serveMetrics(rw{strings.NewReader(in), &out}, doc, 0, func(error) { failures++ })
	if !errors.Is(err, io.EOF) {
		t.Fatalf("serveMetrics ended with %v, want EOF", err)
	}
	// The split request is joined, as vhostmd joins it; the fourth document fails.
	if got, want := out.String(), strings.Repeat("<metrics/>\n\n", 4); got != want || failures != 1 {
		t.Errorf("answers %q with %d failures, want %q and 1", got, failures, want)
	}
}

// TestServeMetricsPaces: a guest asking in a loop gets one answer per interval.
func TestServeMetricsPaces(t *testing.T) {
	in := strings.Repeat("GET /metrics/XML\n\n", 4)
	start := time.Now()
	var out bytes.Buffer
	_ = serveMetrics(rw{strings.NewReader(in), &out}, func() ([]byte, error) { return []byte("M"), nil }, 50*time.Millisecond, func(error) {})
	if took := time.Since(start); took < 150*time.Millisecond || out.String() != strings.Repeat("M\n\n", 4) {
		t.Errorf("4 answers (%q) in %v, want them 50 ms apart", out.String(), took)
	}
}

// TestMetricsCacheBuildsOncePerInterval: however often the guest asks, the document is built at
// most once per metricsMinInterval.
func TestMetricsCacheBuildsOncePerInterval(t *testing.T) {
	builds := 0
	c := metricsCache{build: func() ([]byte, error) { builds++; return []byte("M"), nil }}
	for range 100 {
		if doc, err := c.get(); err != nil || string(doc) != "M" {
			t.Fatalf("get: %q %v", doc, err)
		}
	}
	if builds != 1 {
		t.Errorf("%d builds for 100 requests within %v, want 1", builds, metricsMinInterval)
	}
	c.at = c.at.Add(-metricsMinInterval)
	if _, _ = c.get(); builds != 2 {
		t.Errorf("%d builds after the interval, want 2", builds)
	}
}

// FuzzServeMetrics: whatever the guest writes, the server answers at most once per request it
// spelled out and ends at the end of its input.
func FuzzServeMetrics(f *testing.F) {
	f.Add([]byte("GET /metrics/XML\n\n"))
	f.Add([]byte(strings.Repeat("GET /metrics/XML", 40) + "\n\n"))
	f.Add([]byte("GET /metrics/XML\r\n\r\r\n"))
	f.Add([]byte("GET /metrics/X\nML\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		answers := 0
		err := serveMetrics(rw{bytes.NewReader(in), &out}, func() ([]byte, error) { answers++; return []byte("M"), nil }, 0, func(error) {})
		if !errors.Is(err, io.EOF) {
			t.Fatalf("ended with %v, want EOF", err)
		}
		// A request split over lines is joined, even inside a word ("X\nML"), so count the
		// requests in the input with its line ends taken out: every answered request is a
		// distinct stretch of that text ending in "XML".
		joined := strings.NewReplacer("\r", "", "\n", "")
		if max := strings.Count(joined.Replace(string(in)), "XML"); answers > max {
			t.Fatalf("%d answers to %d requests", answers, max)
		}
	})
}
