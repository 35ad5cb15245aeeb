// Command qvirt-launcher runs one virtual machine: it execs qemu-system-x86_64 and drives it over
// QMP. `qvirt-launcher run -f vmi.yaml` runs a VM in the foreground outside Kubernetes, with the
// serial console on the terminal, until the guest powers off.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr/funcr"
	"golang.org/x/term"

	"github.com/qvirt/qvirt/launcher"
)

const usage = `usage: qvirt-launcher run [flags] -f VMI.yaml

Runs one VM in the foreground with its serial console on stdin/stdout until the guest powers off.
Exit status 0 when the guest powered off cleanly, 1 with the reason otherwise, 2 for a refused spec.
SIGINT/SIGTERM, or Ctrl-] on a terminal, press the ACPI power button and quit QEMU after
terminationGracePeriodSeconds.
`

func main() {
	if len(os.Args) < 2 || os.Args[1] != "run" {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	os.Exit(run(os.Args[2:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	opts := launcher.RunOptions{}
	fs.StringVar(&opts.File, "f", "", "VirtualMachineInstance or VirtualMachine manifest (required)")
	fs.BoolVar(&opts.Emulation, "emulation", false, "allow software emulation (TCG) instead of KVM")
	fs.StringVar(&opts.RunDir, "run-dir", "", "directory for the sockets (default: a new temporary directory)")
	fs.StringVar(&opts.QEMU, "qemu", "qemu-system-x86_64", "QEMU binary")
	fs.IntVar(&opts.SpareRootPorts, "hotplug-ports", 4, "empty PCIe root ports for hotplug")
	noConsole := fs.Bool("no-console", false, "do not attach the serial console to stdin/stdout")
	verbose := fs.Int("v", 0, "log verbosity")
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if opts.File == "" {
		fmt.Fprintln(os.Stderr, "qvirt-launcher run: flag -f is required")
		return 2
	}
	opts.Log = funcr.NewJSON(func(obj string) { fmt.Fprintln(os.Stderr, obj) }, funcr.Options{Verbosity: *verbose})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if !*noConsole {
		stdin, restore := terminal(stop)
		defer restore()
		opts.Console = struct {
			io.Reader
			io.Writer
		}{stdin, os.Stdout}
	}
	exit, err := launcher.Run(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "qvirt-launcher: %v\n", err)
		return 2
	}
	fmt.Fprintf(os.Stderr, "qvirt-launcher: guest ended: %s %s\n", exit.Reason, exit.Detail)
	return launcher.ExitCode(exit)
}

// terminal puts a terminal stdin into raw mode, so keys reach the guest, and turns Ctrl-] into a
// graceful stop. A non-terminal stdin is passed through as it is.
func terminal(stop func()) (io.Reader, func()) {
	fd := int(os.Stdin.Fd())
	if !term.IsTerminal(fd) {
		return os.Stdin, func() {}
	}
	old, err := term.MakeRaw(fd)
	if err != nil {
		return os.Stdin, func() {}
	}
	fmt.Fprint(os.Stderr, "qvirt-launcher: console attached; Ctrl-] stops the VM\r\n")
	return escapeReader{r: os.Stdin, stop: stop}, func() { _ = term.Restore(fd, old) }
}

// escapeReader stops at Ctrl-] (0x1d) instead of passing it to the guest.
type escapeReader struct {
	r    io.Reader
	stop func()
}

func (e escapeReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	for i := 0; i < n; i++ {
		if p[i] == 0x1d {
			e.stop()
			return i, io.EOF
		}
	}
	return n, err
}
