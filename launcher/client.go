package launcher

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"github.com/qvirt/qvirt/machine"
)

// Client speaks the command protocol to one launcher over its unix socket. It is what the node
// agent uses; safe for concurrent use.
type Client struct {
	http *http.Client
}

// APIError is a launcher's refusal: Status is the HTTP status, Field the request field at fault.
type APIError struct {
	Status int
	Field  string
	Msg    string
}

func (e *APIError) Error() string { return fmt.Sprintf("launcher: %d: %s", e.Status, e.Msg) }

// NewClient returns a client for the launcher listening on socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableCompression: true,
	}
	return &Client{http: &http.Client{Transport: tr}}
}

// Close releases idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://launcher"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("launcher %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return apiError(resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("launcher %s %s: decode reply: %w", method, path, err)
	}
	return nil
}

// apiError reads a refusal's ErrorResponse.
func apiError(resp *http.Response) error {
	var er ErrorResponse
	_ = json.NewDecoder(resp.Body).Decode(&er)
	return &APIError{Status: resp.StatusCode, Field: er.Field, Msg: er.Error}
}

// Info asks which protocol versions the launcher speaks. A launcher from before the handshake
// answers 404: it speaks machine.ProtocolLegacy.
func (c *Client) Info(ctx context.Context) (machine.Info, error) {
	var out machine.Info
	err := c.do(ctx, http.MethodGet, "/v1/info", nil, &out)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
		return machine.Info{Protocols: []string{machine.ProtocolLegacy}}, nil
	}
	return out, err
}

// Sync starts the VM.
func (c *Client) Sync(ctx context.Context, req *SyncRequest) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodPost, "/v1/sync", req, &st)
}

// Status returns the launcher's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	return st, c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
}

// Watch calls fn with the status now and after every change until ctx ends, fn returns false or
// the launcher goes away.
func (c *Client) Watch(ctx context.Context, fn func(Status) bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://launcher/v1/status?"+url.Values{"watch": {"true"}}.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("launcher watch: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var st Status
		if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
			return fmt.Errorf("launcher watch: %w", err)
		}
		if !fn(st) {
			return nil
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("launcher watch: %w", err)
	}
	return ctx.Err()
}

// Pause stops the guest's vCPUs.
func (c *Client) Pause(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/pause", nil, nil)
}

// Resume restarts them.
func (c *Client) Resume(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/resume", nil, nil)
}

// Reset resets the guest.
func (c *Client) Reset(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/reset", nil, nil)
}

// SoftReboot presses Ctrl+Alt+Del on the guest's keyboard, for the guest to reboot itself; QEMU
// and the launcher's phase stay as they are. A paused guest is refused with a 409 *APIError.
func (c *Client) SoftReboot(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/softreboot", nil, nil)
}

// Screenshot returns the guest's display as a PNG stream, which the caller must close. A VM
// without a graphics device is a 400 *APIError with Field machine.graphics.
func (c *Client) Screenshot(ctx context.Context) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://launcher/v1/screenshot", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("launcher GET /v1/screenshot: %w", err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, apiError(resp)
	}
	return resp.Body, nil
}

// Kill ends QEMU at once.
func (c *Client) Kill(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/kill", nil, nil)
}

// Shutdown stops the guest gracefully and returns how QEMU ended.
func (c *Client) Shutdown(ctx context.Context, gracePeriodSeconds *int64) (Exit, error) {
	var exit Exit
	return exit, c.do(ctx, http.MethodPost, "/v1/shutdown", ShutdownRequest{GracePeriodSeconds: gracePeriodSeconds}, &exit)
}

// HotplugDisk attaches a disk, its image resolved by the launcher as at start; the reply is the
// disk as attached (with its root port). A refusal is an *APIError whose Field names the request
// field at fault (e.g. "source.hostFile.path" for a missing image, status 400).
func (c *Client) HotplugDisk(ctx context.Context, d machine.Disk) (machine.Disk, error) {
	var out machine.Disk
	return out, c.do(ctx, http.MethodPost, "/v1/disks", d, &out)
}

// UnplugDisk detaches a hot-plugged disk once the guest has let it go, deleting an image the
// launcher created for it. A name that is not hot-plugged is a 400 with Field "name".
func (c *Client) UnplugDisk(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/disks/"+url.PathEscape(name), nil, nil)
}

// HotplugNIC attaches a NIC.
func (c *Client) HotplugNIC(ctx context.Context, n machine.NIC) error {
	return c.do(ctx, http.MethodPost, "/v1/nics", n, nil)
}

// UnplugNIC detaches a hotplugged NIC.
func (c *Client) UnplugNIC(ctx context.Context, name string) error {
	return c.do(ctx, http.MethodDelete, "/v1/nics/"+url.PathEscape(name), nil, nil)
}

// PrepareMigrationTarget makes an incoming launcher listen and returns the URI for the source.
func (c *Client) PrepareMigrationTarget(ctx context.Context, listen string) (string, error) {
	var out MigrationTargetReply
	err := c.do(ctx, http.MethodPost, "/v1/migration/target", MigrationTarget{Listen: listen}, &out)
	return out.URI, err
}

// MigrateSource starts an outgoing migration.
func (c *Client) MigrateSource(ctx context.Context, req MigrationSource) error {
	return c.do(ctx, http.MethodPost, "/v1/migration/source", req, nil)
}

// CancelMigration cancels an outgoing migration.
func (c *Client) CancelMigration(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/v1/migration", nil, nil)
}
