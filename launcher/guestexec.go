package launcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/qvirt/qvirt/launcher/guestagent"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// Bounds on an exec probe's request. The command comes from the instance's spec through the
// pod's own probe, but the command socket is reachable from inside the pod, so the launcher
// checks what it is asked to send to the guest agent.
const (
	maxExecArgs  = 64
	maxExecBytes = 16 << 10
	// MaxExecProbeTimeout bounds one exec probe's wait for its command.
	MaxExecProbeTimeout = 5 * time.Minute
	// maxExecOutput is how much of the command's output the result carries (stdout, then stderr).
	maxExecOutput = guestagent.MaxExecOutput
	// execPollFirst and execPollMax pace the guest-exec-status polls: quick for the usual
	// command that ends at once, slower for one that takes its time.
	execPollFirst = 20 * time.Millisecond
	execPollMax   = 500 * time.Millisecond
)

// ErrExecTimeout is an exec probe's command that had not exited within its timeout.
var ErrExecTimeout = errors.New("the command did not exit within the probe's timeout")

// GuestExecProbe runs an exec probe's command in the guest, as KubeVirt's virt-probe --command
// does: guest-exec with its output captured, then guest-exec-status until the command exited or
// the timeout passed. The guest agent connection is taken for each call only, so the agent
// watcher and other requests go on between polls. A migration target waiting for the guest
// passes without running anything, as GuestPing does: the guest still runs on the source, and a
// failing liveness probe would have the kubelet kill the target mid-migration.
func (l *Launcher) GuestExecProbe(ctx context.Context, req protocol.GuestExecProbe) (protocol.GuestExecResult, error) {
	if err := checkExecProbe(req); err != nil {
		return protocol.GuestExecResult{}, err
	}
	if l.currentPhase() == protocol.PhaseIncoming {
		return protocol.GuestExecResult{Skipped: "migration target: the guest still runs on the source"}, nil
	}
	c, err := l.agentClient()
	if err != nil {
		return protocol.GuestExecResult{}, err
	}
	timeout := min(time.Duration(req.TimeoutSeconds)*time.Second, MaxExecProbeTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pid, err := c.Exec(ctx, req.Command[0], req.Command[1:])
	if err != nil {
		return protocol.GuestExecResult{}, execErr(ctx, err)
	}
	wait := execPollFirst
	for {
		st, err := c.ExecStatus(ctx, pid)
		if err != nil {
			return protocol.GuestExecResult{}, execErr(ctx, err)
		}
		if st.Exited {
			return execResult(st), nil
		}
		select {
		case <-ctx.Done():
			return protocol.GuestExecResult{}, execErr(ctx, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, execPollMax)
	}
}

// execErr is ErrExecTimeout once the probe's time is up, err otherwise.
func execErr(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrExecTimeout
	}
	return err
}

func checkExecProbe(req protocol.GuestExecProbe) error {
	n := 0
	for _, a := range req.Command {
		n += len(a)
	}
	switch {
	case len(req.Command) == 0 || req.Command[0] == "":
		return machine.Invalid("command", req.Command, "the program to run in the guest is required")
	case len(req.Command) > maxExecArgs:
		return machine.Invalid("command", len(req.Command), fmt.Sprintf("at most %d words", maxExecArgs))
	case n > maxExecBytes:
		return machine.Invalid("command", n, fmt.Sprintf("at most %d bytes", maxExecBytes))
	case req.TimeoutSeconds < 1:
		return machine.Invalid("timeoutSeconds", req.TimeoutSeconds, "must be 1 or more")
	}
	return nil
}

// execResult is the probe's result from the guest's status: its output made valid UTF-8 and cut
// to maxExecOutput bytes, stdout first.
func execResult(st guestagent.ExecStatus) protocol.GuestExecResult {
	out := strings.ToValidUTF8(string(st.Stdout)+string(st.Stderr), "\uFFFD")
	if len(out) > maxExecOutput {
		out = out[:maxExecOutput]
		for !utf8.ValidString(out) {
			out = out[:len(out)-1]
		}
	}
	return protocol.GuestExecResult{ExitCode: st.ExitCode, Signal: st.Signal, Output: out}
}
