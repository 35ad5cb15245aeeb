package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

func newQMP(e *env) *cobra.Command {
	var hmp string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "qmp VMI [-- COMMAND [JSON-ARGS]]",
		Short: "QEMU monitor (QMP) shell of a virtual machine instance",
		Long: "Talk QMP to the instance's QEMU through GET .../virtualmachineinstances/VMI/qmp (websocket,\n" +
			"subprotocol qmp.qvirt.io, one JSON message per text frame). qvirtctl negotiates\n" +
			"qmp_capabilities itself.\n\n" +
			"  qvirtctl qmp VMI -- COMMAND [JSON-ARGS]   one command; prints its \"return\" value as\n" +
			"                                            indented JSON on stdout. JSON-ARGS is one JSON\n" +
			"                                            object, checked before anything is sent. An\n" +
			"                                            error reply prints \"error: QMP CLASS: desc\" and\n" +
			"                                            exits 1.\n" +
			"  qvirtctl qmp VMI --hmp 'info status'      a human monitor command through\n" +
			"                                            human-monitor-command; prints its text.\n" +
			"  qvirtctl qmp VMI                          an interactive shell: lines are COMMAND [JSON-ARGS],\n" +
			"                                            'hmp TEXT', 'help' or 'quit'. On a terminal it has\n" +
			"                                            history (up/down) and Tab completion of command\n" +
			"                                            names from query-commands; events are shown as\n" +
			"                                            they arrive. Replies go to stdout as indented JSON.\n\n" +
			"Commands other than query-* and a few harmless ones need the qmp-write permission\n" +
			"(the qvirt.io:admin role); without it QEMU's shell answers with an error naming the command.\n" +
			"One QMP session per VMI at a time: a second one is refused with the user holding it.",
		Args: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() == 0 || len(args) == 0 {
				return errors.New("want the VMI name before --: qmp VMI -- COMMAND [JSON-ARGS]")
			}
			if cmd.ArgsLenAtDash() < 0 && len(args) > 1 {
				return fmt.Errorf("unexpected arguments %q: put the QMP command after --, as in: qmp %s -- %s", args[1:], args[0], args[1])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			var rest []string
			if cmd.ArgsLenAtDash() > 0 {
				rest = args[cmd.ArgsLenAtDash():]
				if cmd.ArgsLenAtDash() > 1 {
					return fmt.Errorf("unexpected arguments %q before --", args[1:cmd.ArgsLenAtDash()])
				}
			}
			return e.qmp(cmd.Context(), cmd, name, rest, hmp, timeout)
		},
	}
	cmd.Flags().StringVar(&hmp, "hmp", "", "run one human monitor command, such as 'info status', and print its output")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "how long to wait for the VMI to run")
	return cmd
}

func (e *env) qmp(ctx context.Context, cmd *cobra.Command, name string, rest []string, hmp string, timeout time.Duration) error {
	oneShot := len(rest) > 0 || cmd.Flags().Changed("hmp")
	var command string
	var args json.RawMessage
	if len(rest) > 0 {
		if hmp != "" {
			return errors.New("give either --hmp or a QMP command after --, not both")
		}
		var err error
		if command, args, err = parseQMPArgs(rest); err != nil {
			return err
		}
	} else if oneShot && strings.TrimSpace(hmp) == "" {
		return errors.New("--hmp needs a command, such as --hmp 'info status'")
	}
	c, err := e.connect()
	if err != nil {
		return err
	}
	conn, err := dialVMI(ctx, c, streamDial{name: name, sub: subv1.QMP, proto: subv1.SubprotocolQMP,
		timeout: timeout, progress: cmd.ErrOrStderr(), eol: "\n"})
	if err != nil {
		return err
	}
	q, err := newQMPClient(ctx, conn)
	if err != nil {
		return err
	}
	defer q.Close()
	switch {
	case hmp != "":
		return runHMP(ctx, q, hmp, cmd.OutOrStdout())
	case oneShot:
		return runQMP(ctx, q, command, args, cmd.OutOrStdout())
	}
	return e.qmpShell(ctx, cmd, q)
}

// runQMP executes one command and prints its return value.
func runQMP(ctx context.Context, q *qmpClient, command string, args json.RawMessage, out io.Writer) error {
	ret, err := q.Execute(ctx, command, args)
	if err != nil {
		return qmpFailure(command, err)
	}
	return printJSON(out, ret)
}

func runHMP(ctx context.Context, q *qmpClient, line string, out io.Writer) error {
	text, err := hmpText(ctx, q, line)
	if err != nil {
		return qmpFailure("human-monitor-command", err)
	}
	_, err = io.WriteString(out, text)
	return err
}

// hmpText runs a human monitor command line and returns its output with Unix line ends.
func hmpText(ctx context.Context, q *qmpClient, line string) (string, error) {
	args, _ := json.Marshal(map[string]string{"command-line": line})
	ret, err := q.Execute(ctx, "human-monitor-command", args)
	if err != nil {
		return "", err
	}
	var text string
	if err := json.Unmarshal(ret, &text); err != nil {
		return "", fmt.Errorf("human-monitor-command returned %s, not text", truncate(ret, 100))
	}
	return strings.ReplaceAll(text, "\r\n", "\n"), nil
}

// qmpFailure names the command of a QMP error reply and says what to do about a refusal.
func qmpFailure(command string, err error) error {
	var qe *qmpError
	if !errors.As(err, &qe) {
		return err
	}
	err = fmt.Errorf("QMP %s: %s: %s", command, qe.Class, qe.Desc)
	switch {
	case qe.Class == "CommandNotFound":
		return withHint(err, "List the commands this QEMU knows with: -- query-commands")
	case strings.Contains(qe.Desc, subv1.QMPWrite):
		return withHint(err, "Only query commands are open to every user; this one needs the qmp-write permission (role qvirt.io:admin).")
	}
	return err
}

// printJSON prints v indented, "{}" for an empty return.
func printJSON(out io.Writer, v json.RawMessage) error {
	if len(v) == 0 {
		v = json.RawMessage("{}")
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, v, "", "  "); err != nil {
		return fmt.Errorf("QEMU's reply is not JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err := out.Write(buf.Bytes())
	return err
}
