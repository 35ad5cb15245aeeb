package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/qvirt/qvirt/internal/apistatus"
	"github.com/qvirt/qvirt/launcher"
)

// actionTimeout bounds one call to the launcher; pausing or resuming vCPUs, sending keys or
// dumping the screen take milliseconds.
const actionTimeout = 30 * time.Second

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, "pause", (*launcher.Client).Pause)
}

func (s *Server) unpause(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, "unpause", (*launcher.Client).Resume)
}

// softReboot presses Ctrl+Alt+Del on the guest's keyboard; the guest reboots itself and the VMI
// stays Running (the launcher refuses it while paused, which becomes a 409).
func (s *Server) softReboot(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, "softreboot", (*launcher.Client).SoftReboot)
}

// action runs one launcher call for the request's VMI. The VMI status (Paused condition) follows
// from the launcher's status stream, which the handler's reconciler watches; this only acts.
func (s *Server) action(w http.ResponseWriter, r *http.Request, name string, call func(*launcher.Client, context.Context) error) {
	t, log, _, ok := s.callLauncher(w, r, name, func(ctx context.Context, c *launcher.Client) (any, error) {
		return nil, call(c, ctx)
	})
	if !ok {
		return
	}
	log.Info("action done")
	apistatus.WriteSuccess(w, fmt.Sprintf("VMI %s: %s done", t.key(), name))
}

// callLauncher runs call against the request's VMI's launcher within actionTimeout and returns
// its result; on a refusal or failure it has answered the request and returns false.
func (s *Server) callLauncher(w http.ResponseWriter, r *http.Request, name string, call func(context.Context, *launcher.Client) (any, error)) (target, logr.Logger, any, bool) {
	t, log, ok := s.begin(w, r, name, nil)
	if !ok {
		return t, log, nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	c := launcher.NewClient(t.dir.Command())
	defer c.Close()
	out, err := call(ctx, c)
	if err != nil {
		log.Info(name+" failed", "error", err.Error())
		fail(w, launcherError(t, name, err))
		return t, log, nil, false
	}
	return t, log, out, true
}

// screenshot answers the guest's display as image/png, streamed from the launcher (QMP
// screendump). Failures before the first byte are a metav1.Status like every other refusal.
func (s *Server) screenshot(w http.ResponseWriter, r *http.Request) {
	t, log, ok := s.begin(w, r, "screenshot", hasGraphics)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	c := launcher.NewClient(t.dir.Command())
	defer c.Close()
	png, err := c.Screenshot(ctx)
	if err != nil {
		log.Info("action failed", "error", err.Error())
		fail(w, launcherError(t, "screenshot", err))
		return
	}
	defer png.Close()
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	n, err := io.Copy(w, png)
	if err != nil {
		log.Info("screenshot cut short", "bytes", n, "error", err.Error())
		return
	}
	log.Info("action done", "bytes", n)
}

// hasGraphics refuses a VMI without a display, from its spec: the same answer whether or not its
// launcher runs.
func hasGraphics(t target) error {
	if d := t.vmi.Spec.Domain.Devices.AutoattachGraphicsDevice; d != nil && !*d {
		return apierrors.NewBadRequest(fmt.Sprintf("VMI %s has no graphics device, so no screen to capture (spec.domain.devices.autoattachGraphicsDevice is false)", t.key()))
	}
	return nil
}

// begin does what every action does first: it names the caller, finds the VMI on this node, runs
// check (when not nil) on it and checks that its launcher's socket exists. When it returns false
// it has answered the request.
func (s *Server) begin(w http.ResponseWriter, r *http.Request, name string, check func(target) error) (target, logr.Logger, bool) {
	caller, err := callerFrom(r)
	if err != nil {
		fail(w, err)
		return target{}, logr.Logger{}, false
	}
	t, err := s.lookup(r.Context(), r)
	if err != nil {
		fail(w, err)
		return target{}, logr.Logger{}, false
	}
	if check != nil {
		if err := check(t); err != nil {
			fail(w, err)
			return target{}, logr.Logger{}, false
		}
	}
	log := s.opts.Log.WithValues("vmi", t.key(), "user", caller.User, "groups", caller.Groups, "action", name)
	if _, err := os.Stat(t.dir.Command()); err != nil {
		fail(w, apierrors.NewServiceUnavailable(fmt.Sprintf("the launcher socket %s of VMI %s is missing: the launcher is not running", t.dir.Command(), t.key())))
		return target{}, logr.Logger{}, false
	}
	return t, log, true
}

// launcherError maps a launcher failure: its refusals (4xx) are state conflicts, its own failures
// are 500, no answer at all is 503.
func launcherError(t target, action string, err error) error {
	var ae *launcher.APIError
	if !errors.As(err, &ae) {
		return apierrors.NewServiceUnavailable(fmt.Sprintf("%s VMI %s: the launcher does not answer: %v", action, t.key(), err))
	}
	msg := fmt.Errorf("%s refused by its launcher: %s", action, ae.Msg)
	if ae.Status >= 400 && ae.Status < 500 {
		return apierrors.NewConflict(vmiResource, t.vmi.Name, msg)
	}
	return apierrors.NewInternalError(fmt.Errorf("%s VMI %s: launcher failed: %s", action, t.key(), ae.Msg))
}
