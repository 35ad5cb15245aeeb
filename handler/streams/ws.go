package streams

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/coder/websocket"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	subresources "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// Websocket subprotocols, one per kind of stream: the same as qvirt-api's (its contract names them).
const (
	// SubprotocolPlain carries raw bytes in binary frames: the serial console and VNC.
	SubprotocolPlain = subresources.SubprotocolPlain
	// SubprotocolBinary is accepted for VNC too, as noVNC asks for it.
	SubprotocolBinary = "binary"
	// SubprotocolQMP carries one QMP JSON message per text frame.
	SubprotocolQMP = subresources.SubprotocolQMP
)

// StatusTakenOver closes a console session that a newer session of the same VMI replaced.
const StatusTakenOver websocket.StatusCode = 4001

// checkSubprotocol refuses a client that offers subprotocols, none of which this endpoint speaks.
// A client offering none is served (plain websocket clients and tests).
func checkSubprotocol(r *http.Request, allowed ...string) error {
	var offered []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			offered = append(offered, strings.TrimSpace(p))
		}
	}
	if len(offered) == 0 || slices.ContainsFunc(offered, func(p string) bool { return slices.Contains(allowed, p) }) {
		return nil
	}
	return apierrors.NewBadRequest(fmt.Sprintf("websocket subprotocols %v offered; this endpoint speaks %v", offered, allowed))
}

func accept(w http.ResponseWriter, r *http.Request, protocols ...string) (*websocket.Conn, error) {
	return websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols: protocols,
		// Origin checks protect browsers from cross-site requests; the only client here is
		// qvirt-api, authenticated by its certificate, and it may relay a browser's Origin.
		InsecureSkipVerify: true,
	})
}

// closeCause ends a session and says how to close its websocket.
type closeCause struct {
	code   websocket.StatusCode
	reason string
	// now closes without a close handshake: the peer is gone.
	now bool
}

func (c *closeCause) Error() string {
	return fmt.Sprintf("websocket closed (%d): %s", c.code, c.reason)
}

func peerGone(err error) *closeCause {
	return &closeCause{code: websocket.CloseStatus(err), reason: "peer closed: " + err.Error(), now: true}
}

// session is one websocket stream. ctx ends the session (its cause says why, or the server shuts
// down); io is for websocket reads and writes and outlives ctx, because coder/websocket drops the
// connection without a close frame when an I/O context ends, and the peer should learn why.
type session struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	io     context.Context
	stopIO context.CancelFunc
	ws     *websocket.Conn
}

func newSession(parent context.Context) *session {
	ctx, cancel := context.WithCancelCause(parent)
	io, stopIO := context.WithCancel(context.WithoutCancel(parent))
	return &session{ctx: ctx, cancel: cancel, io: io, stopIO: stopIO}
}

// end closes the websocket as ctx's cause says and returns that cause.
func (s *session) end() *closeCause {
	defer s.stopIO()
	var cc *closeCause
	if !errors.As(context.Cause(s.ctx), &cc) {
		cc = &closeCause{code: websocket.StatusGoingAway, reason: "qvirt-handler is shutting down"}
	}
	if s.ws == nil {
		return cc
	}
	if cc.now {
		_ = s.ws.CloseNow()
		return cc
	}
	_ = s.ws.Close(cc.code, truncate(cc.reason, 120)) // a close reason is at most 123 bytes
	return cc
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// keepalive pings the peer until the session ends and ends it when a pong does not come.
func (s *session) keepalive(interval, timeout time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-tick.C:
		}
		// Not s.ctx: a ping cut short by the session's end must not drop the connection before
		// end sends the close frame.
		ctx, cancel := context.WithTimeout(s.io, timeout)
		err := s.ws.Ping(ctx)
		cancel()
		if err != nil && s.ctx.Err() == nil {
			s.cancel(&closeCause{code: websocket.StatusPolicyViolation, reason: fmt.Sprintf("no pong within %s", timeout), now: true})
			return
		}
	}
}
