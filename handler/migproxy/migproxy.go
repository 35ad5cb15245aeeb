// Package migproxy carries live migration streams between node agents, so that no launcher pod
// listens on the network for a guest. The target QEMU listens on a unix socket in its pod's own
// sockets directory (launcher.Dir.MigrationIn); the source QEMU sends to a unix socket the source
// node's agent made in the source pod's directory (launcher.Dir.MigrationOut). Between them, the
// agents speak mutual TLS, each with the certificate of its own node (certs.HandlerNodeSpec): the
// source's Tunnel accepts only a server certificate naming the migration's target node; the
// target's Server accepts only a client certificate of the handlers' CA named qvirt-handler,
// reads the migration's UID as the first line, and splices the connection to that migration's
// target socket only if this node expects it, from that migration's source node, once. A stray
// connection, with no certificate, another component's certificate, another node's certificate
// or an unknown migration, is closed before any byte reaches QEMU.
//
// A guest with local disks (block migration) sends their copy first, as NBD connections from the
// source QEMU to the target QEMU's NBD server (launcher.Dir.NBDOut to launcher.Dir.NBDIn): the
// same tunnel and the same checks carry them, marked as disk streams in the header line. The
// target accepts disk streams of a migration it expects, from its source node, up to
// maxDiskStreams, and no more once the memory stream has arrived.
package migproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/internal/unixsock"
)

const (
	// handshakeTimeout bounds a connection's TLS handshake and header: a stray that never speaks
	// holds no goroutine for long.
	handshakeTimeout = 10 * time.Second
	// maxHeader bounds the header line (a UID is 36 bytes).
	maxHeader = 128
	// expectTTL drops a target nobody connected to: its migration has long ended.
	expectTTL = 24 * time.Hour
	// maxDiskStreams bounds the disk streams of one migration: one per local disk.
	maxDiskStreams = 64
	// diskStream marks a disk stream's header line: "<uid> disks".
	diskStream = "disks"
)

// Server is the target node's migration endpoint. Safe for concurrent use.
type Server struct {
	ln  net.Listener
	log logr.Logger

	mu sync.Mutex
	// expected are the migrations a target on this node waits for, by migration UID: the host
	// path of the target QEMU's socket, and when it was added. taken are the ones already
	// connected: one stream per migration.
	expected map[types.UID]expectation
	taken    map[types.UID]time.Time
}

type expectation struct {
	socket string
	// disks is the host path of the target QEMU's NBD socket, "" when the migration copies no
	// disks; diskStreams counts the disk streams taken.
	disks       string
	diskStreams int
	// source is the node whose agent may send the stream.
	source string
	added  time.Time
}

// Listen makes the endpoint listen on addr (host:port) with the node agent's certificate from p,
// accepting clients whose certificate p's bundle verifies and names certs.HandlerName.
func Listen(addr string, p certs.Provider, log logr.Logger) (*Server, error) {
	tcp, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("migration endpoint: %w", err)
	}
	cfg := certs.ServerConfig(p, []string{certs.HandlerName})
	cfg.NextProtos = []string{Protocol}
	return &Server{ln: tls.NewListener(tcp, cfg), log: log,
		expected: map[types.UID]expectation{}, taken: map[types.UID]time.Time{}}, nil
}

// Protocol is the ALPN name of the stream, so that a migration endpoint is never mistaken for
// another TLS service of the node agents.
const Protocol = "qvirt-migration/1"

// Addr is the address the endpoint listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// NeedLeaderElection is false: every node agent serves its node's targets.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	go func() {
		<-ctx.Done()
		_ = s.ln.Close()
	}()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("migration endpoint: %w", err)
		}
		go s.serve(ctx, conn)
	}
}

// Expect opens the endpoint for one stream of migration uid from the agent of node source, to
// the target QEMU's socket (a host path). A migration already connected stays closed: a handler
// restarting mid-migration must not let a second stream into the same QEMU.
func (s *Server) Expect(uid types.UID, socket, source string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.prune(now)
	if _, done := s.taken[uid]; done {
		return
	}
	s.expected[uid] = expectation{socket: socket, source: source, added: now}
}

