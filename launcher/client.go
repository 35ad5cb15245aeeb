package launcher

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/qvirt/qvirt/internal/unixsock"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/launcher/wire"
	"github.com/qvirt/qvirt/machine"
)

// Client speaks the command protocol to one launcher over its unix socket. It is what the node
// agent uses; safe for concurrent use.
//
// A launcher is untrusted (a tenant can exec into its pod and answer in its place), so every call
// is bounded in time and every reply in size: a launcher that accepts and never answers, or answers
// without end, costs its caller one timeout, not a stuck worker or the node agent's memory.
//
// Each call is a connection of its own, closed after the reply: a node agent then holds one
// connection per instance, its status watch, and no idle ones.
type Client struct {
	socket string
	opts   ClientOptions
}

// Production limits of a Client (see ClientOptions).
const (
	// DefaultCallTimeout bounds a command: the launcher answers from its own state or one QMP
	// round trip.
	DefaultCallTimeout = 10 * time.Second
	// DefaultSyncTimeout bounds Sync, which answers once QEMU started: the launcher gives
	// start-up a minute (image resolution included), plus a margin.
	DefaultSyncTimeout = 75 * time.Second
	// DefaultMaxReplyBytes bounds a reply, and each status of a watch: a status is a few KiB.
	DefaultMaxReplyBytes = 1 << 20
	// watchBuffer is the initial line buffer of a status stream.
	watchBuffer = 4 << 10
	// connBuffer is each connection's read and write buffer.
	connBuffer = 1 << 10
	// WatchHeartbeat is how often a launcher repeats its status on a watch that saw no change, so
	// a silent stream means a stuck launcher. Every heartbeat wakes the launcher and its node agent
	// for one idle instance, and a wake-up is most of what an idle launcher costs (BenchmarkLauncherIdle:
	// at one a minute, the heartbeat was 5-10 ms of the launcher's 7-15 ms a minute on the test
	// machine). At 5 minutes a stuck launcher is noticed within DefaultWatchIdleTimeout, 15
	// minutes; a dead one at once, since its socket closes.
	WatchHeartbeat = 5 * time.Minute
	// DefaultWatchIdleTimeout ends a watch that sent nothing (not even a heartbeat) for this long.
	DefaultWatchIdleTimeout = 3 * WatchHeartbeat

	maxResponseHeaderBytes = 64 << 10
)

// ClientOptions are a Client's limits; a zero field takes its production default.
type ClientOptions struct {
	// CallTimeout bounds each call but Sync, Shutdown, Screenshot and Watch (DefaultCallTimeout).
	CallTimeout time.Duration
	// SyncTimeout bounds Sync (DefaultSyncTimeout).
	SyncTimeout time.Duration
	// MaxReplyBytes bounds a reply's body and each line of a watch (DefaultMaxReplyBytes).
	MaxReplyBytes int64
	// WatchIdleTimeout ends a watch silent for this long (DefaultWatchIdleTimeout).
	WatchIdleTimeout time.Duration
}

func (o ClientOptions) withDefaults() ClientOptions {
	if o.CallTimeout <= 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = DefaultSyncTimeout
	}
	if o.MaxReplyBytes <= 0 {
		o.MaxReplyBytes = DefaultMaxReplyBytes
	}
	if o.WatchIdleTimeout <= 0 {
		o.WatchIdleTimeout = DefaultWatchIdleTimeout
	}
	return o
}

// APIError is a launcher's refusal: Status is the HTTP status, Field the request field at fault.
type APIError struct {
	Status int
	Field  string
	Msg    string
}

func (e *APIError) Error() string { return fmt.Sprintf("launcher: %d: %s", e.Status, e.Msg) }

// TimeoutError is a launcher that did not answer a call (or, on a watch, sent nothing) in time.
type TimeoutError struct {
	Socket string
	Call   string
	After  time.Duration
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("the launcher at %s did not answer %s within %s", e.Socket, e.Call, e.After)
}

