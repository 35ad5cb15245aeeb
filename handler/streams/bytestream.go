package streams

import (
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	subresources "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/machine"
)

// takeoverWait bounds how long a new console session waits for the one it replaces to let go of
// QEMU's serial socket.
const takeoverWait = 5 * time.Second

// consoleSession is the console session holding a VMI's serial socket.
type consoleSession struct {
	user string
	s    *session
	done chan struct{}
}

func (s *Server) console(w http.ResponseWriter, r *http.Request) {
	caller, t, ok := s.prepare(w, r, SubprotocolPlain)
	if !ok {
		return
	}
	if d := t.vmi.Spec.Domain.Devices.AutoattachSerialConsole; d != nil && !*d {
		fail(w, apierrors.NewBadRequest(fmt.Sprintf("VMI %s has no serial console (spec.domain.devices.autoattachSerialConsole is false)", t.key())))
		return
	}
	sess := newSession(r.Context())
	cs := &consoleSession{user: caller.User, s: sess, done: make(chan struct{})}
	defer close(cs.done)
	s.takeOverConsole(t.vmi.UID, cs)
	defer s.releaseConsole(t.vmi.UID, cs)

	conn, err := dial(sess.ctx, t, "serial console", t.dir.Serial())
	if err != nil {
		fail(w, err)
		return
	}
	s.serveBytes(w, r, sess, conn, "serial console", caller, t, SubprotocolPlain)
}

func (s *Server) vnc(w http.ResponseWriter, r *http.Request) {
	caller, t, ok := s.prepare(w, r, SubprotocolPlain, SubprotocolBinary)
	if !ok {
		return
	}
	if d := t.vmi.Spec.Domain.Devices.AutoattachGraphicsDevice; d != nil && !*d {
		fail(w, apierrors.NewBadRequest(fmt.Sprintf("VMI %s has no graphics device, so no VNC display (spec.domain.devices.autoattachGraphicsDevice is false)", t.key())))
		return
	}
	sess := newSession(r.Context())
	conn, err := dial(sess.ctx, t, "VNC", t.dir.VNC())
	if err != nil {
		fail(w, err)
		return
	}
	// QEMU's VNC server takes several clients at once: no takeover.
	s.serveBytes(w, r, sess, conn, "VNC display", caller, t, SubprotocolPlain, SubprotocolBinary)
}

// usbRedir carries one client's USB device, in usbredir's protocol, to a free USB redirection slot
// of the VMI: each slot takes one device, and a VMI has machine.MaxUSBRedirSlots.
func (s *Server) usbRedir(w http.ResponseWriter, r *http.Request) {
	caller, t, ok := s.prepare(w, r, SubprotocolPlain, SubprotocolBinary)
	if !ok {
		return
	}
	if t.vmi.Spec.Domain.Devices.ClientPassthrough == nil {
		fail(w, apierrors.NewBadRequest(fmt.Sprintf("VMI %s has no USB redirection (spec.domain.devices.clientPassthrough is not set)", t.key())))
		return
	}
	slot, ok := s.takeUSBSlot(t.vmi.UID)
	if !ok {
		fail(w, apierrors.NewConflict(schema.GroupResource{Group: subresources.GroupVersion.Group, Resource: subresources.VirtualMachineInstances}, t.vmi.Name,
			fmt.Errorf("all %d USB redirection slots of VMI %s are in use", machine.MaxUSBRedirSlots, t.key())))
		return
	}
	defer s.releaseUSBSlot(t.vmi.UID, slot)
	sess := newSession(r.Context())
	conn, err := dial(sess.ctx, t, "USB redirection", t.dir.USBRedir(slot))
	if err != nil {
		fail(w, err)
		return
	}
	s.serveBytes(w, r, sess, conn, fmt.Sprintf("USB redirection slot %d", slot), caller, t, SubprotocolPlain, SubprotocolBinary)
}

// takeUSBSlot marks the VMI's first free USB redirection slot in use; false when none is free.
func (s *Server) takeUSBSlot(uid types.UID) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slots := s.usbSlots[uid]
	if slots == nil {
		slots = &[machine.MaxUSBRedirSlots]bool{}
		s.usbSlots[uid] = slots
	}
	for i, used := range slots {
		if !used {
			slots[i] = true
			return i, true
		}
	}
	return 0, false
}

