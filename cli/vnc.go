package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/cli/kube"
)

// pngSignature starts every PNG file.
var pngSignature = []byte("\x89PNG\r\n\x1a\n")

func newVNC(e *env) *cobra.Command {
	var port int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "vnc VMI",
		Short: "Open a local port for a VNC viewer to the display of a virtual machine instance",
		Long: "Listen on 127.0.0.1:--port (0 picks a free port) and print\n" +
			"\"VNC for VMI NAME listening on 127.0.0.1:PORT\"; point any VNC viewer at that address.\n" +
			"Each TCP connection gets its own websocket to GET .../virtualmachineinstances/VMI/vnc\n" +
			"(subprotocol plain.qvirt.io) carrying RFB both ways. Runs until interrupted (Ctrl+C).\n" +
			"A VMI that is still starting is waited for up to --timeout, per connection.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.vnc(cmd.Context(), cmd, args[0], port, timeout)
		},
	}
	cmd.Flags().IntVar(&port, "port", 0, "local port to listen on, 0 for any free port")
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the VMI to run")
	cmd.AddCommand(newScreenshot(e))
	return cmd
}

func (e *env) vnc(ctx context.Context, cmd *cobra.Command, name string, port int, timeout time.Duration) error {
	if port < 0 || port > 65535 {
		return fmt.Errorf("--port %d: want 0 to 65535", port)
	}
	c, err := e.connect()
	if err != nil {
		return err
	}
	if _, err := vmiNotReady(ctx, c, name); err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("listen for VNC viewers on --port %d: %w", port, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "VNC for VMI %s listening on %s\n", name, ln.Addr())
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		tcp, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept VNC viewer: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := proxyVNC(ctx, c, name, tcp, timeout, cmd.ErrOrStderr()); err != nil {
				fmt.Fprintln(cmd.ErrOrStderr(), FormatError(err))
			}
		}()
	}
}

// proxyVNC carries one viewer's TCP connection over a new websocket until either side closes.
func proxyVNC(ctx context.Context, c *kube.Client, name string, tcp net.Conn, timeout time.Duration, progress io.Writer) error {
	defer tcp.Close()
	conn, err := dialVMI(ctx, c, streamDial{name: name, sub: subv1.VNC, proto: subv1.SubprotocolPlain,
		timeout: timeout, retryConflict: true, progress: progress, eol: "\n"})
	if err != nil {
		return err
	}
	pipeWebsocket(ctx, conn, tcp)
	return nil
}

func newScreenshot(e *env) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "screenshot VMI -o FILE.png",
		Short: "Save the display of a virtual machine instance as a PNG file",
		Long: "GET .../virtualmachineinstances/VMI/screenshot and write the PNG to -o FILE (\"-\" for stdout).\n" +
			"The answer must be a PNG (its signature and header are checked) or nothing is written.\n" +
			"Prints \"wrote FILE (WIDTHxHEIGHT, N bytes)\" on stderr.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("-o/--output FILE.png is required")
			}
			c, err := e.connect()
			if err != nil {
				return err
			}
			b, err := c.Do(cmd.Context(), http.MethodGet, subv1.Path(c.Namespace, subv1.VirtualMachineInstances, args[0], subv1.Screenshot), nil)
			if err != nil {
				return err
			}
			w, h, err := checkPNG(b)
			if err != nil {
				return fmt.Errorf("screenshot of VMI %s: %w", args[0], err)
			}
			if err := writeOutput(cmd.OutOrStdout(), out, b); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%dx%d, %d bytes)\n", out, w, h, len(b))
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "PNG file to write, - for stdout")
	return cmd
}

// checkPNG verifies b is a PNG and returns its size.
func checkPNG(b []byte) (int, int, error) {
	if !bytes.HasPrefix(b, pngSignature) {
		n := min(len(b), 16)
		return 0, 0, fmt.Errorf("the server's answer is not a PNG image (starts with %q)", b[:n])
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(b))
	if err != nil {
		return 0, 0, fmt.Errorf("the server's PNG is damaged: %w", err)
	}
	return cfg.Width, cfg.Height, nil
}

func writeOutput(stdout io.Writer, path string, b []byte) error {
	if path == "-" {
		_, err := stdout.Write(b)
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write --output %s: %w", path, err)
	}
	return nil
}
