package streams

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subresources "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/machine"
)

// Options configure the stream server. Reader, NodeName, PodsDir, Addr and either the three
// files or Certs are required.
type Options struct {
	// Reader finds VMIs by namespace and name; the handler's cache, which holds its node's VMIs.
	Reader client.Reader
	// NodeName is the handler's node; VMIs elsewhere are refused with 409.
	NodeName string
	// PodsDir is the kubelet's pods directory, where each launcher pod's sockets are
	// (podsockets.Running).
	PodsDir string
	// CertFile and KeyFile are the serving certificate (PEM) and its key.
	CertFile, KeyFile string
	// ClientCAFile is the PEM bundle of CAs whose client certificates are accepted.
	ClientCAFile string
	// Certs, instead of the three files, yields the serving certificate and the client CA bundle
	// at every handshake: the node agent's certs.NodeCertificate (run it too, for example with
	// the manager). The files must then be empty.
	Certs certs.Provider
	// AllowedClientNames, when not empty, accepts only client certificates whose subject CN or
	// one of whose DNS SANs is listed.
	AllowedClientNames []string
	// Addr is the TCP address to listen on, for example ":8186"; port 0 picks one (see Addr).
	Addr string
	// Log receives the audit lines of the QMP shell and the server's errors.
	Log logr.Logger
	// PingInterval is how often websocket peers are pinged (30 s when zero); a peer that does not
	// answer within PingTimeout (15 s when zero) is dropped.
	PingInterval, PingTimeout time.Duration
	// ShutdownTimeout bounds the graceful shutdown when the context ends (5 s when zero).
	ShutdownTimeout time.Duration
}

// Server is the stream server; it implements controller-runtime's manager.Runnable.
type Server struct {
	opts  Options
	certs *certStore

	mu       sync.Mutex
	addr     net.Addr
	consoles map[types.UID]*consoleSession
	qmpUsers map[types.UID]string
	// usbSlots are the USB redirection slots in use, per VMI.
	usbSlots map[types.UID]*[machine.MaxUSBRedirSlots]bool

	// streams counts websocket sessions, which http.Server.Shutdown does not wait for (they are
	// hijacked connections).
	streams sync.WaitGroup
}

// New checks opts and loads the certificates (a bad file fails here, not at the first handshake).
func New(opts Options) (*Server, error) {
	for _, f := range []struct{ name, v string }{
		{"NodeName", opts.NodeName}, {"PodsDir", opts.PodsDir}, {"Addr", opts.Addr},
	} {
		if f.v == "" {
			return nil, fmt.Errorf("streams: Options.%s is required", f.name)
		}
	}
	if opts.Reader == nil {
		return nil, errors.New("streams: Options.Reader is required")
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = 30 * time.Second
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = 15 * time.Second
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = 5 * time.Second
	}
	store, err := newTLSStore(opts)
	if err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	return &Server{opts: opts, certs: store, consoles: map[types.UID]*consoleSession{}, qmpUsers: map[types.UID]string{},
		usbSlots: map[types.UID]*[machine.MaxUSBRedirSlots]bool{}}, nil
}

// NeedLeaderElection is false: every handler serves its own node.
func (s *Server) NeedLeaderElection() bool { return false }

// Addr is the address the server listens on once Start has bound it, nil before.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Start serves until ctx ends, then stops accepting, closes every stream (websocket close 1001) and
// waits up to ShutdownTimeout for them.
func (s *Server) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.opts.Addr)
	if err != nil {
		return fmt.Errorf("streams: listen on %s: %w", s.opts.Addr, err)
	}
	s.mu.Lock()
	s.addr = ln.Addr()
	s.mu.Unlock()
	s.opts.Log.Info("stream server listening", "addr", ln.Addr().String(), "node", s.opts.NodeName)

	srv := &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// Request contexts, including those of hijacked websocket connections, derive from ctx:
		// when it ends, every stream sees it and closes.
		BaseContext: func(net.Listener) context.Context { return ctx },
		// Refused TLS handshakes (no or foreign client certificate) are reported here.
		ErrorLog: log.New(logWriter{s.opts.Log.WithName("http")}, "", 0),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(tls.NewListener(ln, s.certs.baseConfig())) }()

	select {
	case err := <-served:
		return fmt.Errorf("streams: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(shutCtx)
	done := make(chan struct{})
	go func() { s.streams.Wait(); close(done) }()
	select {
	case <-done:
	case <-shutCtx.Done():
		s.opts.Log.Info("stream server: streams still open after the shutdown timeout", "timeout", s.opts.ShutdownTimeout)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("streams: shutdown: %w", err)
	}
	return nil
}

// vmiPath is the prefix of every per-VMI endpoint.
const vmiPath = "/v1/namespaces/{namespace}/virtualmachineinstances/{name}/"

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+vmiPath+"console", s.tracked(s.console))
	mux.HandleFunc("GET "+vmiPath+"vnc", s.tracked(s.vnc))
	mux.HandleFunc("GET "+vmiPath+"usbredir", s.tracked(s.usbRedir))
	mux.HandleFunc("GET "+vmiPath+"qmp", s.tracked(s.qmp))
	mux.HandleFunc("PUT "+vmiPath+"pause", s.pause)
	mux.HandleFunc("PUT "+vmiPath+"unpause", s.unpause)
	mux.HandleFunc("PUT "+vmiPath+"softreboot", s.softReboot)
	mux.HandleFunc("GET "+vmiPath+"screenshot", s.screenshot)
	mux.HandleFunc("GET "+vmiPath+GuestOSInfo, s.guestOSInfo)
	mux.HandleFunc("GET "+vmiPath+UserList, s.userList)
	mux.HandleFunc("GET "+vmiPath+FileSystemList, s.fileSystemList)
	mux.HandleFunc("PUT "+vmiPath+Freeze, s.freeze)
	mux.HandleFunc("PUT "+vmiPath+Unfreeze, s.unfreeze)
	return mux
}

// tracked counts a stream handler in s.streams from its start: http.Server.Shutdown waits for it
// until it hijacks the connection, so the count is up before Start waits for it to drop.
func (s *Server) tracked(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.streams.Add(1)
		defer s.streams.Done()
		h(w, r)
	}
}

// Path is the URL path of one of a VMI's endpoints (Console, VNC, QMP, Pause, Unpause,
// SoftReboot, Screenshot), for qvirt-api.
func Path(namespace, name, endpoint string) string {
	return "/v1/namespaces/" + namespace + "/virtualmachineinstances/" + name + "/" + endpoint
}

// Endpoint names for Path: qvirt-api's subresource names.
const (
	Console = subresources.Console
	VNC     = subresources.VNC
	QMP     = subresources.QMP
	Pause   = subresources.Pause
	Unpause = subresources.Unpause
	// SoftReboot is PUT, like Pause.
	SoftReboot = subresources.SoftReboot
	// Screenshot is GET and answers image/png.
	Screenshot = subresources.Screenshot
	// GuestOSInfo, UserList and FileSystemList are GET and answer JSON; Freeze and Unfreeze are PUT.
	GuestOSInfo    = subresources.GuestOSInfo
	UserList       = subresources.UserList
	FileSystemList = subresources.FileSystemList
	Freeze         = subresources.Freeze
	Unfreeze       = subresources.Unfreeze
)

// logWriter turns net/http's error log lines into logr lines.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info(strings.TrimSpace(string(p)))
	return len(p), nil
}