// releaseUSBSlot frees a slot takeUSBSlot gave; a VMI with none in use is forgotten.
func (s *Server) releaseUSBSlot(uid types.UID, slot int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slots := s.usbSlots[uid]
	if slots == nil {
		return
	}
	slots[slot] = false
	if *slots == ([machine.MaxUSBRedirSlots]bool{}) {
		delete(s.usbSlots, uid)
	}
}

// prepare does what every stream does first: identify the caller, check the subprotocol and find
// the VMI. It answers the request itself when it returns false.
func (s *Server) prepare(w http.ResponseWriter, r *http.Request, protocols ...string) (Caller, target, bool) {
	caller, err := callerFrom(r)
	if err != nil {
		fail(w, err)
		return caller, target{}, false
	}
	if err := checkSubprotocol(r, protocols...); err != nil {
		fail(w, err)
		return caller, target{}, false
	}
	t, err := s.lookup(r.Context(), r)
	if err != nil {
		fail(w, err)
		return caller, target{}, false
	}
	return caller, t, true
}

// takeOverConsole makes cs the VMI's console session, ending the previous one (which is told who
// took over) and waiting until it has closed the serial socket.
func (s *Server) takeOverConsole(uid types.UID, cs *consoleSession) {
	s.mu.Lock()
	old := s.consoles[uid]
	s.consoles[uid] = cs
	s.mu.Unlock()
	if old == nil {
		return
	}
	old.s.cancel(&closeCause{code: StatusTakenOver, reason: fmt.Sprintf("console taken over by a new session of user %q", cs.user)})
	select {
	case <-old.done:
	case <-time.After(takeoverWait):
	}
}

func (s *Server) releaseConsole(uid types.UID, cs *consoleSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.consoles[uid] == cs {
		delete(s.consoles, uid)
	}
}

// serveBytes upgrades the request and copies bytes both ways between the websocket and conn until
// either side closes or the session ends. It owns conn.
func (s *Server) serveBytes(w http.ResponseWriter, r *http.Request, sess *session, conn net.Conn, what string, caller Caller, t target, protocols ...string) {
	defer conn.Close()
	ws, err := accept(w, r, protocols...)
	if err != nil {
		sess.cancel(err)
		return // Accept has answered the request
	}
	// qvirt-api's limit, not coder/websocket's default of 32 KiB: a paste qvirt-api passed on
	// must not end the session here.
	ws.SetReadLimit(subresources.MaxClientMessage)
	sess.ws = ws
	log := s.opts.Log.WithValues("vmi", t.key(), "user", caller.User, "stream", what)
	log.V(1).Info("stream opened")

	var wg sync.WaitGroup
	wg.Go(func() { s.toClient(sess, conn, what) })
	wg.Go(func() { s.fromClient(sess, conn) })
	wg.Go(func() { sess.keepalive(s.opts.PingInterval, s.opts.PingTimeout) })
	<-sess.ctx.Done()
	_ = conn.Close()
	cc := sess.end()
	wg.Wait()
	log.V(1).Info("stream closed", "code", int(cc.code), "reason", cc.reason)
}

func (s *Server) toClient(sess *session, conn net.Conn, what string) {
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if werr := sess.ws.Write(sess.io, websocket.MessageBinary, buf[:n]); werr != nil {
				sess.cancel(peerGone(werr))
				return
			}
		}
		if err != nil {
			sess.cancel(&closeCause{code: websocket.StatusNormalClosure, reason: fmt.Sprintf("the %s closed: QEMU exited", what)})
			return
		}
	}
}

func (s *Server) fromClient(sess *session, conn net.Conn) {
	for {
		_, data, err := sess.ws.Read(sess.io)
		if err != nil {
			sess.cancel(peerGone(err))
			return
		}
		if _, err := conn.Write(data); err != nil {
			sess.cancel(&closeCause{code: websocket.StatusNormalClosure, reason: "QEMU closed the socket: " + err.Error()})
			return
		}
	}
}
