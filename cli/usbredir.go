package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// usbDevice is what usbredirect takes as --device: vendor:product in hex, or busnum-devnum.
var usbDevice = regexp.MustCompile(`^([0-9a-fA-F]{1,4}:[0-9a-fA-F]{1,4}|[0-9]{1,3}-[0-9]{1,3})$`)

// usbConnectWait bounds how long usbredirect may take to open the device and connect.
const usbConnectWait = 30 * time.Second

func newUSBRedir(e *env) *cobra.Command {
	var usbredirect string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "usbredir VENDOR:PRODUCT|BUS-DEVICE VMI",
		Short: "Redirect a USB device of this machine into a virtual machine instance",
		Long: "Open a websocket to GET .../virtualmachineinstances/VMI/usbredir (the VMI needs\n" +
			"spec.domain.devices.clientPassthrough; it has four slots), listen on a free port of\n" +
			"127.0.0.1 and run usbredirect (Debian's usbredirect package) to export the device to it,\n" +
			"as virtctl usbredir does. The device stays in the guest until usbredirect ends, the VMI\n" +
			"goes, or this command is interrupted (Ctrl+C). usbredirect needs to open the device:\n" +
			"run as a user who may (root, or a udev rule).",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.usbRedir(cmd.Context(), cmd, args[0], args[1], usbredirect, timeout)
		},
	}
	cmd.Flags().StringVar(&usbredirect, "usbredirect", "usbredirect", "the usbredirect program to run")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the VMI to run")
	return cmd
}

func (e *env) usbRedir(ctx context.Context, cmd *cobra.Command, device, name, usbredirect string, timeout time.Duration) error {
	if !usbDevice.MatchString(device) {
		return fmt.Errorf("device %q: want VENDOR:PRODUCT in hex (as lsusb shows it, 0951:1666) or BUS-DEVICE (1-4)", device)
	}
	prog, err := exec.LookPath(usbredirect)
	if err != nil {
		return fmt.Errorf("--usbredirect %s: %w (install Debian's usbredirect package)", usbredirect, err)
	}
	c, err := e.connect()
	if err != nil {
		return err
	}
	// The slot first: a VMI without clientPassthrough, or with every slot taken, is refused
	// before the device is touched.
	conn, err := dialVMI(ctx, c, streamDial{name: name, sub: subv1.USBRedir, proto: subv1.SubprotocolPlain,
		timeout: timeout, progress: cmd.ErrOrStderr(), eol: "\n"})
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("listen for usbredirect: %w", err)
	}
	defer ln.Close()
	run := exec.CommandContext(ctx, prog, "--device", device, "--to", ln.Addr().String())
	var out strings.Builder
	run.Stdout, run.Stderr = &out, &out
	if err := run.Start(); err != nil {
		return fmt.Errorf("start %s: %w", prog, err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = run.Wait(); close(exited) }()
	tcp, err := acceptUSBRedirect(ln, exited)
	if err != nil {
		_ = run.Process.Kill()
		<-exited
		if waitErr != nil {
			err = fmt.Errorf("%w (%v)", err, waitErr)
		}
		return fmt.Errorf("usbredirect --device %s: %w", device, withOutput(err, out.String()))
	}
	fmt.Fprintf(cmd.OutOrStdout(), "USB device %s redirected to VMI %s; Ctrl+C to take it back\n", device, name)
	if pipeWebsocket(ctx, conn, tcp) == localEnded {
		// usbredirect ended the redirection (the device went away, or it failed): its exit is
		// on its way, and says which.
		<-exited
		if waitErr != nil && ctx.Err() == nil {
			return fmt.Errorf("usbredirect --device %s: %w", device, withOutput(waitErr, out.String()))
		}
		return nil
	}
	if ctx.Err() != nil {
		// Interrupted: exec.CommandContext kills usbredirect.
		<-exited
		return nil
	}
	// The VMI's side ended (the guest stopped or moved): usbredirect gives the device back.
	_ = run.Process.Signal(os.Interrupt)
	<-exited
	fmt.Fprintf(cmd.ErrOrStderr(), "VMI %s closed the USB redirection of %s\n", name, device)
	return nil
}

// acceptUSBRedirect waits for usbredirect's connection; usbredirect ending first (exited closed)
// is an error, as it is when it exits with status 0 for a device it could not find.
func acceptUSBRedirect(ln net.Listener, exited <-chan struct{}) (net.Conn, error) {
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	select {
	case c := <-accepted:
		return c, nil
	case <-exited:
		return nil, errors.New("exited without connecting: is the device plugged in, and may this user open it?")
	case <-time.After(usbConnectWait):
		return nil, fmt.Errorf("did not connect within %s", usbConnectWait)
	}
}

// withOutput adds what a program printed to its error.
func withOutput(err error, out string) error {
	if out = strings.TrimSpace(out); out != "" {
		return fmt.Errorf("%w (it printed: %s)", err, out)
	}
	return err
}

// pipeEnd says which side of a pipeWebsocket closed first.
type pipeEnd int

const (
	localEnded pipeEnd = iota
	remoteEnded
)

// pipeWebsocket carries bytes between a stream's websocket and a local connection until either
// side closes, then closes both, and says which side closed first.
func pipeWebsocket(ctx context.Context, conn *websocket.Conn, local io.ReadWriteCloser) pipeEnd {
	defer local.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ws := websocket.NetConn(ctx, conn, websocket.MessageBinary)
	defer ws.Close()
	done := make(chan pipeEnd, 2)
	go func() { _, _ = io.Copy(ws, local); done <- localEnded }()
	go func() { _, _ = io.Copy(local, ws); done <- remoteEnded }()
	return <-done
}
