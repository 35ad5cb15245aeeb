// Command qvirt-launcher runs one virtual machine: it execs qemu-system-x86_64 and drives it over
// QMP. `qvirt-launcher serve` is the launcher pod's process, driven by the node agent over
// <socket-dir>/<vmi-uid>/launcher.sock. `qvirt-launcher run -f machine.json` runs a VM in the
// foreground outside Kubernetes, with the serial console on the terminal, until the guest powers off.
// The launcher reads machine descriptions (package machine), never the VMI API: `qvirtctl machine`
// translates a VMI manifest into one.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"
	"golang.org/x/term"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

const usage = `usage: qvirt-launcher serve --vmi-uid UID [flags]
       qvirt-launcher run [flags] -f MACHINE.json
       qvirt-launcher probe --vmi-uid UID --guest-agent-ping [--timeout 1s]
       qvirt-launcher probe --vmi-uid UID [--timeout 1s] --guest-exec -- COMMAND [ARGS...]

serve: the launcher pod's process. Waits for the node agent's Sync on
<socket-dir>/<vmi-uid>/launcher.sock, runs that VM, exits when the guest has ended (0 when it
powered off cleanly). SIGTERM powers the guest off gracefully within its grace period.

probe: the exec probe of a guestAgentPing or exec readiness or liveness probe. Asks the launcher
of <socket-dir>/<vmi-uid> to ping the guest agent, or to run COMMAND in the guest through it;
exit status 0 when the agent answered or the command exited 0.

run: (qvirtctl machine [--emulation] -f VMI.yaml > MACHINE.json makes the machine description)

Runs one VM in the foreground with its serial console on stdin/stdout until the guest powers off.
Exit status 0 when the guest powered off cleanly, 1 with the reason otherwise, 2 for a refused spec.
SIGINT/SIGTERM, or Ctrl-] on a terminal, press the ACPI power button and quit QEMU after
the machine's grace period.
`

func main() {
	// One P: a launcher waits on QEMU, its guest's agent and its node agent, and never needs two
	// threads running Go at once. With more, the runtime wakes a second thread to look for work
	// each time a goroutine wakes; an idle launcher's wake-ups halve without it, and its start
	// costs a fifth less CPU (BenchmarkLauncherIdle, BenchmarkLauncherStartCPU). Setting it also
	// ends the runtime's re-reading of the cgroup's CPU limit at each of its monitor's wakes. A
	// GOMAXPROCS in the environment that the runtime takes (a number above 0) still wins.
	if n, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); err != nil || n < 1 {
		runtime.GOMAXPROCS(1)
	}
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	switch os.Args[1] {
	case "run":
		os.Exit(run(os.Args[2:]))
	case "serve":
		os.Exit(serve(os.Args[2:]))
	case podlayout.ProbeCommand:
		os.Exit(probe(os.Args[2:]))
	}
	fmt.Fprint(os.Stderr, usage)
	os.Exit(2)
}