// ReplyTooLargeError is a launcher reply larger than the client accepts.
type ReplyTooLargeError struct {
	Socket string
	Call   string
	Limit  int64
}

func (e *ReplyTooLargeError) Error() string {
	return fmt.Sprintf("the launcher at %s answered %s with more than %d bytes", e.Socket, e.Call, e.Limit)
}

// NewClient returns a client with the production limits for the launcher listening on socket.
func NewClient(socket string) *Client {
	return NewClientWithOptions(socket, ClientOptions{})
}

// NewClientWithOptions returns a client with opts' limits for the launcher listening on socket.
func NewClientWithOptions(socket string, opts ClientOptions) *Client {
	return &Client{socket: socket, opts: opts.withDefaults()}
}

// Close releases the client's resources: none are held between calls.
func (c *Client) Close() {}

// send makes one request on a connection of its own; the reply's Body closes it.
func (c *Client) send(ctx context.Context, call, method, path string, body []byte) (*wire.Response, error) {
	conn, err := unixsock.Dial(ctx, c.socket)
	if err != nil {
		return nil, fmt.Errorf("launcher %s: %w", call, err)
	}
	// A node agent holds a status stream per instance: a status line is read in a few reads
	// anyway.
	resp, err := wire.Do(ctx, conn, method, path, body, wire.ClientOptions{MaxHeadBytes: maxResponseHeaderBytes, BufferSize: connBuffer})
	if err != nil {
		return nil, fmt.Errorf("launcher %s: %w", call, err)
	}
	return resp, nil
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	return c.doWithin(ctx, c.opts.CallTimeout, method, path, body, out)
}

// doWithin makes one call, bounded by timeout (none when 0: the caller's ctx bounds it) and
// opts.MaxReplyBytes.
func (c *Client) doWithin(ctx context.Context, timeout time.Duration, method, path string, body, out any) error {
	call := method + " " + path
	var data []byte
	if body != nil {
		var err error
		if data, err = json.Marshal(body); err != nil {
			return err
		}
	}
	callCtx, cancel := ctx, context.CancelFunc(func() {})
	if timeout > 0 {
		callCtx, cancel = context.WithTimeout(ctx, timeout)
	}
	defer cancel()
	err := c.roundTrip(callCtx, call, path, method, data, out)
	if err != nil && timeout > 0 && ctx.Err() == nil && errors.Is(callCtx.Err(), context.DeadlineExceeded) {
		return &TimeoutError{Socket: c.socket, Call: call, After: timeout}
	}
	return err
}

func (c *Client) roundTrip(ctx context.Context, call, path, method string, body []byte, out any) error {
	resp, err := c.send(ctx, call, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := c.readReply(resp.Body, call)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return apiError(resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("launcher %s: decode reply: %w", call, err)
	}
	return nil
}

// readReply reads a whole reply body, refusing one over opts.MaxReplyBytes.
func (c *Client) readReply(body io.Reader, call string) ([]byte, error) {
	limit := c.opts.MaxReplyBytes
	data, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("launcher %s: read reply: %w", call, err)
	}
	if int64(len(data)) > limit {
		return nil, &ReplyTooLargeError{Socket: c.socket, Call: call, Limit: limit}
	}
	return data, nil
}

// apiError reads a refusal's ErrorResponse.
func apiError(status int, body []byte) error {
	var er protocol.ErrorResponse
	_ = json.Unmarshal(body, &er)
	return &APIError{Status: status, Field: er.Field, Msg: er.Error}
}

// Info asks which protocol versions the launcher speaks. A launcher from before the handshake
// answers 404: it speaks machine.ProtocolLegacy.
func (c *Client) Info(ctx context.Context) (machine.Info, error) {
	var out machine.Info
	err := c.do(ctx, "GET", "/v1/info", nil, &out)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Status == wire.StatusNotFound {
		return machine.Info{Protocols: []string{machine.ProtocolLegacy}}, nil
	}
	return out, err
}

