// Package registry is local mode's OCI registry: go-containerregistry's registry handler served
// on a TCP address, with blobs on disk under a state directory, plus Seed, which pushes the demo
// guest images to it. Launchers pull from it over the real registry protocol (plain HTTP, so they
// must be told --insecure-registry ADDR).
//
// go-containerregistry keeps manifests and tags in memory only: after a restart the blobs are
// still on disk but every tag is gone, so whoever starts the registry seeds it again (pushing
// blobs it already holds costs a HEAD request each).
package registry

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	ggcr "github.com/google/go-containerregistry/pkg/registry"
)

// Options configure a Server.
type Options struct {
	// Addr is the host:port to listen on; port 0 picks a free one (see Server.Addr). Launcher pods
	// in local mode reach the host through the CNI bridge's address, not 127.0.0.1.
	Addr string
	// StateDir holds blobs under StateDir/blobs; blobs are kept in memory when empty.
	StateDir string
	// Log receives one line per request at V(1).
	Log logr.Logger
	// OnRequest, when set, sees every request before it is served (tests count pulls with it).
	OnRequest func(*http.Request)
}

// Server is a running registry listener. Start serves it; it implements controller-runtime's
// manager.Runnable.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen opens the registry's listener; nothing is served before Start.
func Listen(opts Options) (*Server, error) {
	blobs := ggcr.NewInMemoryBlobHandler()
	if opts.StateDir != "" {
		dir := filepath.Join(opts.StateDir, "blobs")
		// The disk handler stores sha256 blobs in dir/sha256 and stages uploads in dir.
		if err := os.MkdirAll(filepath.Join(dir, "sha256"), 0o755); err != nil {
			return nil, fmt.Errorf("registry state directory: %w", err)
		}
		blobs = ggcr.NewDiskBlobHandler(dir)
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("registry listen on %s: %w", opts.Addr, err)
	}
	h := ggcr.New(ggcr.WithBlobHandler(blobs), ggcr.Logger(log.New(logWriter{opts.Log}, "", 0)))
	if opts.OnRequest != nil {
		inner := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			opts.OnRequest(r)
			inner.ServeHTTP(w, r)
		})
	}
	return &Server{ln: ln, srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}, nil
}

// Addr is the host:port the registry listens on, as image references name it.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Start serves until ctx ends, then closes the listener and waits up to 5 s for requests in
// flight.
func (s *Server) Start(ctx context.Context) error {
	done := make(chan error, 1)
	go func() { done <- s.srv.Serve(s.ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("registry: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(shutdown); err != nil {
		// A client still mid-request after the grace period (a pull being abandoned): cut it.
		_ = s.srv.Close()
	}
	if serveErr := <-done; !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("registry: %w", serveErr)
	}
	return nil
}

// logWriter turns the registry's log.Logger lines into logr records.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.V(1).Info(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
