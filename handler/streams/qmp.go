package streams

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	subresources "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

const (
	// negotiateTimeout bounds QEMU's greeting and the capabilities reply. QEMU's shell monitor
	// serves one client at a time, so a greeting that does not come usually means another client
	// (outside this handler) holds it.
	negotiateTimeout = 10 * time.Second
	// maxInFlight bounds the replies a session may owe its client; a client that sends more
	// without reading is dropped rather than buffered without end.
	maxInFlight = 1024
)

func (s *Server) qmp(w http.ResponseWriter, r *http.Request) {
	caller, t, ok := s.prepare(w, r, SubprotocolQMP)
	if !ok {
		return
	}
	if holder, ok := s.claimQMP(t.vmi.UID, caller.User); !ok {
		fail(w, apierrors.NewConflict(vmiResource, t.vmi.Name,
			fmt.Errorf("its QMP shell is in use by user %q; QEMU's shell monitor takes one client at a time", holder)))
		return
	}
	defer s.releaseQMP(t.vmi.UID)

	sess := newSession(r.Context())
	conn, err := dial(sess.ctx, t, "QMP shell", t.dir.ShellQMP())
	if err != nil {
		fail(w, err)
		return
	}
	defer conn.Close()
	greeting, dec, err := negotiate(conn)
	if err != nil {
		fail(w, apierrors.NewServiceUnavailable(fmt.Sprintf("the QMP shell monitor of VMI %s: %v", t.key(), err)))
		return
	}
	ws, err := accept(w, r, SubprotocolQMP)
	if err != nil {
		return // Accept has answered the request
	}
	ws.SetReadLimit(subresources.MaxClientMessage)
	sess.ws = ws

	p := &qmpProxy{sess: sess, conn: conn, dec: dec, caller: caller,
		log: s.opts.Log.WithValues("vmi", t.key(), "namespace", t.vmi.Namespace, "user", caller.User, "groups", caller.Groups, "client", caller.Client, "qmpWrite", caller.QMPWrite)}
	p.log.Info("QMP shell opened")
	p.send(greeting)
	var wg sync.WaitGroup
	wg.Go(p.fromQEMU)
	wg.Go(p.fromClient)
	wg.Go(func() { sess.keepalive(s.opts.PingInterval, s.opts.PingTimeout) })
	<-sess.ctx.Done()
	_ = conn.Close()
	cc := sess.end()
	wg.Wait()
	p.log.Info("QMP shell closed", "code", int(cc.code), "reason", cc.reason)
}

func (s *Server) claimQMP(uid types.UID, user string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if holder, busy := s.qmpUsers[uid]; busy {
		return holder, false
	}
	s.qmpUsers[uid] = user
	return "", true
}

func (s *Server) releaseQMP(uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.qmpUsers, uid)
}

// negotiate reads QEMU's greeting and leaves command mode negotiated, without out-of-band
// execution. It returns the greeting to show the client (QEMU's, with no capabilities offered,
// since the client's qmp_capabilities is answered here) and the decoder holding what QEMU sent
// after.
func negotiate(conn net.Conn) ([]byte, *json.Decoder, error) {
	if err := conn.SetDeadline(time.Now().Add(negotiateTimeout)); err != nil {
		return nil, nil, err
	}
	dec := json.NewDecoder(conn)
	var g struct {
		QMP *struct {
			Version json.RawMessage `json:"version"`
		} `json:"QMP"`
	}
	if err := dec.Decode(&g); err != nil {
		return nil, nil, fmt.Errorf("no greeting within %s (another client may hold the monitor): %w", negotiateTimeout, err)
	}
	if g.QMP == nil {
		return nil, nil, errors.New("the first message is not a QMP greeting")
	}
	if _, err := conn.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n")); err != nil {
		return nil, nil, fmt.Errorf("send qmp_capabilities: %w", err)
	}
	for {
		var m qmpMessage
		if err := dec.Decode(&m); err != nil {
			return nil, nil, fmt.Errorf("no reply to qmp_capabilities: %w", err)
		}
		if m.Error != nil {
			return nil, nil, fmt.Errorf("qmp_capabilities: %s: %s", m.Error.Class, m.Error.Desc)
		}
		if m.Return != nil {
			break
		}
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, nil, err
	}
	out, err := json.Marshal(map[string]any{"QMP": map[string]any{"version": g.QMP.Version, "capabilities": []string{}}})
	return out, dec, err
}

// qmpMessage is what the proxy reads of a message from QEMU.
type qmpMessage struct {
	Event  string          `json:"event"`
	Return json.RawMessage `json:"return"`
	Error  *qmpError       `json:"error"`
}

type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

// qmpProxy is one QMP shell session. QEMU answers in-band commands in order, so replies are
// matched to commands by position: queue holds, in the order the client sent them, the commands
// waiting for QEMU and the proxy's own answers queued behind them, which keeps the replies the
// client sees in the order of its commands.
type qmpProxy struct {
	sess   *session
	conn   net.Conn
	dec    *json.Decoder
	caller Caller
	log    logr.Logger
	// negotiated is only touched by fromClient.
	negotiated bool

	// mu orders writes to the websocket and guards queue.
	mu    sync.Mutex
	queue []pending
}

// pending is a command waiting for QEMU's reply (reply nil) or a local reply waiting its turn.
type pending struct {
	cmd   string
	id    json.RawMessage
	reply []byte
	sent  time.Time
}

