package launcher

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/launcher/protocol"
)

// RunOptions configure `qvirt-launcher run`: one VM in the foreground, outside Kubernetes.
type RunOptions struct {
	// File is a machine description (JSON, package machine), such as `qvirtctl machine -f
	// vmi.yaml` prints.
	File string
	// RunDir holds the sockets (launcher.sock, qmp.sock, serial.sock, ...); a new temporary
	// directory, removed at the end, when empty.
	RunDir         string
	QEMU           string
	SpareRootPorts int
	// OVMFDir holds the OVMF builds (HostResolver.OVMFDir).
	OVMFDir string
	// Images is where registry images are pulled to (HostResolver's ImageCache, InsecureRegistries
	// and Puller; its other fields are ignored).
	Images HostResolver
	// Console, when set, is connected to the guest's serial console.
	Console io.ReadWriter
	Log     logr.Logger
}

// Run boots the VM of opts.File and returns when QEMU exits. Cancelling ctx stops the guest
// gracefully (ACPI power button, quit after the grace period). The error is non-nil when the spec
// is refused or QEMU cannot start; otherwise Exit says how the guest ended.
func Run(ctx context.Context, opts RunOptions) (protocol.Exit, error) {
	req, err := LoadMachine(opts.File)
	if err != nil {
		return protocol.Exit{}, err
	}
	runDir := opts.RunDir
	if runDir == "" {
		if runDir, err = os.MkdirTemp("", "qvirt-launcher-"); err != nil {
			return protocol.Exit{}, err
		}
		defer os.RemoveAll(runDir)
	}
	res := HostResolver{SpareRootPorts: opts.SpareRootPorts, OVMFDir: opts.OVMFDir, ImageCache: opts.Images.ImageCache,
		InsecureRegistries: opts.Images.InsecureRegistries, Puller: opts.Images.Puller}
	l := New(runDir, res, Options{QEMU: opts.QEMU, Log: opts.Log})
	serveCtx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	go func() {
		if err := Serve(serveCtx, filepath.Join(runDir, SocketName), l, opts.Log); err != nil {
			opts.Log.Error(err, "command server stopped")
		}
	}()
	if err := l.Sync(ctx, req); err != nil {
		return protocol.Exit{}, err
	}
	opts.Log.Info("guest started", "runDir", runDir, "commandSocket", filepath.Join(runDir, SocketName))
	if opts.Console != nil {
		go attachConsole(l, opts.Console, opts.Log)
	}
	return waitOrStop(ctx, l)
}

func waitOrStop(ctx context.Context, l *Launcher) (protocol.Exit, error) {
	exit, err := l.Wait(ctx)
	if err == nil {
		return exit, nil
	}
	// Interrupted: stop the guest gracefully, whatever the caller's context says now.
	return l.Shutdown(context.Background(), nil)
}

// attachConsole copies between the guest's serial socket and rw until QEMU exits.
func attachConsole(l *Launcher, rw io.ReadWriter, log logr.Logger) {
	p, err := l.anyProcess()
	if err != nil {
		return
	}
	conn, err := net.Dial("unix", p.Machine().SerialSocket())
	if err != nil {
		log.Error(err, "attach serial console")
		return
	}
	defer conn.Close()
	go func() { _, _ = io.Copy(conn, rw) }()
	go func() { <-p.Done(); _ = conn.Close() }()
	_, _ = io.Copy(rw, conn)
}

// LoadMachine reads a machine description strictly (unknown fields are errors).
func LoadMachine(file string) (*protocol.SyncRequest, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var req protocol.SyncRequest
	if err := dec.Decode(&req.Machine); err != nil {
		return nil, fmt.Errorf("%s: a machine description (qvirtctl machine -f VMI.yaml prints one): %w", file, err)
	}
	return &req, nil
}

// ExitCode is the process exit status for an Exit: 0 for a guest that powered off cleanly.
func ExitCode(e protocol.Exit) int {
	if e.Reason == protocol.ExitGuestShutdown {
		return 0
	}
	return 1
}