// Sync starts the VM; it answers once QEMU started (within opts.SyncTimeout).
func (c *Client) Sync(ctx context.Context, req *protocol.SyncRequest) (protocol.Status, error) {
	var st protocol.Status
	return st, c.doWithin(ctx, c.opts.SyncTimeout, "POST", "/v1/sync", req, &st)
}

// Status returns the launcher's status.
func (c *Client) Status(ctx context.Context) (protocol.Status, error) {
	var st protocol.Status
	return st, c.do(ctx, "GET", "/v1/status", nil, &st)
}

// Watch calls fn with the status now and after every change until ctx ends, fn returns false or
// the launcher goes away. A stream silent for opts.WatchIdleTimeout (the launcher repeats its
// status every WatchHeartbeat) ends with a *TimeoutError, a status over opts.MaxReplyBytes with a
// *ReplyTooLargeError; a repeated status is not passed to fn again.
func (c *Client) Watch(ctx context.Context, fn func(protocol.Status) bool) error {
	const call = "GET /v1/status?watch=true"
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	idle := newIdleTimer(c.opts.WatchIdleTimeout, cancel)
	defer idle.stop()
	err := c.watch(ctx, call, idle, fn)
	if idle.fired() {
		return &TimeoutError{Socket: c.socket, Call: call, After: c.opts.WatchIdleTimeout}
	}
	return err
}

func (c *Client) watch(ctx context.Context, call string, idle *idleTimer, fn func(protocol.Status) bool) error {
	resp, err := c.send(ctx, call, "GET", "/v1/status?watch=true", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		data, err := c.readReply(resp.Body, call)
		if err != nil {
			return err
		}
		return apiError(resp.StatusCode, data)
	}
	sc := bufio.NewScanner(resp.Body)
	// The scanner's limit is the larger of its buffer's capacity and max. A status is a few KiB
	// and the buffer grows for a larger one: the node agent holds one stream per instance, and a
	// 64 KiB start made most of its memory per instance.
	sc.Buffer(make([]byte, 0, min(watchBuffer, c.opts.MaxReplyBytes)), int(c.opts.MaxReplyBytes))
	var last []byte
	for sc.Scan() {
		idle.reset()
		if bytes.Equal(sc.Bytes(), last) {
			continue // a heartbeat
		}
		last = append(last[:0], sc.Bytes()...)
		var st protocol.Status
		if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
			return fmt.Errorf("launcher %s: %w", call, err)
		}
		if !fn(st) {
			return nil
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		return &ReplyTooLargeError{Socket: c.socket, Call: call, Limit: c.opts.MaxReplyBytes}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("launcher %s: %w", call, err)
	}
	return ctx.Err()
}

// idleTimer calls cancel once it was not reset for d.
type idleTimer struct {
	d       time.Duration
	t       *time.Timer
	expired atomic.Bool
}

func newIdleTimer(d time.Duration, cancel context.CancelFunc) *idleTimer {
	it := &idleTimer{d: d}
	it.t = time.AfterFunc(d, func() {
		it.expired.Store(true)
		cancel()
	})
	return it
}

func (it *idleTimer) reset()      { it.t.Reset(it.d) }
func (it *idleTimer) stop()       { it.t.Stop() }
func (it *idleTimer) fired() bool { return it.expired.Load() }

// Pause stops the guest's vCPUs.
func (c *Client) Pause(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/pause", nil, nil)
}

// Resume restarts them.
func (c *Client) Resume(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/resume", nil, nil)
}

// Reset resets the guest.
func (c *Client) Reset(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/reset", nil, nil)
}

// SoftReboot presses Ctrl+Alt+Del on the guest's keyboard, for the guest to reboot itself; QEMU
// and the launcher's phase stay as they are. A paused guest is refused with a 409 *APIError.
func (c *Client) SoftReboot(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/softreboot", nil, nil)
}