// ExpectDisks opens the endpoint for the disk streams of migration uid, which Expect opened, to
// the target QEMU's NBD socket (a host path), until its memory stream arrives.
func (s *Server) ExpectDisks(uid types.UID, socket string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.expected[uid]; ok {
		e.disks = socket
		s.expected[uid] = e
	}
}

// Forget closes the endpoint to migration uid.
func (s *Server) Forget(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.expected, uid)
}

func (s *Server) prune(now time.Time) {
	for uid, e := range s.expected {
		if now.Sub(e.added) > expectTTL {
			delete(s.expected, uid)
		}
	}
	for uid, at := range s.taken {
		if now.Sub(at) > expectTTL {
			delete(s.taken, uid)
		}
	}
}

// errNotExpected is a migration no target on this node waits for.
var errNotExpected = errors.New("no target on this node waits for it")

// take claims migration uid's target socket, once, for a client whose certificate is peer: it
// must name the migration's source node. A client of another node claims nothing. A disk stream
// claims the NBD socket, up to maxDiskStreams times, until the memory stream was taken.
func (s *Server) take(uid types.UID, disks bool, peer *x509.Certificate) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.expected[uid]
	if !ok || disks && e.disks == "" {
		return "", errNotExpected
	}
	if err := certs.CheckHandlerNode(peer, e.source); err != nil {
		return "", fmt.Errorf("the migration comes from node %s: %w", e.source, err)
	}
	if disks {
		if e.diskStreams >= maxDiskStreams {
			return "", fmt.Errorf("the migration already sent %d disk streams", e.diskStreams)
		}
		e.diskStreams++
		s.expected[uid] = e
		return e.disks, nil
	}
	delete(s.expected, uid)
	s.taken[uid] = time.Now()
	return e.socket, nil
}

func (s *Server) serve(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	log := s.log.WithValues("remote", conn.RemoteAddr().String())
	uid, disks, br, err := readHeader(ctx, conn.(*tls.Conn))
	if err != nil {
		log.Info("refused a migration connection", "reason", err.Error())
		return
	}
	socket, err := s.take(uid, disks, conn.(*tls.Conn).ConnectionState().PeerCertificates[0])
	if err != nil {
		log.Info("refused a migration connection", "reason", err.Error(), "migration", uid, "disks", disks, "client", peerName(conn.(*tls.Conn)))
		return
	}
	target, err := unixsock.Dial(ctx, socket)
	if err != nil {
		log.Error(err, "reach the migration target", "migration", uid, "disks", disks)
		return
	}
	log.Info("migration stream accepted", "migration", uid, "disks", disks, "client", peerName(conn.(*tls.Conn)))
	splice(conn, br, target)
}

