package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/handler/streams"
)

// stream serves the console, vnc or qmp subresource: it checks the VMI and the node, opens the
// handler's websocket first (so a refusal reaches the user as an HTTP error with the handler's
// status) and then accepts the user's websocket with the subprotocol the handler chose.
func (a *API) stream(endpoint string) connectFunc {
	return func(ctx context.Context, name string) (http.Handler, error) {
		u, ok := genericapirequest.UserFrom(ctx)
		if !ok {
			return nil, apierrors.NewUnauthorized("no authenticated user in the request")
		}
		t, err := a.runningVMI(ctx, name)
		if err != nil {
			return nil, err
		}
		write := false
		if endpoint == sub.QMP {
			if write, err = a.mayWriteQMP(ctx, u, t); err != nil {
				return nil, err
			}
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a.serveStream(w, r, t, endpoint, u, write)
		}), nil
	}
}

// mayWriteQMP asks this server's authorizer (the delegated SubjectAccessReview) whether u holds
// verb update on virtualmachineinstances/qmp-write for the VMI.
func (a *API) mayWriteQMP(ctx context.Context, u user.Info, t target) (bool, error) {
	attrs := authorizer.AttributesRecord{
		User: u, Verb: "update", Namespace: t.vmi.Namespace, Name: t.vmi.Name,
		APIGroup: sub.GroupVersion.Group, APIVersion: sub.GroupVersion.Version,
		Resource: sub.VirtualMachineInstances, Subresource: sub.QMPWrite, ResourceRequest: true,
	}
	decision, reason, err := a.authorizer.Authorize(ctx, attrs)
	if err != nil && decision != authorizer.DecisionAllow {
		return false, apierrors.NewInternalError(fmt.Errorf("authorize %s on virtualmachineinstances/%s: %w (%s)", u.GetName(), sub.QMPWrite, err, reason))
	}
	return decision == authorizer.DecisionAllow, nil
}

func userHeaders(u user.Info, qmpWrite bool) http.Header {
	h := http.Header{}
	h.Set(streams.HeaderUser, u.GetName())
	for _, g := range u.GetGroups() {
		h.Add(streams.HeaderGroups, g)
	}
	h.Set(streams.HeaderQMPWrite, strconv.FormatBool(qmpWrite))
	return h
}

func offeredSubprotocols(r *http.Request) []string {
	var out []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

func (a *API) serveStream(w http.ResponseWriter, r *http.Request, t target, endpoint string, u user.Info, write bool) {
	log := a.log.WithValues("vmi", t.key(), "namespace", t.vmi.Namespace, "stream", endpoint, "user", u.GetName(), "groups", u.GetGroups())
	offered := offeredSubprotocols(r)
	backend, err := a.dialHandler(r.Context(), t, endpoint, userHeaders(u, write), offered)
	if err != nil {
		log.Info("stream refused", "error", err.Error())
		writeError(w, err)
		return
	}
	defer backend.CloseNow()
	var protos []string
	if p := backend.Subprotocol(); p != "" {
		protos = []string{p}
	}
	front, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: protos})
	if err != nil {
		// Accept has answered the client already (400 for a request that is no websocket).
		log.Info("websocket upgrade failed", "error", err.Error())
		_ = backend.Close(websocket.StatusGoingAway, "the client's websocket upgrade failed")
		return
	}
	defer front.CloseNow()
	// The user's messages are bounded as the handler bounds them (sub.MaxClientMessage), so what
	// passes here passes there; QMP replies may be larger.
	front.SetReadLimit(sub.MaxClientMessage)
	backend.SetReadLimit(sub.MaxClientMessage)
	if endpoint == sub.QMP {
		backend.SetReadLimit(sub.MaxQMPMessage)
	}
	log.Info("stream opened", "subprotocol", front.Subprotocol(), "qmpWrite", write)
	p := &pipe{front: front, back: backend, log: log, ping: a.opts.PingInterval, pingTimeout: a.opts.PingTimeout}
	if endpoint == sub.QMP {
		p.audit = &qmpAudit{log: log}
	}
	code, reason := p.run(r.Context())
	log.Info("stream closed", "code", int(code), "reason", reason)
}

