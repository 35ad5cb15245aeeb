package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

const (
	// escapeByte (Ctrl+]) ends a console session, as in telnet and virtctl.
	escapeByte = 0x1d
	// statusTakenOver is the close code of a console session replaced by a newer one.
	statusTakenOver websocket.StatusCode = 4001
)

// errTakenOver ends a console session that a newer one replaced.
var errTakenOver = errors.New("console taken over")

// eofQuiet is how long the console keeps printing after its stdin ended, once the guest is quiet.
var eofQuiet = time.Second

func newConsole(e *env) *cobra.Command {
	var timeout time.Duration
	var reconnect bool
	cmd := &cobra.Command{
		Use:   "console VMI",
		Short: "Connect to the serial console of a virtual machine instance",
		Long: "Attach this terminal to the serial console (ttyS0) of the instance VMI, through\n" +
			"GET .../virtualmachineinstances/VMI/console (websocket, subprotocol plain.qvirt.io).\n\n" +
			"Press Ctrl+] to leave. When stdin is a terminal it is put in raw mode (restored on exit);\n" +
			"otherwise stdin is forwarded as is: a 0x1d byte (Ctrl+]) leaves, and at end of input the\n" +
			"console keeps printing until the guest has been quiet for a second, then exits 0.\n\n" +
			"A VMI that is still starting is waited for (\"waiting for VMI NAME to run\" on stderr) up\n" +
			"to --timeout. One console session per VMI: opening one takes over the previous one, whose\n" +
			"client prints the reason and exits with status 1. When the guest stops the console closes\n" +
			"(exit 0); with --reconnect it waits for the instance to run again and reattaches.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.console(cmd.Context(), cmd, args[0], timeout, reconnect)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the VMI to run and its console to open")
	cmd.Flags().BoolVar(&reconnect, "reconnect", false, "after the guest stops or the connection drops, wait for the VMI and reattach")
	return cmd
}

// consoleIO is the terminal side of a session.
type consoleIO struct {
	in     io.Reader
	out    io.Writer
	errOut io.Writer
	eol    string
	// keys delivers stdin chunks; closed at end of input.
	keys chan []byte
}

func (e *env) console(ctx context.Context, cmd *cobra.Command, name string, timeout time.Duration, reconnect bool) error {
	c, err := e.connect()
	if err != nil {
		return err
	}
	tio := &consoleIO{in: cmd.InOrStdin(), out: cmd.OutOrStdout(), errOut: cmd.ErrOrStderr(), eol: "\n"}
	if f, ok := tio.in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		old, err := term.MakeRaw(int(f.Fd()))
		if err != nil {
			return fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		defer term.Restore(int(f.Fd()), old)
		tio.eol = "\r\n"
	}
	tio.keys = readChunks(tio.in)
	for {
		conn, err := dialVMI(ctx, c, streamDial{name: name, sub: subv1.Console, proto: subv1.SubprotocolPlain,
			timeout: timeout, retryConflict: true, progress: tio.errOut, eol: tio.eol})
		if err != nil {
			return err
		}
		fmt.Fprintf(tio.errOut, "Successfully connected to %s console. Press Ctrl+] to exit.%s", name, tio.eol)
		end, err := tio.session(ctx, conn)
		if end != endServer || !reconnect || errors.Is(err, errTakenOver) {
			return err
		}
		fmt.Fprintf(tio.errOut, "console of %s closed; waiting to reconnect%s", name, tio.eol)
	}
}

// readChunks forwards what r yields; the channel closes at end of input or on a read error.
func readChunks(r io.Reader) chan []byte {
	ch := make(chan []byte, 16)
	go func() {
		defer close(ch)
		for {
			buf := make([]byte, 4096)
			n, err := r.Read(buf)
			if n > 0 {
				ch <- buf[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

type sessionEnd int

const (
	endUser   sessionEnd = iota // Ctrl+] or end of input
	endServer                   // the server closed the stream (VM stopped, handler going away, dropped)
)

// session copies bytes both ways until the user leaves or the server closes the stream.
func (t *consoleIO) session(ctx context.Context, conn *websocket.Conn) (sessionEnd, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	frames := make(chan []byte, 16)
	readErr := make(chan error, 1)
	go func() {
		for {
			_, b, err := conn.Read(ctx)
			if err != nil {
				readErr <- err
				return
			}
			frames <- b
		}
	}()
	keys := t.keys
	var quiet <-chan time.Time
	for {
		select {
		case b, ok := <-keys:
			if !ok {
				keys, quiet = nil, time.After(eofQuiet)
				continue
			}
			before, leave := b, false
			if i := bytes.IndexByte(b, escapeByte); i >= 0 {
				before, leave = b[:i], true
			}
			if len(before) > 0 {
				if err := conn.Write(ctx, websocket.MessageBinary, before); err != nil {
					return endServer, t.closed(err)
				}
			}
			if leave {
				conn.Close(websocket.StatusNormalClosure, "user left")
				fmt.Fprint(t.errOut, t.eol)
				return endUser, nil
			}
		case b := <-frames:
			if _, err := t.out.Write(b); err != nil {
				conn.Close(websocket.StatusNormalClosure, "output closed")
				return endUser, fmt.Errorf("write console output: %w", err)
			}
			if keys == nil {
				quiet = time.After(eofQuiet)
			}
		case <-quiet:
			conn.Close(websocket.StatusNormalClosure, "end of input")
			return endUser, nil
		case err := <-readErr:
			return endServer, t.closed(err)
		}
	}
}

// closed explains how the server ended the stream: nil for an ordinary close, an error for a
// takeover or a broken connection.
func (t *consoleIO) closed(err error) error {
	var ce websocket.CloseError
	if !errors.As(err, &ce) {
		return fmt.Errorf("console connection lost: %w", err)
	}
	switch ce.Code {
	case statusTakenOver:
		return withHint(fmt.Errorf("%w: %s", errTakenOver, ce.Reason),
			"Only one console session per VMI: the newest one wins. Run the console again to take it back.")
	case websocket.StatusNormalClosure:
		fmt.Fprintf(t.errOut, "%sconsole closed by the server: %s%s", t.eol, orDefault(ce.Reason, "the VM stopped"), t.eol)
		return nil
	case websocket.StatusGoingAway:
		fmt.Fprintf(t.errOut, "%sconsole closed: %s%s", t.eol, orDefault(ce.Reason, "the server is going away"), t.eol)
		return nil
	}
	return fmt.Errorf("console closed by the server with status %d: %s", ce.Code, ce.Reason)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