// readHeader completes the handshake (the client certificate is checked there) and reads the
// header line: the migration UID, and " disks" for a disk stream; br holds whatever the client
// sent after it.
func readHeader(ctx context.Context, conn *tls.Conn) (uid types.UID, disks bool, br *bufio.Reader, err error) {
	_ = conn.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := conn.HandshakeContext(ctx); err != nil {
		return "", false, nil, fmt.Errorf("TLS handshake: %w", err)
	}
	hr := bufio.NewReaderSize(io.LimitReader(conn, maxHeader), maxHeader)
	line, err := hr.ReadString('\n')
	if err != nil {
		return "", false, nil, fmt.Errorf("read the header: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	id, kind, _ := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	switch {
	case id == "":
		return "", false, nil, errors.New("empty migration UID")
	case kind != "" && kind != diskStream:
		return "", false, nil, fmt.Errorf("unknown stream kind %q", kind)
	}
	// Bytes after the header were buffered from the limited reader; the rest comes from conn.
	rest := bufio.NewReader(io.MultiReader(hr, conn))
	return types.UID(id), kind == diskStream, rest, nil
}

// peerName names the client in logs: its certificate's node, or its CN when it names none.
func peerName(conn *tls.Conn) string {
	pc := conn.ConnectionState().PeerCertificates
	if len(pc) == 0 {
		return ""
	}
	if node, err := certs.HandlerNodeOf(pc[0]); err == nil {
		return "node " + node
	}
	return pc[0].Subject.CommonName
}

// Tunnel is the source node's side: it carries one source QEMU's stream to a target node's Server.
type Tunnel struct {
	certs certs.Provider
	log   logr.Logger
}

// NewTunnel presents the node agent's certificate from p and accepts only a target endpoint
// whose certificate p's bundle verifies and names the migration's target node.
func NewTunnel(p certs.Provider, log logr.Logger) *Tunnel {
	return &Tunnel{certs: p, log: log}
}

// acceptTimeout bounds the wait for the source QEMU to connect once the migration was asked for.
const acceptTimeout = time.Minute

// Forward listens on socket (a host path in the source pod's directory, handed to uid, the
// launcher's user) for one connection of the source QEMU and carries it to the target endpoint at
// addr, which must be node target's agent, as migration uid. It returns once listening; stop
// ends the wait for the connection (not a stream already under way: QEMU ends that by closing
// its side, as a cancel does).
func (t *Tunnel) Forward(socket string, owner int, addr, target string, uid types.UID) (stop func(), err error) {
	ln, stop, err := listenFor(socket, owner)
	if err != nil {
		return nil, err
	}
	go func() {
		conn, err := ln.Accept()
		stop() // one stream per migration
		if err != nil {
			return
		}
		t.carry(conn, addr, target, string(uid))
	}()
	return stop, nil
}

// listenFor listens on socket for the connections of the source QEMU, whose user is owner. stop
// closes the listener and removes the socket; it comes by itself after acceptTimeout.
func listenFor(socket string, owner int) (_ net.Listener, stop func(), _ error) {
	ln, err := unixsock.Listen(socket)
	if err != nil {
		return nil, nil, err
	}
	// Connecting takes write permission: the owner's only with the default umask.
	if err := unixsock.Chown(socket, owner, owner); err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	var once sync.Once
	var timer *time.Timer
	stop = func() {
		once.Do(func() {
			timer.Stop()
			_ = ln.Close()
			_ = unixsock.Remove(socket)
		})
	}
	timer = time.AfterFunc(acceptTimeout, stop)
	return ln, stop, nil
}

// ForwardDisks is Forward for the disk streams of migration uid: it listens on socket for the
// source QEMU's NBD connections, one per local disk, and carries each to the target endpoint. It
// stops listening after maxDiskStreams connections, acceptTimeout, or stop.
func (t *Tunnel) ForwardDisks(socket string, owner int, addr, target string, uid types.UID) (stop func(), err error) {
	ln, stop, err := listenFor(socket, owner)
	if err != nil {
		return nil, err
	}
	go func() {
		defer stop()
		for range maxDiskStreams {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go t.carry(conn, addr, target, string(uid)+" "+diskStream)
		}
	}()
	return stop, nil
}

// carry sends conn's stream to the target endpoint at addr after the header line header.
func (t *Tunnel) carry(conn net.Conn, addr, target, header string) {
	defer conn.Close()
	log := t.log.WithValues("stream", header, "target", addr, "targetNode", target)
	cfg := certs.HandlerClientConfig(t.certs, target)
	cfg.NextProtos = []string{Protocol}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: handshakeTimeout, KeepAlive: 15 * time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	remote, err := d.DialContext(ctx, "tcp", addr)
	cancel()
	if err != nil {
		// QEMU sees its stream closed and fails the migration; the launcher reports it.
		log.Error(err, "reach the target node's migration endpoint")
		return
	}
	if _, err := io.WriteString(remote, header+"\n"); err != nil {
		log.Error(err, "send the migration header")
		_ = remote.Close()
		return
	}
	splice(remote, remote, conn)
}

// splice copies a's reads (from ar) to b and b to a until both directions end, passing each
// end-of-stream on as a half close, so QEMU's return path keeps working after the main stream.
func splice(a net.Conn, ar io.Reader, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); copyHalf(b, ar) }()
	go func() { defer wg.Done(); copyHalf(a, b) }()
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}

type closeWriter interface{ CloseWrite() error }

func copyHalf(dst net.Conn, src io.Reader) {
	_, err := io.Copy(dst, src)
	if cw, ok := dst.(closeWriter); ok && err == nil {
		_ = cw.CloseWrite()
		return
	}
	// A failed direction ends the whole stream: the other side must not wait forever.
	_ = dst.Close()
}