// dialHandler opens the handler's websocket; a refusal before the upgrade comes back as the
// handler's metav1.Status.
func (a *API) dialHandler(ctx context.Context, t target, endpoint string, h http.Header, protos []string) (*websocket.Conn, error) {
	hc, err := a.handlerClient(t)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, resp, err := websocket.Dial(dctx, t.url("wss", endpoint), &websocket.DialOptions{
		HTTPClient: hc, HTTPHeader: h, Subprotocols: protos,
	})
	if err == nil {
		return conn, nil
	}
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		return nil, handlerError(t, resp)
	}
	return nil, unreachable(t, err)
}

// pipe copies messages both ways between the user's websocket (front) and the handler's (back)
// and propagates the first close to the other side with its code and reason.
type pipe struct {
	front, back       *websocket.Conn
	log               logr.Logger
	audit             *qmpAudit
	ping, pingTimeout time.Duration
}

// ended is why one direction stopped.
type ended struct {
	// fromFront is true when reading the user's side (or writing to it) failed.
	fromFront bool
	err       error
}

func (p *pipe) run(ctx context.Context) (websocket.StatusCode, string) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan ended, 3)
	go p.copy(ctx, p.back, p.front, false, done)
	go p.copy(ctx, p.front, p.back, true, done)
	go p.keepalive(ctx, done)
	first := <-done
	code, reason := closeOf(first)
	// The side that failed is closed already (or gone); tell the other one why.
	other, name := p.front, "the client"
	if first.fromFront {
		other, name = p.back, "qvirt-handler"
	}
	if err := other.Close(code, reason); err != nil {
		p.log.V(1).Info("closing the other side", "side", name, "error", err.Error())
	}
	cancel()
	_ = p.front.CloseNow()
	_ = p.back.CloseNow()
	if p.audit != nil {
		p.audit.unanswered()
	}
	return code, reason
}

// closeOf is the close code and reason to pass on: the peer's own when it sent a close frame,
// else 1001 naming the side that went away.
func closeOf(e ended) (websocket.StatusCode, string) {
	side := "qvirt-handler"
	if e.fromFront {
		side = "the client"
	}
	var ce websocket.CloseError
	if errors.As(e.err, &ce) {
		switch ce.Code {
		case websocket.StatusNoStatusRcvd:
			return websocket.StatusNormalClosure, ""
		case websocket.StatusAbnormalClosure, websocket.StatusTLSHandshake:
			// Reserved codes that must not be sent.
		default:
			return ce.Code, ce.Reason
		}
	}
	return websocket.StatusGoingAway, truncate(side+" went away: "+e.err.Error(), 120)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// copy moves messages from one side to the other until one fails; the frame type is kept.
func (p *pipe) copy(ctx context.Context, from, to *websocket.Conn, fromFront bool, done chan<- ended) {
	for {
		typ, data, err := from.Read(ctx)
		if err != nil {
			done <- ended{fromFront: fromFront, err: err}
			return
		}
		if p.audit != nil {
			if fromFront {
				p.audit.command(data)
			} else {
				p.audit.reply(data)
			}
		}
		if err := to.Write(ctx, typ, data); err != nil {
			done <- ended{fromFront: !fromFront, err: err}
			return
		}
	}
}

// keepalive pings both sides; a side that does not answer within pingTimeout ends the session.
func (p *pipe) keepalive(ctx context.Context, done chan<- ended) {
	if p.ping <= 0 {
		return
	}
	tick := time.NewTicker(p.ping)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, side := range []struct {
			c     *websocket.Conn
			front bool
		}{{p.front, true}, {p.back, false}} {
			pctx, cancel := context.WithTimeout(ctx, p.pingTimeout)
			err := side.c.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				done <- ended{fromFront: side.front, err: fmt.Errorf("no pong within %s", p.pingTimeout)}
				return
			}
		}
	}
}
