package apiserver

import (
	"context"
	"io"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
)

// vmiActionTimeout bounds a relayed action; a screenshot of a large display is the slowest.
const vmiActionTimeout = 60 * time.Second

// vmiAction relays pause, unpause, softreboot, freeze, unfreeze (PUT) and screenshot, guestosinfo,
// userlist, filesystemlist (GET) to the handler of the VMI's node: the handler's answer, status and
// body (a metav1.Status, the PNG or the guest agent's JSON), goes back as is.
func (a *API) vmiAction(endpoint, method string) connectFunc {
	return func(ctx context.Context, name string) (http.Handler, error) {
		u, ok := genericapirequest.UserFrom(ctx)
		if !ok {
			return nil, apierrors.NewUnauthorized("no authenticated user in the request")
		}
		t, err := a.runningVMI(ctx, name)
		if err != nil {
			return nil, err
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a.relay(w, r, t, endpoint, method, u)
		}), nil
	}
}

func (a *API) relay(w http.ResponseWriter, r *http.Request, t target, endpoint, method string, u user.Info) {
	log := a.log.WithValues("vmi", t.key(), "action", endpoint, "user", u.GetName(), "groups", u.GetGroups())
	hc, err := a.handlerClient(t)
	if err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), vmiActionTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, t.url("https", endpoint), nil)
	if err != nil {
		writeError(w, apierrors.NewInternalError(err))
		return
	}
	req.Header = userHeaders(u, false)
	resp, err := hc.Do(req)
	if err != nil {
		log.Info("action failed", "error", err.Error())
		writeError(w, unreachable(t, err))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		err := handlerError(t, resp)
		log.Info("action refused", "error", err.Error())
		writeError(w, err)
		return
	}
	log.Info("action done")
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
