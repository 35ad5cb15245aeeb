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
// or an unknown migration, is closed before any byte reaches QEMU. A migration over parallel
// streams (QEMU's multifd) opens its main stream and then one per channel: the target takes
// exactly that many, the number the target's agent expects from the migration's configuration,
// and connects the channels to QEMU only after the main stream, since QEMU 7.2 takes the first
// connection it accepts for the main one (it tells them apart by their first bytes from 8.0 on).
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
	// diskStream marks a disk stream's header line: "<uid> disks"; channelStream a parallel
	// channel's: "<uid> channel". The main memory stream's is "<uid>".
	diskStream    = "disks"
	channelStream = "channel"
)

// Server is the target node's migration endpoint. Safe for concurrent use.
type Server struct {
	ln  net.Listener
	log logr.Logger

	mu sync.Mutex
	// expected are the migrations a target on this node waits for, by migration UID: the host
	// path of the target QEMU's socket, and when it was added. taken are the ones whose memory
	// streams have all connected.
	expected map[types.UID]expectation
	taken    map[types.UID]time.Time
}

type expectation struct {
	socket string
	// mainTaken is whether the main memory stream connected; channels is how many parallel
	// channels may still connect; mainUp is closed once the main stream reached QEMU.
	mainTaken bool
	channels  int
	mainUp    *signal
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

// Expect opens the endpoint for the streams of migration uid (streams: 1, plus one per parallel
// channel) from the agent of node source, to the target QEMU's socket (a host path). A migration
// already connected stays closed, and one partly connected keeps its count: a handler
// reconciling again mid-migration must not let more streams into the same QEMU.
func (s *Server) Expect(uid types.UID, socket, source string, streams int) {
	s.expect(uid, socket, source, streams, false)
}

// ExpectRecovery opens the endpoint once more for the main stream of migration uid, whose link
// broke after its switch to post-copy: the target QEMU listens again on socket (migrate-recover)
// for the source's resume, which comes from the agent of node source like the first stream. An
// expectation already open is kept, so that a repeated call cannot give a second stream a way in.
func (s *Server) ExpectRecovery(uid types.UID, socket, source string) {
	s.expect(uid, socket, source, 1, true)
}

// expect opens the endpoint for migration uid unless it is open already; a migration whose streams
// were all taken stays closed unless again.
func (s *Server) expect(uid types.UID, socket, source string, streams int, again bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.prune(now)
	if _, ok := s.expected[uid]; ok {
		return
	}
	if _, done := s.taken[uid]; done && !again {
		return
	}
	delete(s.taken, uid)
	s.expected[uid] = expectation{socket: socket, source: source, channels: max(streams, 1) - 1, mainUp: newSignal(), added: now}
}

// signal is closed once; waiters see it.
type signal struct {
	once sync.Once
	c    chan struct{}
}

func newSignal() *signal { return &signal{c: make(chan struct{})} }
func (s *signal) fire()  { s.once.Do(func() { close(s.c) }) }

// ExpectDisks opens the endpoint for the disk streams of migration uid, which Expect opened, to
// the target QEMU's NBD socket (a host path), until its memory stream arrives; once it has, the
// agent reconciling again must not open them anew.
func (s *Server) ExpectDisks(uid types.UID, socket string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.expected[uid]; ok && !e.mainTaken {
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

// streamKind is what a connection carries: the main memory stream, a parallel channel, or a
// disk's copy.
type streamKind string

const (
	kindMain    streamKind = ""
	kindChannel streamKind = channelStream
	kindDisks   streamKind = diskStream
)

// claim is what take grants a connection: the socket to dial, and the main stream's signal,
// which the main stream fires once it reached QEMU and a channel waits for.
type claim struct {
	socket string
	mainUp *signal
}

// take claims a socket of migration uid for a client whose certificate is peer: it must name the
// migration's source node. A client of another node claims nothing. The main stream claims the
// target QEMU's socket once, each parallel channel once; a disk stream claims the NBD socket, up
// to maxDiskStreams times, until the main stream was taken.
func (s *Server) take(uid types.UID, kind streamKind, peer *x509.Certificate) (claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.expected[uid]
	if !ok || kind == kindDisks && e.disks == "" {
		return claim{}, errNotExpected
	}
	if err := certs.CheckHandlerNode(peer, e.source); err != nil {
		return claim{}, fmt.Errorf("the migration comes from node %s: %w", e.source, err)
	}
	switch kind {
	case kindDisks:
		if e.diskStreams >= maxDiskStreams {
			return claim{}, fmt.Errorf("the migration already sent %d disk streams", e.diskStreams)
		}
		e.diskStreams++
		s.expected[uid] = e
		return claim{socket: e.disks}, nil
	case kindChannel:
		if e.channels == 0 {
			return claim{}, errors.New("the migration's parallel channels all connected")
		}
		e.channels--
	default:
		if e.mainTaken {
			return claim{}, errors.New("the migration's main stream connected already")
		}
		e.mainTaken = true
		e.disks = "" // the disks were copied before the memory
	}
	s.expected[uid] = e
	if e.mainTaken && e.channels == 0 {
		delete(s.expected, uid)
		s.taken[uid] = time.Now()
	}
	return claim{socket: e.socket, mainUp: e.mainUp}, nil
}

func (s *Server) serve(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	log := s.log.WithValues("remote", conn.RemoteAddr().String())
	uid, kind, br, err := readHeader(ctx, conn.(*tls.Conn))
	if err != nil {
		log.Info("refused a migration connection", "reason", err.Error())
		return
	}
	log = log.WithValues("migration", uid, "kind", kindName(kind), "client", peerName(conn.(*tls.Conn)))
	c, err := s.take(uid, kind, conn.(*tls.Conn).ConnectionState().PeerCertificates[0])
	if err != nil {
		log.Info("refused a migration connection", "reason", err.Error())
		return
	}
	if kind == kindChannel && !waitMain(ctx, c.mainUp) {
		log.Info("refused a migration connection", "reason", "the migration's main stream did not reach QEMU in time")
		return
	}
	target, err := unixsock.Dial(ctx, c.socket)
	if kind == kindMain {
		c.mainUp.fire() // QEMU has the main stream queued first, or it failed and will not take more
	}
	if err != nil {
		log.Error(err, "reach the migration target")
		return
	}
	log.Info("migration stream accepted")
	splice(conn, br, target)
}

// waitMain waits for the main stream to reach QEMU, at most handshakeTimeout.
func waitMain(ctx context.Context, up *signal) bool {
	t := time.NewTimer(handshakeTimeout)
	defer t.Stop()
	select {
	case <-up.c:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func kindName(k streamKind) string {
	if k == kindMain {
		return "memory"
	}
	return string(k)
}

// readHeader completes the handshake (the client certificate is checked there) and reads the
// header line: the migration UID, and " disks" for a disk stream or " channel" for a parallel
// channel; br holds whatever the client sent after it.
func readHeader(ctx context.Context, conn *tls.Conn) (uid types.UID, kind streamKind, br *bufio.Reader, err error) {
	_ = conn.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := conn.HandshakeContext(ctx); err != nil {
		return "", "", nil, fmt.Errorf("TLS handshake: %w", err)
	}
	hr := bufio.NewReaderSize(io.LimitReader(conn, maxHeader), maxHeader)
	line, err := hr.ReadString('\n')
	if err != nil {
		return "", "", nil, fmt.Errorf("read the header: %w", err)
	}
	_ = conn.SetDeadline(time.Time{})
	id, k, _ := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	switch kind = streamKind(k); {
	case id == "":
		return "", "", nil, errors.New("empty migration UID")
	case kind != kindMain && kind != kindDisks && kind != kindChannel:
		return "", "", nil, fmt.Errorf("unknown stream kind %q", k)
	}
	// Bytes after the header were buffered from the limited reader; the rest comes from conn.
	rest := bufio.NewReader(io.MultiReader(hr, conn))
	return types.UID(id), kind, rest, nil
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

// Tunnel is the source node's side: it carries source QEMUs' streams to target nodes' Servers.
// Safe for concurrent use.
type Tunnel struct {
	certs certs.Provider
	log   logr.Logger
	// AcceptTimeout bounds the wait for the source QEMU's next connection while none of the
	// migration's streams is under way; zero means acceptTimeout.
	AcceptTimeout time.Duration

	mu sync.Mutex
	// live are the connections of the streams under way, by migration: the source QEMU's and
	// the target endpoint's, so that Cut can end them.
	live map[types.UID]map[net.Conn]struct{}
	// listening are each migration's listeners, for Cut to stop.
	listening map[types.UID]map[*listener]struct{}
	// cut are the migrations Cut, when: a stream of one accepted as it was cut is not carried.
	cut map[types.UID]time.Time
	// lastEnd is when each listening migration's last stream ended: its idle time starts there.
	lastEnd map[types.UID]time.Time
}

// NewTunnel presents the node agent's certificate from p and accepts only a target endpoint
// whose certificate p's bundle verifies and names the migration's target node.
func NewTunnel(p certs.Provider, log logr.Logger) *Tunnel {
	return &Tunnel{certs: p, log: log, live: map[types.UID]map[net.Conn]struct{}{},
		listening: map[types.UID]map[*listener]struct{}{}, cut: map[types.UID]time.Time{}, lastEnd: map[types.UID]time.Time{}}
}

// Cut closes the streams of migration uid under way and its listeners; no stream of it is
// carried after. A source QEMU waiting to write into a unix socket whose reader stopped (a target
// or a link that no longer takes data) is woken only by the reader's end closing; its launcher
// cannot do that, its node agent can.
func (t *Tunnel) Cut(uid types.UID) {
	t.mu.Lock()
	conns, stops := t.live[uid], t.listening[uid]
	delete(t.live, uid)
	delete(t.listening, uid)
	now := time.Now()
	for id, when := range t.cut {
		if now.Sub(when) > cutMemory {
			delete(t.cut, id)
		}
	}
	t.cut[uid] = now
	t.mu.Unlock()
	for l := range stops {
		l.stop()
	}
	for c := range conns {
		_ = c.Close()
	}
	if len(conns) > 0 {
		t.log.Info("cut the migration's streams", "migration", uid, "connections", len(conns))
	}
}

// listener is a listening socket of a migration's source QEMU.
type listener struct{ stop func() }

// cutMemory is how long the tunnel remembers a migration it cut: longer than any stream
// accepted before the cut takes to be tracked.
const cutMemory = time.Hour

// track records c as a connection of migration uid's streams until untrack; false, and c closed,
// when the migration was cut.
func (t *Tunnel) track(uid types.UID, c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, cut := t.cut[uid]; cut {
		_ = c.Close()
		return false
	}
	if t.live[uid] == nil {
		t.live[uid] = map[net.Conn]struct{}{}
	}
	t.live[uid][c] = struct{}{}
	return true
}

// idleFor is how long migration uid has had no stream under way (0 while one is), counted from
// its last stream's end, or from since when none ended yet.
func (t *Tunnel) idleFor(uid types.UID, since time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.live[uid]) > 0 {
		return 0
	}
	if end, ok := t.lastEnd[uid]; ok && end.After(since) {
		since = end
	}
	return time.Since(since)
}

func (t *Tunnel) untrack(uid types.UID, c net.Conn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.live[uid], c)
	if len(t.live[uid]) == 0 {
		delete(t.live, uid)
		if len(t.listening[uid]) > 0 {
			t.lastEnd[uid] = time.Now()
		}
	}
}

// acceptTimeout bounds the wait for the source QEMU to connect once the migration was asked for
// and nothing of it is under way: a block migration connects its memory streams only once the
// disks' copy is done, however long that takes.
const acceptTimeout = time.Minute

// Forward listens on socket (a host path in the source pod's directory, handed to uid, the
// launcher's user) for the source QEMU's streams of migration uid (streams: 1, plus one per
// parallel channel) and carries each to the target endpoint at addr, which must be node target's
// agent. It returns once listening; stop ends the wait for connections (not streams already under
// way: QEMU ends those by closing its side, as a cancel does).
func (t *Tunnel) Forward(socket string, owner int, addr, target string, uid types.UID, streams int) (stop func(), err error) {
	ln, stop, err := t.listenFor(socket, owner, uid)
	if err != nil {
		return nil, err
	}
	go func() {
		defer stop()          // no more streams than the migration has
		header := string(uid) // QEMU connects its main stream first, then the channels
		for range max(streams, 1) {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go t.carry(conn, addr, target, uid, header)
			header = string(uid) + " " + channelStream
		}
	}()
	return stop, nil
}

// listenFor listens on socket for the connections of migration uid's source QEMU, whose user is
// owner. stop closes the listener and removes the socket; it comes by itself once the migration
// had no stream under way for the accept timeout.
func (t *Tunnel) listenFor(socket string, owner int, uid types.UID) (_ net.Listener, stop func(), _ error) {
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
	stopped := make(chan struct{})
	l := &listener{}
	l.stop = func() {
		once.Do(func() {
			close(stopped)
			_ = ln.Close()
			_ = unixsock.Remove(socket)
			t.mu.Lock()
			delete(t.listening[uid], l)
			if len(t.listening[uid]) == 0 {
				delete(t.listening, uid)
				delete(t.lastEnd, uid)
			}
			t.mu.Unlock()
		})
	}
	stop = l.stop
	t.mu.Lock()
	if _, cut := t.cut[uid]; cut {
		t.mu.Unlock()
		_ = ln.Close()
		_ = unixsock.Remove(socket)
		return nil, nil, fmt.Errorf("migration %s was cut", uid)
	}
	if t.listening[uid] == nil {
		t.listening[uid] = map[*listener]struct{}{}
	}
	t.listening[uid][l] = struct{}{}
	t.mu.Unlock()
	wait := t.AcceptTimeout
	if wait <= 0 {
		wait = acceptTimeout
	}
	opened := time.Now()
	go func() {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		for {
			select {
			case <-stopped:
				return
			case <-timer.C:
			}
			idle := t.idleFor(uid, opened)
			if idle >= wait {
				stop()
				return
			}
			timer.Reset(wait - idle)
		}
	}()
	return ln, stop, nil
}

// ForwardDisks is Forward for the disk streams of migration uid: it listens on socket for the
// source QEMU's NBD connections, one per local disk, and carries each to the target endpoint. It
// stops listening after maxDiskStreams connections, the accept timeout, or stop.
func (t *Tunnel) ForwardDisks(socket string, owner int, addr, target string, uid types.UID) (stop func(), err error) {
	ln, stop, err := t.listenFor(socket, owner, uid)
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
			go t.carry(conn, addr, target, uid, string(uid)+" "+diskStream)
		}
	}()
	return stop, nil
}

// carry sends conn's stream of migration uid to the target endpoint at addr after the header
// line header.
func (t *Tunnel) carry(conn net.Conn, addr, target string, uid types.UID, header string) {
	defer conn.Close()
	if !t.track(uid, conn) {
		return
	}
	defer t.untrack(uid, conn)
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
	if !t.track(uid, remote) {
		return
	}
	defer t.untrack(uid, remote)
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
