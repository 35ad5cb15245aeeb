package launcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/internal/quiettimer"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/launcher/wire"
	"github.com/qvirt/qvirt/machine"
)

// SocketName is the command socket's file name inside the per-VMI directory.
const SocketName = "launcher.sock"

// maxBody bounds request bodies; a VMI spec is far smaller.
const maxBody = 4 << 20

func (s *server) routes() *wire.Mux {
	l := s.l
	mux := wire.NewMux(refuse)
	mux.HandleFunc("GET /v1/info", s.info)
	mux.HandleFunc("POST /v1/sync", s.sync)
	mux.HandleFunc("GET /v1/status", s.status)
	mux.HandleFunc("GET /v1/stats", s.stats)
	mux.HandleFunc("POST /v1/pause", s.simple(l.Pause))
	mux.HandleFunc("POST /v1/resume", s.simple(l.Resume))
	mux.HandleFunc("POST /v1/reset", s.simple(l.Reset))
	mux.HandleFunc("POST /v1/softreboot", s.simple(l.SoftReboot))
	mux.HandleFunc("GET /v1/screenshot", s.screenshot)
	mux.HandleFunc("POST /v1/kill", s.simple(l.Kill))
	mux.HandleFunc("POST /v1/shutdown", s.shutdown)
	mux.HandleFunc("POST /v1/disks", s.hotplugDisk)
	mux.HandleFunc("DELETE /v1/disks/{name}", s.unplugDisk)
	mux.HandleFunc("POST /v1/nics", s.hotplugNIC)
	mux.HandleFunc("DELETE /v1/nics/{name}", s.unplugNIC)
	mux.HandleFunc("PUT /v1/cpu", put(func(ctx context.Context, req protocol.CPURequest) error { return l.SetSockets(ctx, req.Sockets) }))
	mux.HandleFunc("PUT /v1/memory", put(func(ctx context.Context, req protocol.MemoryRequest) error {
		return l.SetGuestMemory(ctx, req.GuestMiB)
	}))
	mux.HandleFunc("POST /v1/migration/target", s.migrationTarget)
	mux.HandleFunc("POST /v1/migration/source", s.migrationSource)
	mux.HandleFunc("DELETE /v1/migration", s.simple(l.CancelMigration))
	mux.HandleFunc("POST /v1/migration/run", s.migrationRun)
	mux.HandleFunc("POST /v1/migration/finish", s.simple(l.FinishMigration))
	mux.HandleFunc("POST /v1/migration/reclaim", s.migrationReclaim)
	mux.HandleFunc("POST /v1/migration/recover", s.migrationRecover)
	mux.HandleFunc("POST /v1/migration/resume", s.migrationResume)
	mux.HandleFunc("GET /v1/guest/ping", reply(l.GuestPing))
	mux.HandleFunc("POST /v1/guest/exec-probe", s.guestExecProbe)
	mux.HandleFunc("GET /v1/guest/info", reply(l.GuestInfo))
	mux.HandleFunc("GET /v1/guest/users", reply(l.GuestUsers))
	mux.HandleFunc("GET /v1/guest/filesystems", reply(l.GuestFilesystems))
	mux.HandleFunc("GET /v1/guest/fsfreeze", reply(func(ctx context.Context) (protocol.FSFreeze, error) { return l.FSFreeze(ctx, "status") }))
	mux.HandleFunc("POST /v1/guest/fsfreeze", reply(func(ctx context.Context) (protocol.FSFreeze, error) { return l.FSFreeze(ctx, "freeze") }))
	mux.HandleFunc("POST /v1/guest/fsthaw", reply(func(ctx context.Context) (protocol.FSFreeze, error) { return l.FSFreeze(ctx, "thaw") }))
	return mux
}

// Serve listens on socket (mode 0600) and serves l until ctx ends.
func Serve(ctx context.Context, socket string, l *Launcher, log logr.Logger) error {
	ln, err := Listen(socket)
	if err != nil {
		return err
	}
	return ServeOn(ctx, ln, l, log)
}

// Listen replaces a stale command socket with a new one, readable by the launcher's user only.
func Listen(socket string) (net.Listener, error) {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", socket, err)
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", socket, err)
	}
	return ln, nil
}

