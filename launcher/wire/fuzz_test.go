package wire

import (
	"bufio"
	"bytes"
	"io"
	"net/textproto"
	"strings"
	"testing"
)

// FuzzReadRequest: any bytes give a request or an error, never a panic, and a request read is
// within the limits with a path.
func FuzzReadRequest(f *testing.F) {
	f.Add([]byte("POST /v1/sync?x=1 HTTP/1.1\r\nHost: launcher\r\nContent-Length: 2\r\n\r\n{}"))
	f.Add([]byte("GET /v1/status?watch=true HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"))
	f.Add([]byte("GET /%zz HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxHead, maxBody = 256, 64
		lr := &limitedReader{r: bytes.NewReader(data), remain: -1}
		br := bufio.NewReaderSize(lr, 64)
		req, err := readRequest(br, lr, maxHead, maxBody, func() error { return nil })
		if err != nil {
			return
		}
		if req.Method == "" || !strings.HasPrefix(req.Path, "/") && req.Path != "" {
			t.Errorf("request %q %q read from %q", req.Method, req.Path, data)
		}
		if n, _ := contentLength(req.Header); len(req.Body) > maxBody || int64(len(req.Body)) != max(n, 0) {
			t.Errorf("a body of %d bytes read for Content-Length %d, limit %d", len(req.Body), n, maxBody)
		}
		if lr.total-int64(br.Buffered())-int64(len(req.Body)) >= maxHead {
			t.Errorf("a head of %d bytes passed the limit of %d", lr.total-int64(br.Buffered())-int64(len(req.Body)), maxHead)
		}
	})
}

// FuzzReply: any bytes as a reply give a body or an error, never a panic; and a reply written by
// ResponseWriter in any number of chunks is read back as the same bytes.
func FuzzReply(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: v\r\n\r\n"), "a,bc,,def")
	f.Add([]byte("HTTP/1.1 204 No Content\r\n\r\n"), "")
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx"), "x")
	f.Fuzz(func(t *testing.T, raw []byte, parts string) {
		lr := &limitedReader{r: bytes.NewReader(raw), remain: -1}
		br := bufio.NewReaderSize(lr, 64)
		if resp, err := readResponse(br, lr, 256, "GET"); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		}

		var out bytes.Buffer
		bw := bufio.NewWriter(&out)
		w := &ResponseWriter{bw: bw, header: textproto.MIMEHeader{}, proto11: true}
		for _, p := range strings.Split(parts, ",") {
			if _, err := io.WriteString(w, p); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.finish(); err != nil {
			t.Fatal(err)
		}
		lr = &limitedReader{r: &out, remain: -1}
		br = bufio.NewReaderSize(lr, 64)
		resp, err := readResponse(br, lr, 1<<10, "GET")
		if err != nil {
			t.Fatalf("reading back %q: %v", out.String(), err)
		}
		got, err := io.ReadAll(resp.Body)
		if want := strings.ReplaceAll(parts, ",", ""); err != nil || string(got) != want {
			t.Errorf("read back %q, %v; wrote %q", got, err, want)
		}
	})
}