// Screenshot returns the guest's display as a PNG stream, which the caller must close and bound
// (in time and size): a display's PNG can be larger than any other reply. A VM
// without a graphics device is a 400 *APIError with Field machine.graphics.
func (c *Client) Screenshot(ctx context.Context) (io.ReadCloser, error) {
	resp, err := c.send(ctx, "GET /v1/screenshot", "GET", "/v1/screenshot", nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		data, err := c.readReply(resp.Body, "GET /v1/screenshot")
		if err != nil {
			return nil, err
		}
		return nil, apiError(resp.StatusCode, data)
	}
	return resp.Body, nil
}

// Kill ends QEMU at once.
func (c *Client) Kill(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/kill", nil, nil)
}

// Shutdown stops the guest gracefully and returns how QEMU ended. It lasts as long as the guest
// takes, up to the grace period: ctx bounds it, not opts.CallTimeout.
func (c *Client) Shutdown(ctx context.Context, gracePeriodSeconds *int64) (protocol.Exit, error) {
	var exit protocol.Exit
	return exit, c.doWithin(ctx, 0, "POST", "/v1/shutdown", protocol.ShutdownRequest{GracePeriodSeconds: gracePeriodSeconds}, &exit)
}

// HotplugDisk attaches a disk, its image resolved by the launcher as at start; the reply is the
// disk as attached (with its root port). A refusal is an *APIError whose Field names the request
// field at fault (e.g. "source.hostFile.path" for a missing image, status 400).
func (c *Client) HotplugDisk(ctx context.Context, d machine.Disk) (machine.Disk, error) {
	var out machine.Disk
	return out, c.do(ctx, "POST", "/v1/disks", d, &out)
}

// UnplugDisk detaches a hot-plugged disk once the guest has let it go, deleting an image the
// launcher created for it. A name that is not hot-plugged is a 400 with Field "name".
func (c *Client) UnplugDisk(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/disks/"+url.PathEscape(name), nil, nil)
}

// HotplugNIC attaches a NIC.
func (c *Client) HotplugNIC(ctx context.Context, n machine.NIC) error {
	return c.do(ctx, "POST", "/v1/nics", n, nil)
}

// UnplugNIC detaches a hotplugged NIC.
func (c *Client) UnplugNIC(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/nics/"+url.PathEscape(name), nil, nil)
}

// SetSockets hot-plugs vCPUs until the guest has sockets sockets.
func (c *Client) SetSockets(ctx context.Context, sockets uint32) error {
	return c.do(ctx, "PUT", "/v1/cpu", protocol.CPURequest{Sockets: sockets}, nil)
}

// SetGuestMemory asks the guest to have guestMiB of memory (memory hotplug).
func (c *Client) SetGuestMemory(ctx context.Context, guestMiB int64) error {
	return c.do(ctx, "PUT", "/v1/memory", protocol.MemoryRequest{GuestMiB: guestMiB}, nil)
}

// PrepareMigrationTarget makes an incoming launcher listen and returns the URI for the source.
func (c *Client) PrepareMigrationTarget(ctx context.Context, req protocol.MigrationTarget) (string, error) {
	var out protocol.MigrationTargetReply
	err := c.do(ctx, "POST", "/v1/migration/target", req, &out)
	return out.URI, err
}

// MigrateSource starts an outgoing migration.
func (c *Client) MigrateSource(ctx context.Context, req protocol.MigrationSource) error {
	return c.do(ctx, "POST", "/v1/migration/source", req, nil)
}

// CancelMigration cancels an outgoing migration.
func (c *Client) CancelMigration(ctx context.Context) error {
	return c.do(ctx, "DELETE", "/v1/migration", nil, nil)
}

// RunMigrated tells a target holding a handed-over guest to take it over, and returns its status.
func (c *Client) RunMigrated(ctx context.Context, req protocol.MigrationRun) (protocol.Status, error) {
	var st protocol.Status
	return st, c.do(ctx, "POST", "/v1/migration/run", req, &st)
}

// FinishMigration tells a source holding a handed-over guest that the target runs it: it quits.
func (c *Client) FinishMigration(ctx context.Context) error {
	return c.do(ctx, "POST", "/v1/migration/finish", nil, nil)
}