// ServeOn serves the command protocol on ln until ctx ends.
func ServeOn(ctx context.Context, ln net.Listener, l *Launcher, log logr.Logger) error {
	s := &server{l: l, log: log, closing: make(chan struct{})}
	srv := &wire.Server{Handler: s.routes().Serve, MaxBodyBytes: maxBody, ErrorBody: errorBody, Log: log}
	srv.RegisterOnShutdown(func() { close(s.closing) })
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	// Serve returns as soon as Shutdown closes the listener, and the launcher's process exits
	// when this returns: wait for the replies being written and the status watches' last lines
	// (the guest's end, for the node agent), a bounded while.
	shutCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil {
		log.Info("the command server stopped with requests still open", "error", err.Error())
		_ = srv.Close()
	}
	if err := <-served; !errors.Is(err, wire.ErrServerClosed) {
		return err
	}
	return nil
}

type server struct {
	l   *Launcher
	log logr.Logger
	// closing is closed when the server shuts down: a status watch sends its last status and
	// ends.
	closing chan struct{}
}

func (s *server) sync(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.SyncRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Machine.UID == "" {
		writeError(w, machine.Required(machinePath.Child("uid"), "the VMI's UID"))
		return
	}
	// QEMU must outlive this request: start it with a context that only bounds start-up.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
	defer cancel()
	if err := s.l.Sync(ctx, &req); err != nil {
		writeError(w, err)
		return
	}
	st, _ := s.l.Status(r.Context())
	writeJSON(w, wire.StatusOK, st)
}

// status replies with the current Status, or with ?watch=true streams one JSON Status per line
// each time it changes, and again every WatchHeartbeat without a change (the node agent takes a
// silent stream for a stuck launcher), until the client goes away.
func (s *server) status(w *wire.ResponseWriter, r *wire.Request) {
	st, changed := s.l.Status(r.Context())
	if r.Query.Get("watch") != "true" {
		writeJSON(w, wire.StatusOK, st)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	// A timerfd, not a Go ticker: on a long-idle launcher the heartbeat is most of what wakes it
	// (package quiettimer).
	heartbeat := quiettimer.New()
	defer heartbeat.Close()
	for {
		if err := enc.Encode(st); err != nil {
			return
		}
		w.Flush()
		heartbeat.Reset(WatchHeartbeat)
		select {
		case <-changed:
		case <-heartbeat.C:
		case <-r.Context().Done():
			return
		case <-s.closing:
			st, _ = s.l.Status(r.Context())
			_ = enc.Encode(st)
			return
		}
		st, changed = s.l.Status(r.Context())
	}
}

// reply serves fn's result as JSON.
func reply[T any](fn func(context.Context) (T, error)) wire.HandlerFunc {
	return func(w *wire.ResponseWriter, r *wire.Request) {
		v, err := fn(r.Context())
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, wire.StatusOK, v)
	}
}

func (s *server) simple(fn func(context.Context) error) wire.HandlerFunc {
	return func(w *wire.ResponseWriter, r *wire.Request) {
		if err := fn(r.Context()); err != nil {
			writeError(w, err)
			return
		}
		st, _ := s.l.Status(r.Context())
		writeJSON(w, wire.StatusOK, st)
	}
}

// screenshot streams the PNG QEMU wrote; errors before the first byte are the usual JSON.
func (s *server) screenshot(w *wire.ResponseWriter, r *wire.Request) {
	f, err := s.l.Screenshot(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "image/png")
	if fi, err := f.Stat(); err == nil {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
	}
	w.WriteHeader(wire.StatusOK)
	if _, err := io.Copy(w, f); err != nil {
		s.log.Info("screenshot: client went away", "error", err.Error())
	}
}

func (s *server) shutdown(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.ShutdownRequest
	if len(r.Body) != 0 && !decode(w, r, &req) {
		return
	}
	if req.GracePeriodSeconds != nil && *req.GracePeriodSeconds < 0 {
		writeError(w, machine.Invalid("gracePeriodSeconds", *req.GracePeriodSeconds, "must be 0 or more"))
		return
	}
	exit, err := s.l.Shutdown(r.Context(), req.GracePeriodSeconds)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, wire.StatusOK, exit)
}

// info lists the protocol versions this launcher speaks, for the node agent's handshake.
func (s *server) info(w *wire.ResponseWriter, r *wire.Request) {
	writeJSON(w, wire.StatusOK, machine.Info{Protocols: []string{machine.Protocol}})
}

func (s *server) hotplugDisk(w *wire.ResponseWriter, r *wire.Request) {
	var req machine.Disk
	if !decode(w, r, &req) {
		return
	}
	d, err := s.l.HotplugDisk(r.Context(), &req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, wire.StatusOK, d)
}