func (p *qmpProxy) fromClient() {
	for {
		_, data, err := p.sess.ws.Read(p.sess.io)
		if err != nil {
			p.sess.cancel(peerGone(err))
			return
		}
		p.handle(filterQMP(data, p.caller.QMPWrite))
	}
}

func (p *qmpProxy) handle(v verdict) {
	switch {
	case v.kind == malformed:
		p.answer(v, errorReply("GenericError", v.why, v.id))
	case v.kind == capabilities && p.negotiated:
		p.answer(v, errorReply("CommandNotFound", "Capabilities negotiation is already complete, command ignored", v.id))
	case v.kind == capabilities && len(v.args) > 0:
		p.answer(v, errorReply("GenericError", "the QMP shell offers no capabilities (no out-of-band execution); send qmp_capabilities without arguments", v.id))
	case v.kind == capabilities:
		p.negotiated = true
		p.answer(v, reply(`{}`, v.id))
	case !p.negotiated:
		p.answer(v, errorReply("CommandNotFound", "Expecting capabilities negotiation with 'qmp_capabilities'", v.id))
	case v.kind == refuse:
		p.log.Info("QMP command refused", "command", v.cmd, "reason", v.why)
		p.answer(v, errorReply("GenericError", fmt.Sprintf("qvirt: refused for user %q: %s", p.caller.User, v.why), v.id))
	default:
		p.forward(v)
	}
}

// forward queues v's reply slot and sends it to QEMU. The write is outside mu: QEMU may be busy
// writing a large reply that fromQEMU, which takes mu, must read first.
func (p *qmpProxy) forward(v verdict) {
	p.log.Info("QMP command", p.audit(v)...)
	p.mu.Lock()
	if len(p.queue) >= maxInFlight {
		p.mu.Unlock()
		p.sess.cancel(&closeCause{code: websocket.StatusPolicyViolation, reason: fmt.Sprintf("more than %d QMP replies outstanding", maxInFlight)})
		return
	}
	p.queue = append(p.queue, pending{cmd: v.cmd, id: v.id, sent: time.Now()})
	p.mu.Unlock()
	if _, err := p.conn.Write(append(v.wire, '\n')); err != nil {
		p.sess.cancel(&closeCause{code: websocket.StatusNormalClosure, reason: "the QMP monitor closed: QEMU exited"})
	}
}

// audit is what the log says of a forwarded command: its name, id, arguments (what QEMU
// receives, re-encoded) and whether it needed the write permission. The session's values (user,
// groups, namespace, VMI) are on p.log already.
func (p *qmpProxy) audit(v verdict) []any {
	_, readOnly := readOnlyAllows(v.cmd, v.args)
	kv := []any{"command", v.cmd, "id", string(v.id), "write", !readOnly}
	if len(v.args) > 0 {
		// Re-encoding what the decoder produced cannot fail.
		args, _ := json.Marshal(v.args)
		kv = append(kv, AuditArguments(v.cmd, args)...)
	}
	return kv
}

// answer sends the proxy's own reply to v, after the replies still due from QEMU.
func (p *qmpProxy) answer(v verdict, msg []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) >= maxInFlight {
		p.sess.cancel(&closeCause{code: websocket.StatusPolicyViolation, reason: fmt.Sprintf("more than %d QMP replies outstanding", maxInFlight)})
		return
	}
	if len(p.queue) > 0 {
		p.queue = append(p.queue, pending{cmd: v.cmd, id: v.id, reply: msg})
		return
	}
	p.write(msg)
}

func (p *qmpProxy) fromQEMU() {
	for {
		var raw json.RawMessage
		if err := p.dec.Decode(&raw); err != nil {
			p.sess.cancel(&closeCause{code: websocket.StatusNormalClosure, reason: "the QMP monitor closed: QEMU exited"})
			return
		}
		var m qmpMessage
		if err := json.Unmarshal(raw, &m); err != nil || m.Event != "" || (m.Return == nil && m.Error == nil) {
			p.send(raw) // events, and anything unexpected, pass through as they come
			continue
		}
		p.reply(raw, m.Error)
	}
}

// reply passes QEMU's reply on, then the local replies queued behind its command.
func (p *qmpProxy) reply(raw []byte, qerr *qmpError) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) > 0 && p.queue[0].reply == nil {
		head := p.queue[0]
		p.queue = p.queue[1:]
		kv := []any{"command", head.cmd, "id", string(head.id), "duration", time.Since(head.sent).Round(time.Microsecond).String()}
		if qerr != nil {
			kv = append(kv, "errorClass", qerr.Class, "error", qerr.Desc)
		}
		p.log.Info("QMP reply", kv...)
	}
	p.write(raw)
	for len(p.queue) > 0 && p.queue[0].reply != nil {
		p.write(p.queue[0].reply)
		p.queue = p.queue[1:]
	}
}

func (p *qmpProxy) send(msg []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.write(msg)
}

// write sends one message; mu is held.
func (p *qmpProxy) write(msg []byte) {
	if err := p.sess.ws.Write(p.sess.io, websocket.MessageText, msg); err != nil {
		p.sess.cancel(peerGone(err))
	}
}

func errorReply(class, desc string, id json.RawMessage) []byte {
	return marshalReply(map[string]any{"error": qmpError{Class: class, Desc: desc}}, id)
}

func reply(ret string, id json.RawMessage) []byte {
	return marshalReply(map[string]any{"return": json.RawMessage(ret)}, id)
}

func marshalReply(m map[string]any, id json.RawMessage) []byte {
	if id != nil {
		m["id"] = id
	}
	out, _ := json.Marshal(m) // strings, RawMessages from the decoder: cannot fail
	return out
}