// ReclaimMigration tells a source holding a handed-over guest that the target failed before it
// ran it: the guest runs on here. It returns the launcher's status.
func (c *Client) ReclaimMigration(ctx context.Context, reason string) (protocol.Status, error) {
	var st protocol.Status
	return st, c.do(ctx, "POST", "/v1/migration/reclaim", protocol.MigrationReclaim{Reason: reason}, &st)
}

// RecoverMigration makes a target whose post-copy migration lost its link listen for the source
// again and returns the URI the source must resume to.
func (c *Client) RecoverMigration(ctx context.Context, req protocol.MigrationRecover) (string, error) {
	var out protocol.MigrationTargetReply
	err := c.do(ctx, "POST", "/v1/migration/recover", req, &out)
	return out.URI, err
}

// ResumeMigration has a source whose post-copy migration lost its link send the rest to a target
// that listens again (RecoverMigration).
func (c *Client) ResumeMigration(ctx context.Context, req protocol.MigrationResume) error {
	return c.do(ctx, "POST", "/v1/migration/resume", req, nil)
}

// GuestInfo asks the guest agent for its version, the guest's OS, hostname, users and
// filesystems. A 409 *APIError while no agent is connected.
func (c *Client) GuestInfo(ctx context.Context) (protocol.GuestAgentInfo, error) {
	var out protocol.GuestAgentInfo
	err := c.doWithin(ctx, guestCallTimeout, "GET", "/v1/guest/info", nil, &out)
	return out, err
}

// GuestPing asks the launcher to ping the guest agent, within timeout (at most guestCallTimeout).
func (c *Client) GuestPing(ctx context.Context, timeout time.Duration) error {
	var out struct{}
	return c.doWithin(ctx, min(timeout, guestCallTimeout), "GET", "/v1/guest/ping", nil, &out)
}

// GuestExecProbe asks the launcher to run an exec probe's command in the guest; it waits up to the
// probe's timeout (at most MaxExecProbeTimeout) and a little more for the launcher's answer.
func (c *Client) GuestExecProbe(ctx context.Context, req protocol.GuestExecProbe) (protocol.GuestExecResult, error) {
	var out protocol.GuestExecResult
	timeout := min(time.Duration(req.TimeoutSeconds)*time.Second, MaxExecProbeTimeout) + time.Second
	err := c.doWithin(ctx, timeout, "POST", "/v1/guest/exec-probe", req, &out)
	return out, err
}

// GuestUsers lists the users logged in to the guest.
func (c *Client) GuestUsers(ctx context.Context) ([]protocol.GuestUser, error) {
	var out []protocol.GuestUser
	err := c.doWithin(ctx, guestCallTimeout, "GET", "/v1/guest/users", nil, &out)
	return out, err
}

// GuestFilesystems lists the guest's mounted filesystems.
func (c *Client) GuestFilesystems(ctx context.Context) ([]protocol.GuestFilesystem, error) {
	var out []protocol.GuestFilesystem
	err := c.doWithin(ctx, guestCallTimeout, "GET", "/v1/guest/filesystems", nil, &out)
	return out, err
}

// FSFreeze freezes the guest's filesystems (op "freeze"), thaws them ("thaw") or reports their
// state ("status").
func (c *Client) FSFreeze(ctx context.Context, op string) (protocol.FSFreeze, error) {
	var out protocol.FSFreeze
	method, path := "POST", "/v1/guest/fs"+op
	switch op {
	case "status":
		method, path = "GET", "/v1/guest/fsfreeze"
	case "freeze", "thaw":
	default:
		return out, fmt.Errorf("unknown freeze operation %q: want freeze, thaw or status", op)
	}
	err := c.doWithin(ctx, time.Minute+5*time.Second, method, path, nil, &out)
	return out, err
}

// guestCallTimeout covers the launcher's own bound on a guest agent request (a few agent calls of
// agentCallTimeout each share it).
const guestCallTimeout = agentCallTimeout + 5*time.Second
