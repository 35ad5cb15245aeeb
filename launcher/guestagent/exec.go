package guestagent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// MaxExecOutput is how much of a guest command's stdout and of its stderr ExecStatus keeps, each
// (the kubelet keeps 10 KiB of an exec probe's output too). qemu-ga captures up to 16 MiB a
// stream; a reply over MaxReplyBytes breaks the client like any oversized reply.
const MaxExecOutput = 10 << 10

// ExecStatus is guest-exec-status: whether the command has exited and how.
type ExecStatus struct {
	Exited bool
	// ExitCode is the exit status when the command exited normally; Signal the signal that ended
	// it otherwise (0 when none).
	ExitCode, Signal int
	// Stdout and Stderr are the start of the captured output, at most MaxExecOutput bytes each,
	// and whether more was dropped (here or by qemu-ga).
	Stdout, Stderr                   []byte
	StdoutTruncated, StderrTruncated bool
}

// Exec runs guest-exec: starts path with args in the guest, its output captured, and returns the
// guest's pid for ExecStatus. The agent searches PATH for path and does not wait for the command.
func (c *Client) Exec(ctx context.Context, path string, args []string) (int, error) {
	a := map[string]any{"path": path, "capture-output": true}
	if len(args) > 0 {
		a["arg"] = args
	}
	raw, err := c.call(ctx, "guest-exec", a)
	if err != nil {
		return 0, err
	}
	var r struct {
		PID *int `json:"pid"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.PID == nil {
		return 0, fmt.Errorf("guest-exec: a reply without a pid: %.64s", raw)
	}
	return *r.PID, nil
}

// ExecStatus runs guest-exec-status for pid. Once it reports the command exited, the agent forgets
// the command: a second call for the same pid fails.
func (c *Client) ExecStatus(ctx context.Context, pid int) (ExecStatus, error) {
	raw, err := c.call(ctx, "guest-exec-status", map[string]any{"pid": pid})
	if err != nil {
		return ExecStatus{}, err
	}
	return DecodeExecStatus(raw)
}

// DecodeExecStatus decodes guest-exec-status' return value, bounded: of each base64 stream only
// what makes MaxExecOutput bytes is decoded.
func DecodeExecStatus(raw json.RawMessage) (ExecStatus, error) {
	var r struct {
		Exited       bool   `json:"exited"`
		ExitCode     int    `json:"exitcode"`
		Signal       int    `json:"signal"`
		OutData      string `json:"out-data"`
		ErrData      string `json:"err-data"`
		OutTruncated bool   `json:"out-truncated"`
		ErrTruncated bool   `json:"err-truncated"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return ExecStatus{}, fmt.Errorf("guest-exec-status: %w", err)
	}
	st := ExecStatus{Exited: r.Exited, ExitCode: r.ExitCode, Signal: r.Signal}
	var err error
	if st.Stdout, st.StdoutTruncated, err = decodeOutput(r.OutData); err != nil {
		return ExecStatus{}, fmt.Errorf("guest-exec-status: out-data: %w", err)
	}
	if st.Stderr, st.StderrTruncated, err = decodeOutput(r.ErrData); err != nil {
		return ExecStatus{}, fmt.Errorf("guest-exec-status: err-data: %w", err)
	}
	st.StdoutTruncated = st.StdoutTruncated || r.OutTruncated
	st.StderrTruncated = st.StderrTruncated || r.ErrTruncated
	return st, nil
}

// decodeOutput decodes at most MaxExecOutput bytes of standard base64 s, and whether s held more.
func decodeOutput(s string) ([]byte, bool, error) {
	const maxEncoded = (MaxExecOutput + 2) / 3 * 4
	cut := len(s) > maxEncoded
	if cut {
		s = s[:maxEncoded]
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, false, errors.New("not base64")
	}
	if len(b) > MaxExecOutput {
		b, cut = b[:MaxExecOutput], true
	}
	return b, cut, nil
}