func serve(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	opts := launcher.ServeOptions{}
	var uid string
	fs.StringVar(&opts.SocketDir, podlayout.FlagSocketDir, podlayout.SocketDir, "node socket directory (a hostPath mount)")
	fs.StringVar(&uid, podlayout.FlagVMIUID, "", "UID of the VirtualMachineInstance this pod runs (required)")
	fs.BoolVar(&opts.Emulation, podlayout.FlagEmulation, false, "allow software emulation (TCG) instead of KVM")
	fs.StringVar(&opts.QEMU, "qemu", "qemu-system-x86_64", "QEMU binary")
	fs.IntVar(&opts.SpareRootPorts, "hotplug-ports", 4, "empty PCIe root ports for hotplug")
	fs.StringVar(&opts.ScratchDir, "scratch-dir", podlayout.PrivateDir, "directory for emptyDisk and cloud-init images, containerDisk overlays and the EFI variable store")
	fs.StringVar(&opts.CloudInitSecrets, "cloud-init-secrets", podlayout.CloudInitSecretDir, "directory of the pod's cloud-init Secret volumes")
	fs.StringVar(&opts.ConfigVolumes, "config-volumes", podlayout.ConfigVolumeDir, "directory of the pod's secret, configMap, serviceAccount and downwardAPI volumes")
	fs.StringVar(&opts.OVMFDir, "ovmf-dir", launcher.DefaultOVMFDir, "directory of the OVMF (UEFI) builds, as Debian's ovmf package installs them")
	fs.DurationVar(&opts.Linger, "linger", 10*time.Second, "keep answering the node agent this long after the guest ended")
	fs.StringVar(&opts.TerminationLog, "termination-log", "/dev/termination-log", "file receiving how the guest ended (empty: none)")
	opts.Images = launcher.ImageMounts{KernelBoot: podlayout.KernelBootDir, ContainerDisks: podlayout.ContainerDiskDir}
	fs.BoolVar(&opts.AllowFileImages, podlayout.FlagAllowFileImagesForTests, false, "TESTS ONLY: accept file:// images, which a launcher pod refuses")
	fs.BoolVar(&opts.CPUProfile, podlayout.FlagCPUProfile, false, "write a CPU profile of the launcher's start, until the guest first runs, to "+podlayout.ProfileFile+" in the instance's socket directory")
	verbose := fs.Int("v", 0, "log verbosity")
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if uid == "" {
		fmt.Fprintln(os.Stderr, "qvirt-launcher serve: flag --vmi-uid is required")
		return 2
	}
	opts.VMIUID = uid
	opts.Log = funcr.NewJSON(func(obj string) { fmt.Fprintln(os.Stderr, obj) }, funcr.Options{Verbosity: *verbose})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	exit, err := launcher.ServeVM(ctx, opts)
	switch {
	case err != nil:
		fmt.Fprintf(os.Stderr, "qvirt-launcher: %v\n", err)
		return 1
	case exit == nil:
		fmt.Fprintln(os.Stderr, "qvirt-launcher: stopped before the node agent started a VM")
		return 0
	}
	fmt.Fprintf(os.Stderr, "qvirt-launcher: guest ended: %s %s\n", exit.Reason, exit.Detail)
	return launcher.ExitCode(*exit)
}

func run(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	opts := launcher.RunOptions{}
	fs.StringVar(&opts.File, "f", "", "machine description, as `qvirtctl machine -f VMI.yaml` prints (required)")
	fs.StringVar(&opts.RunDir, "run-dir", "", "directory for the sockets (default: a new temporary directory)")
	fs.StringVar(&opts.QEMU, "qemu", "qemu-system-x86_64", "QEMU binary")
	fs.IntVar(&opts.SpareRootPorts, "hotplug-ports", 4, "empty PCIe root ports for hotplug")
	fs.StringVar(&opts.OVMFDir, "ovmf-dir", launcher.DefaultOVMFDir, "directory of the OVMF (UEFI) builds, as Debian's ovmf package installs them")
	imageFlags(fs, &opts.Images, userImageCache())
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

// imageFlags are where run mode pulls images that are not file:// references to (by qvirt-pull);
// serve mode never pulls: its images are the pod's image volumes.
func imageFlags(fs *flag.FlagSet, h *launcher.HostResolver, cache string) {
	fs.StringVar(&h.ImageCache, podlayout.FlagImageCache, cache, "directory of pulled images (empty: only file:// images)")
	fs.Func(podlayout.FlagInsecureRegistry, "registry HOST:PORT that may be reached over plain HTTP (repeatable)", func(s string) error {
		h.InsecureRegistries = append(h.InsecureRegistries, s)
		return nil
	})
	fs.StringVar(&h.Puller, "puller", "", "image puller binary (default: "+launcher.PullerName+" beside qvirt-launcher, else on $PATH)")
}

// userImageCache is run mode's image cache: $XDG_CACHE_HOME/qvirt/images or ~/.cache/qvirt/images.
func userImageCache() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "qvirt", "images")
}
