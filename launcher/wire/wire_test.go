package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// serve runs srv on a new unix socket and returns the socket's path; the server closes with the
// test.
func serve(t *testing.T, srv *Server) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve: %v, want ErrServerClosed", err)
		}
	})
	return socket
}

// stdClient is net/http's client over socket: what curl --unix-socket or another tool would be.
func stdClient(socket string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}, Timeout: 10 * time.Second}
}

func testMux() *Mux {
	m := NewMux(func(w *ResponseWriter, code int, msg string) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(code)
		fmt.Fprintln(w, msg)
	})
	m.HandleFunc("POST /v1/echo", func(w *ResponseWriter, r *Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, "%s|%s", r.Query.Get("q"), r.Body)
	})
	m.HandleFunc("DELETE /v1/disks/{name}", func(w *ResponseWriter, r *Request) {
		w.Header().Set("X-Name", r.PathValue("name"))
		w.WriteHeader(StatusNoContent)
	})
	m.HandleFunc("GET /v1/stream", func(w *ResponseWriter, r *Request) {
		for i := range 3 {
			fmt.Fprintf(w, "line %d\n", i)
			w.Flush()
		}
	})
	m.HandleFunc("GET /v1/forever", func(w *ResponseWriter, r *Request) {
		for {
			fmt.Fprintln(w, "again")
			w.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	m.HandleFunc("GET /v1/fixed", func(w *ResponseWriter, r *Request) {
		w.Header().Set("Content-Length", "5")
		_, _ = io.WriteString(w, "hello")
	})
	return m
}

// TestServerSpeaksToNetHTTP: net/http's client, as any HTTP tool, gets each reply whole over one
// kept-alive connection: routes with path values, query and body, a bodyless 204, a chunked
// stream, a fixed-length body, 404 and 405 with Allow.
func TestServerSpeaksToNetHTTP(t *testing.T) {
	socket := serve(t, &Server{Handler: testMux().Serve})
	c := stdClient(socket)
	var fresh int
	cases := []struct {
		method, path, body string
		code               int
		want               string
		header             [2]string
	}{
		{"POST", "/v1/echo?q=a%20b", `{"x":1}`, 200, `a b|{"x":1}`, [2]string{"Content-Type", "application/json"}},
		{"DELETE", "/v1/disks/data-1", "", 204, "", [2]string{"X-Name", "data-1"}},
		{"DELETE", "/v1/disks/a%2Fb", "", 204, "", [2]string{"X-Name", "a/b"}},
		{"GET", "/v1/stream", "", 200, "line 0\nline 1\nline 2\n", [2]string{"Transfer-Encoding", ""}},
		{"GET", "/v1/fixed", "", 200, "hello", [2]string{"Content-Length", ""}},
		{"GET", "/v1/nothing", "", 404, "no such path: /v1/nothing\n", [2]string{}},
		{"GET", "/v1/echo", "", 405, "method GET not allowed on /v1/echo\n", [2]string{"Allow", "POST"}},
		{"DELETE", "/v1/disks/", "", 404, "no such path: /v1/disks/\n", [2]string{}},
	}
	for _, tc := range cases {
		req, err := http.NewRequest(tc.method, "http://launcher"+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) {
				if !info.Reused {
					fresh++
				}
			},
		}))
		if tc.body == "" {
			req.Body, req.ContentLength = nil, 0
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: read body: %v", tc.method, tc.path, err)
		}
		if resp.StatusCode != tc.code || string(body) != tc.want {
			t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.path, resp.StatusCode, body, tc.code, tc.want)
		}
		if k := tc.header[0]; k != "" && tc.header[1] != "" && resp.Header.Get(k) != tc.header[1] {
			t.Errorf("%s %s: header %s %q, want %q", tc.method, tc.path, k, resp.Header.Get(k), tc.header[1])
		}
		if tc.path == "/v1/stream" && (len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked") {
			t.Errorf("the stream's transfer encoding %v, want chunked", resp.TransferEncoding)
		}
		if tc.path == "/v1/fixed" && resp.ContentLength != 5 {
			t.Errorf("the fixed reply's length %d, want 5", resp.ContentLength)
		}
	}
	if fresh != 1 {
		t.Errorf("%d connections for %d requests, want one kept alive", fresh, len(cases))
	}
}