func (s *server) unplugDisk(w *wire.ResponseWriter, r *wire.Request) {
	if err := s.l.UnplugDisk(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(wire.StatusNoContent)
}

func (s *server) hotplugNIC(w *wire.ResponseWriter, r *wire.Request) {
	var req machine.NIC
	if !decode(w, r, &req) {
		return
	}
	if err := s.l.HotplugNIC(r.Context(), &req); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, wire.StatusOK, req)
}

func (s *server) unplugNIC(w *wire.ResponseWriter, r *wire.Request) {
	if err := s.l.UnplugNIC(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(wire.StatusNoContent)
}

// put decodes a request of type T and applies it with fn, answering 204 when it is done.
func put[T any](fn func(context.Context, T) error) wire.HandlerFunc {
	return func(w *wire.ResponseWriter, r *wire.Request) {
		var req T
		if !decode(w, r, &req) {
			return
		}
		if err := fn(r.Context(), req); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(wire.StatusNoContent)
	}
}

func (s *server) migrationTarget(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.MigrationTarget
	if !decode(w, r, &req) {
		return
	}
	uri, err := s.l.PrepareMigrationTarget(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, wire.StatusOK, protocol.MigrationTargetReply{URI: uri})
}

func (s *server) migrationSource(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.MigrationSource
	if !decode(w, r, &req) {
		return
	}
	if err := s.l.MigrateSource(r.Context(), &req); err != nil {
		writeError(w, err)
		return
	}
	st, _ := s.l.Status(r.Context())
	writeJSON(w, wire.StatusAccepted, st)
}

func (s *server) migrationRun(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.MigrationRun
	if !decode(w, r, &req) {
		return
	}
	if err := s.l.RunMigrated(r.Context(), &req); err != nil {
		writeError(w, err)
		return
	}
	st, _ := s.l.Status(r.Context())
	writeJSON(w, wire.StatusOK, st)
}

func (s *server) migrationReclaim(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.MigrationReclaim
	if !decode(w, r, &req) {
		return
	}
	if err := s.l.ReclaimMigration(r.Context(), &req); err != nil {
		writeError(w, err)
		return
	}
	st, _ := s.l.Status(r.Context())
	writeJSON(w, wire.StatusOK, st)
}

func (s *server) migrationRecover(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.MigrationRecover
	if !decode(w, r, &req) {
		return
	}
	uri, err := s.l.RecoverMigration(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, wire.StatusOK, protocol.MigrationTargetReply{URI: uri})
}

func (s *server) migrationResume(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.MigrationResume
	if !decode(w, r, &req) {
		return
	}
	if err := s.l.ResumeMigration(r.Context(), req); err != nil {
		writeError(w, err)
		return
	}
	st, _ := s.l.Status(r.Context())
	writeJSON(w, wire.StatusAccepted, st)
}

// decode reads a JSON body strictly: unknown fields are a 400 naming them.
func (s *server) guestExecProbe(w *wire.ResponseWriter, r *wire.Request) {
	var req protocol.GuestExecProbe
	if !decode(w, r, &req) {
		return
	}
	res, err := s.l.GuestExecProbe(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, wire.StatusOK, res)
}

func decode(w *wire.ResponseWriter, r *wire.Request, into any) bool {
	dec := json.NewDecoder(bytes.NewReader(r.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		writeJSON(w, wire.StatusBadRequest, protocol.ErrorResponse{Error: "decode request body: " + err.Error()})
		return false
	}
	return true
}

// writeError maps an error to its HTTP status: validation errors are 400 with the field named,
// state conflicts 409, anything else (QEMU refusing a command) 500.
func writeError(w *wire.ResponseWriter, err error) {
	var (
		fe       *machine.FieldError
		conflict *ConflictError
	)
	switch {
	case errors.As(err, &fe):
		writeJSON(w, wire.StatusBadRequest, protocol.ErrorResponse{Error: err.Error(), Field: fe.Field})
	case errors.As(err, &conflict):
		writeJSON(w, wire.StatusConflict, protocol.ErrorResponse{Error: err.Error()})
	default:
		writeJSON(w, wire.StatusInternalServerError, protocol.ErrorResponse{Error: err.Error()})
	}
}

func writeJSON(w *wire.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// refuse answers a request no route takes (404, 405) with the usual JSON error.
func refuse(w *wire.ResponseWriter, code int, msg string) {
	writeJSON(w, code, protocol.ErrorResponse{Error: msg})
}

// errorBody is the JSON error of a request the server refuses before routing it (malformed, too
// large).
func errorBody(_ int, msg string) (string, []byte) {
	data, _ := json.Marshal(protocol.ErrorResponse{Error: msg})
	return "application/json", data
}