// rawRequest writes raw on a new connection to socket and returns everything the server sends
// until it closes the connection.
func rawRequest(t *testing.T, socket, raw string) string {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	// A server that closes with request bytes unread makes the kernel report a reset after the
	// reply: what was read is the answer.
	out, err := io.ReadAll(conn)
	if err != nil && len(out) == 0 {
		t.Fatalf("read the reply to %q: %v", raw, err)
	}
	return string(out)
}

// TestServerRefusesMalformedRequests: each bad request gets a status naming what was wrong and the
// connection ends; no handler runs.
func TestServerRefusesMalformedRequests(t *testing.T) {
	var ran atomic.Bool
	srv := &Server{Handler: func(w *ResponseWriter, r *Request) { ran.Store(true) }, MaxHeadBytes: 1 << 10, MaxBodyBytes: 16,
		ErrorBody: func(code int, msg string) (string, []byte) {
			return "application/json", fmt.Appendf(nil, `{"error":%q}`, msg)
		}}
	socket := serve(t, srv)
	cases := []struct{ name, raw, status, want string }{
		{"no version", "GET /v1/status\r\n\r\n", "400", "want METHOD /path HTTP/1.1"},
		{"HTTP/2", "GET /v1/status HTTP/2.0\r\n\r\n", "505", "want HTTP/1.1 or HTTP/1.0"},
		{"absolute target", "GET http://x/v1/status HTTP/1.1\r\n\r\n", "400", "want a path starting with /"},
		{"bad header", "GET / HTTP/1.1\r\nno colon here\r\n\r\n", "400", "read the request headers"},
		{"head too large", "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 2<<10) + "\r\n\r\n", "431", "too large"},
		{"line too large", "GET /" + strings.Repeat("a", 2<<10) + " HTTP/1.1\r\n\r\n", "431", "too large"},
		{"body too large", "POST / HTTP/1.1\r\nContent-Length: 17\r\n\r\n" + strings.Repeat("a", 17), "413", "at most 16"},
		{"bad length", "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "400", "header Content-Length"},
		{"lengths disagree", "POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "400", "disagree"},
		{"chunked request", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n", "411", "needs a Content-Length"},
		{"gzip coding", "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "501", "only chunked"},
		{"smuggling", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", "400", "both Transfer-Encoding and Content-Length"},
		{"double space", "GET  /v1/status HTTP/1.1\r\n\r\n", "400", "want METHOD /path HTTP/1.1"},
		{"trailing space", "GET /v1/status HTTP/1.1 \r\n\r\n", "400", "want METHOD /path HTTP/1.1"},
		{"head at the limit", "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 1024-23) + "\r\n\r\n", "431", "too large"},
	}
	for _, tc := range cases {
		out := rawRequest(t, socket, tc.raw)
		if !strings.HasPrefix(out, "HTTP/1.1 "+tc.status+" ") || !strings.Contains(out, tc.want) ||
			!strings.Contains(out, "Connection: close\r\n") || !strings.Contains(out, "Content-Type: application/json\r\n") {
			t.Errorf("%s: the server answered %q, want status %s with Connection: close and a JSON error containing %q", tc.name, out, tc.status, tc.want)
		}
	}
	if ran.Load() {
		t.Error("a handler ran for a malformed request")
	}
	// One byte under the limit is served, and so is a request after an empty line.
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nConnection: close\r\nX: " + strings.Repeat("a", 1023-42) + "\r\n\r\n",
		"\r\nGET / HTTP/1.1\r\nConnection: close\r\n\r\n",
	} {
		if out := rawRequest(t, socket, raw); !strings.HasPrefix(out, "HTTP/1.1 200 OK\r\n") {
			t.Errorf("request %q: answered %q, want 200", raw, out)
		}
	}
}

// TestServerSendsContinue: a client that expects 100-continue before its body (curl, for a body
// over 1 KiB) gets it at once and then its reply.
func TestServerSendsContinue(t *testing.T) {
	socket := serve(t, &Server{Handler: testMux().Serve})
	conn := dial(t, socket)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, "POST /v1/echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("before the body: %q, %v; want 100 Continue", line, err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "\r\n" {
		t.Fatalf("100 Continue's end: %q, %v", line, err)
	}
	_, _ = io.WriteString(conn, "{}")
	resp, err := readResponse(br, &limitedReader{r: conn, remain: -1}, 1<<10, "POST")
	if err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(resp.Body); err != nil || string(body) != "|{}" {
		t.Errorf("reply %q, %v; want the body echoed", body, err)
	}
}

// TestServerAnswersHEAD: a GET route answers HEAD with its headers and no body, and the
// connection stays usable.
func TestServerAnswersHEAD(t *testing.T) {
	socket := serve(t, &Server{Handler: testMux().Serve})
	c := stdClient(socket)
	for range 2 {
		resp, err := c.Head("http://launcher/v1/fixed")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || resp.ContentLength != 5 || len(body) != 0 {
			t.Errorf("HEAD: %d, length %d, body %q; want 200, 5 and none", resp.StatusCode, resp.ContentLength, body)
		}
	}
	// A streaming route (a status watch) ends at its headers, so the kept-alive connection's next
	// request is answered.
	if resp, err := c.Head("http://launcher/v1/forever"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("HEAD of a stream: %v", err)
	}
	resp, err := c.Get("http://launcher/v1/stream")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(body) != "line 0\nline 1\nline 2\n" {
		t.Errorf("GET after HEAD: %q", body)
	}
}

// TestHandlerPanicEndsItsConnectionOnly: a handler that panics costs its connection, not the
// launcher; the next request is served.
func TestHandlerPanicEndsItsConnectionOnly(t *testing.T) {
	socket := serve(t, &Server{Handler: func(w *ResponseWriter, r *Request) {
		if r.Path == "/panic" {
			panic("a handler's bug")
		}
		fmt.Fprint(w, "ok")
	}})
	if out := rawRequest(t, socket, "GET /panic HTTP/1.1\r\n\r\n"); out != "" {
		t.Errorf("the panicking request was answered %q", out)
	}
	if out := rawRequest(t, socket, "GET /fine HTTP/1.1\r\nConnection: close\r\n\r\n"); !strings.HasSuffix(out, "\r\n\r\n2\r\nok\r\n0\r\n\r\n") {
		t.Errorf("the next request was answered %q", out)
	}
}

// TestServerTimesOutSilentClients: a connection that sends nothing, or half a request, or nothing
// after its reply, ends at its timeout.
func TestServerTimesOutSilentClients(t *testing.T) {
	socket := serve(t, &Server{Handler: testMux().Serve, ReadTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond})
	for _, sent := range []string{"", "GET /v1/fixed HTTP/1.1\r\nX: a", "POST /v1/echo HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}", "GET /v1/fixed HTTP/1.1\r\n\r\n"} {
		conn := dial(t, socket)
		_, _ = io.WriteString(conn, sent)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		out, err := io.ReadAll(conn)
		_ = conn.Close()
		if err != nil {
			t.Errorf("after %q: the server kept the connection open: %v", sent, err)
		}
		if want := ""; strings.HasSuffix(sent, "\r\n\r\n") {
			if !strings.HasSuffix(string(out), "hello") {
				t.Errorf("after %q: %q, want the reply then the end", sent, out)
			}
		} else if string(out) != want {
			t.Errorf("after %q: %q, want the connection closed without a reply", sent, out)
		}
	}
}

// TestServerDropsClientsThatStopReading: a client that asks for a stream and reads none of it
// costs the server its WriteTimeout, then the handler ends.
func TestServerDropsClientsThatStopReading(t *testing.T) {
	ended := make(chan error, 1)
	socket := serve(t, &Server{WriteTimeout: 200 * time.Millisecond, Handler: func(w *ResponseWriter, r *Request) {
		chunk := []byte(strings.Repeat("x", 64<<10))
		for {
			if _, err := w.Write(chunk); err != nil {
				ended <- err
				return
			}
		}
	}})
	conn := dial(t, socket)
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /stream HTTP/1.1\r\n\r\n")
	select {
	case err := <-ended:
		if !isTimeout(err) {
			t.Errorf("the handler's write ended with %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler still writes to a client that reads nothing, 10 s on")
	}
}

// TestShutdownServesRequestsBeingRead: a request whose body is on its way when Shutdown begins is
// still answered.
func TestShutdownServesRequestsBeingRead(t *testing.T) {
	srv := &Server{Handler: testMux().Serve}
	socket := serve(t, srv)
	conn := dial(t, socket)
	defer conn.Close()
	_, _ = io.WriteString(conn, "POST /v1/echo HTTP/1.1\r\nContent-Length: 2\r\n\r\n{")
	time.Sleep(100 * time.Millisecond) // the server is reading the body
	shut := make(chan error, 1)
	go func() { shut <- srv.Shutdown(context.Background()) }()
	time.Sleep(100 * time.Millisecond)
	_, _ = io.WriteString(conn, "}")
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, _ := io.ReadAll(conn)
	if !strings.Contains(string(out), "|{}") || !strings.Contains(string(out), "Connection: close\r\n") {
		t.Errorf("the request being read at Shutdown was answered %q, want its echo and Connection: close", out)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestServerHTTP10: an HTTP/1.0 client gets a body that ends with the connection.
func TestServerHTTP10(t *testing.T) {
	socket := serve(t, &Server{Handler: testMux().Serve})
	out := rawRequest(t, socket, "GET /v1/stream HTTP/1.0\r\n\r\n")
	want := "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nline 0\nline 1\nline 2\n"
	if out != want {
		t.Errorf("reply %q, want %q", out, want)
	}
}

// TestClientGoneCancelsRequest: a handler's context ends when its client goes away, so a status
// watch of a vanished node agent ends.
func TestClientGoneCancelsRequest(t *testing.T) {
	started, ended := make(chan struct{}), make(chan error, 1)
	socket := serve(t, &Server{Handler: func(w *ResponseWriter, r *Request) {
		close(started)
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(10 * time.Second):
			ended <- errors.New("still running 10 s after its client left")
		}
	}})
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "GET /watch HTTP/1.1\r\n\r\n")
	<-started
	_ = conn.Close()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the handler's context: %v, want canceled", err)
	}
}

// TestShutdownLetsRepliesFinish: Shutdown closes idle connections at once, runs its hooks (a
// watch ends) and returns once the replies in flight are written.
func TestShutdownLetsRepliesFinish(t *testing.T) {
	closing := make(chan struct{})
	srv := &Server{Handler: func(w *ResponseWriter, r *Request) {
		if r.Path == "/idle" {
			return
		}
		fmt.Fprintln(w, "first")
		w.Flush()
		<-closing
		time.Sleep(100 * time.Millisecond)
		fmt.Fprintln(w, "last")
	}}
	srv.RegisterOnShutdown(func() { close(closing) })
	socket := serve(t, srv)

	idle, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_, _ = io.WriteString(idle, "GET /idle HTTP/1.1\r\n\r\n")
	idleReply := bufio.NewReader(idle)
	if line, err := idleReply.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("the idle connection's reply: %q, %v", line, err)
	}

	resp, err := Do(context.Background(), dial(t, socket), "GET", "/watch", nil, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "first\n" {
		t.Fatalf("the stream's first line %q", line)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "last\n" {
		t.Errorf("the stream's rest %q, %v; want the last line and a clean end", rest, err)
	}
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(idleReply); err != nil {
		t.Errorf("the idle connection did not end at Shutdown: %v", err)
	}
}

func dial(t *testing.T, socket string) net.Conn {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// stdServer serves h with net/http on a new unix socket.
func stdServer(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "std.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return socket
}

// TestClientSpeaksToNetHTTP: Do reads net/http's replies of each framing, sends its body with a
// length, and a context that ends interrupts a stream with the context's error.
func TestClientSpeaksToNetHTTP(t *testing.T) {
	socket := stdServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/fixed":
			w.Header().Set("Content-Length", fmt.Sprint(len(body)+len(r.Method)))
			fmt.Fprintf(w, "%s%s", r.Method, body)
		case "/chunked":
			for i := range 3 {
				fmt.Fprintf(w, "%d;", i)
				w.(http.Flusher).Flush()
			}
		case "/none":
			w.WriteHeader(http.StatusNoContent)
		case "/trailers":
			w.Header().Set("Trailer", "X-Sum")
			fmt.Fprint(w, "data")
			w.Header().Set("X-Sum", "4")
		case "/close":
			// HTTP/1.0-style: no length, no chunks, the body ends with the connection.
			conn, bufrw, _ := http.NewResponseController(w).Hijack()
			_, _ = bufrw.WriteString("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
			_ = bufrw.Flush()
			_ = conn.Close()
		case "/forever":
			fmt.Fprintln(w, "one")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	for _, tc := range []struct{ method, path, body, want string }{
		{"POST", "/fixed", `{"a":1}`, `POST{"a":1}`},
		{"GET", "/trailers", "", "data"},
		{"GET", "/close", "", "until the end"},
		{"GET", "/chunked", "", "0;1;2;"},
		{"DELETE", "/none", "", ""},
	} {
		var body []byte
		if tc.body != "" {
			body = []byte(tc.body)
		}
		resp, err := Do(context.Background(), dial(t, socket), tc.method, tc.path, body, ClientOptions{})
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		got, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || string(got) != tc.want {
			t.Errorf("%s %s: body %q, %v; want %q", tc.method, tc.path, got, err, tc.want)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	resp, err := Do(ctx, dial(t, socket), "GET", "/forever", nil, ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "one\n" {
		t.Fatalf("first line %q", line)
	}
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := io.ReadAll(br); !errors.Is(err, context.Canceled) {
		t.Errorf("reading after the context ended: %v, want context.Canceled", err)
	}
}

// TestClientRefusesMalformedReplies: a reply that breaks the framing is an error naming what was
// wrong, never a body that silently ends early.
func TestClientRefusesMalformedReplies(t *testing.T) {
	cases := []struct{ name, reply, want string }{
		{"not HTTP", "SSH-2.0-x\r\n\r\n", "want HTTP/1.1 or HTTP/1.0"},
		{"bad status", "HTTP/1.1 2000 OK\r\n\r\n", "three-digit status"},
		{"short fixed body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", "unexpected EOF"},
		{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "want hexadecimal digits"},
		{"chunk overrun", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n", "past the chunk's size"},
		{"cut chunks", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", "unexpected EOF"},
		{"endless chunk line", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1", 8<<10), "longer than"},
		{"head too large", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 2<<10) + "\r\n\r\n", "too large"},
		{"two lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", "disagree"},
		{"length and chunks", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", "both Transfer-Encoding and Content-Length"},
		{"endless trailers", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + strings.Repeat("T: v\r\n", 2<<10), "trailers longer than"},
		{"only interim replies", strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", 6), "only interim replies"},
	}
	for _, tc := range cases {
		client, server := net.Pipe()
		go func() {
			_, _ = bufio.NewReader(server).ReadString('\n') // the request line; the rest is not read
			_, _ = io.WriteString(server, tc.reply)
			_ = server.Close()
		}()
		resp, err := Do(context.Background(), client, "GET", "/x", nil, ClientOptions{MaxHeadBytes: 1 << 10})
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
