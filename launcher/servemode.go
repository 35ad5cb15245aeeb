package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// ServeOptions configure `qvirt-launcher serve`, the launcher pod's process: it waits for the node
// agent's Sync on <SocketDir>/<VMIUID>/launcher.sock, runs that one VM, and returns when QEMU is gone.
type ServeOptions struct {
	SocketDir string
	VMIUID    string
	// Emulation is the pod's say (the controller renders it from its configuration): a machine
	// whose accelerator disagrees is refused.
	Emulation      bool
	QEMU           string
	SpareRootPorts int
	// ScratchDir holds emptyDisk and cloud-init images, containerDisk overlays and an EFI
	// machine's variable store (the pod's private emptyDir).
	ScratchDir string
	// CloudInitSecrets is where the pod mounts its cloud-init Secret volumes
	// (podlayout.CloudInitSecretDir).
	CloudInitSecrets string
	// ConfigVolumes is where the pod mounts the volumes behind its config disks
	// (podlayout.ConfigVolumeDir).
	ConfigVolumes string
	// OVMFDir holds the OVMF builds (HostResolver.OVMFDir).
	OVMFDir string
	// Images are the pod's image volumes (podlayout.KernelBootDir and ContainerDiskDir): the
	// launcher in a pod reads images there and never pulls.
	Images ImageMounts
	// AllowFileImages lets machines use file:// images, which a launcher pod otherwise refuses:
	// for tests that run serve-mode launchers on a prepared directory (flag
	// --allow-file-images). The pod renderer never sets it.
	AllowFileImages bool
	// Linger is how long the command socket keeps answering after the guest ended on its own, so
	// the node agent reads the final status; it is cut short by ctx.
	Linger time.Duration
	// TerminationLog, when set, receives how the guest ended (the pod's terminationMessagePath), so
	// the reason reaches the pod status even when no node agent is listening.
	TerminationLog string
	// CPUProfile writes a CPU profile of the launcher's start, until its guest first runs, to
	// podlayout.ProfileFile in the instance's socket directory (flag --cpu-profile).
	CPUProfile bool
	Log        logr.Logger
}

// ServeVM runs the launcher pod's VM. Cancelling ctx (SIGTERM: the pod is being deleted) stops the
// guest gracefully within its terminationGracePeriodSeconds. Without a Sync, ctx's end just returns.
func ServeVM(ctx context.Context, opts ServeOptions) (*protocol.Exit, error) {
	if opts.VMIUID == "" {
		return nil, fmt.Errorf("--vmi-uid is required")
	}
	dir := VMIDir(opts.SocketDir, opts.VMIUID)
	if err := os.MkdirAll(string(dir), 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}
	// The directory lives on the node (a hostPath), so it would outlast the pod: remove what this
	// pod made once the command server has stopped and QEMU is gone (the deferred calls below run
	// first).
	owned := ownedFiles{}
	defer func() {
		if err := owned.remove(string(dir)); err != nil {
			opts.Log.Error(err, "clean up the socket directory", "dir", string(dir))
		}
	}()
	images := opts.Images
	res := podResolver{host: HostResolver{SpareRootPorts: opts.SpareRootPorts, ScratchDir: opts.ScratchDir, OVMFDir: opts.OVMFDir,
		Images: &images, FileImagesInPod: opts.AllowFileImages, CloudInitSecrets: opts.CloudInitSecrets,
		ConfigVolumes: opts.ConfigVolumes}, uid: opts.VMIUID, emulation: opts.Emulation}
	l := New(string(dir), res, Options{QEMU: opts.QEMU, Log: opts.Log})
	if opts.CPUProfile {
		file := filepath.Join(string(dir), podlayout.ProfileFile)
		stop := profileStart(l, file, opts.Log)
		defer func() {
			stop()
			owned.record(file) // once written
		}()
	}
	ln, err := Listen(dir.Command())
	if err != nil {
		return nil, err
	}
	owned.record(dir.Command())
	serveCtx, stopServing := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeOn(serveCtx, ln, l, opts.Log) }()
	defer func() {
		stopServing()
		<-served
	}()
	opts.Log.Info("waiting for the node agent", "socket", dir.Command())

	exit, err := waitForEnd(ctx, l, served, func() {
		owned.record(dir.QMP(), dir.ShellQMP(), dir.Serial(), dir.VNC(), dir.PIDFile())
	})
	if err != nil || exit == nil {
		return exit, err
	}
	st, _ := l.Status(context.Background())
	writeTerminationLog(opts.TerminationLog, terminationMessage(*exit, st.Terminated), opts.Log)
	if ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(opts.Linger):
		}
	}
	return exit, nil
}

// waitForEnd returns how the guest ended, nil when ctx ended before any Sync. started is called
// once, when QEMU runs.
func waitForEnd(ctx context.Context, l *Launcher, served <-chan error, started func()) (*protocol.Exit, error) {
	for {
		st, changed := l.Status(ctx)
		if st.PID > 0 && started != nil {
			started()
			started = nil
		}
		if st.Exit != nil {
			return st.Exit, nil
		}
		if st.Phase == protocol.PhaseFailed {
			return &protocol.Exit{Reason: protocol.ExitFailedToStart, Detail: st.StartError, At: time.Now()}, nil
		}
		select {
		case <-changed:
		case err := <-served:
			return nil, fmt.Errorf("command server: %w", err)
		case <-ctx.Done():
			if st.Phase == protocol.PhaseWaiting {
				return nil, nil
			}
			l.terminate()
			exit, err := l.Shutdown(context.Background(), nil)
			if err != nil {
				// QEMU ended by itself meanwhile: report that.
				if st, _ := l.Status(context.Background()); st.Exit != nil {
					return st.Exit, nil
				}
				return nil, fmt.Errorf("graceful shutdown: %w", err)
			}
			return &exit, nil
		}
	}
}

// terminationMessage is how the guest ended, for the pod's terminationMessagePath; it starts with
// podlayout.TerminatedMessagePrefix when the launcher stopped the guest because it was told to.
func terminationMessage(exit protocol.Exit, terminated bool) string {
	if terminated {
		return podlayout.TerminatedMessagePrefix + exit.String()
	}
	return exit.String()
}

func writeTerminationLog(path, msg string, log logr.Logger) {
	if path == "" {
		return
	}
	if err := os.WriteFile(path, []byte(msg), 0o644); err != nil {
		log.Error(err, "write termination message", "path", path)
	}
}

// podResolver is HostResolver for the one VMI this pod was made for. Unless host.FileImagesInPod,
// it refuses file:// images: in a cluster such a reference names a directory on the node (or in
// the launcher image), chosen by whoever wrote the VMI, and images there are checked by no one.
// Images come from a registry, pulled by trusted code.
type podResolver struct {
	host      HostResolver
	uid       string
	emulation bool
}

func (p podResolver) Resolve(m *machine.Machine, runDir string) (*Machine, error) {
	if m.UID != p.uid {
		return nil, machine.Invalid(machinePath.Child("uid"), m.UID, fmt.Sprintf("this launcher pod runs VMI %s", p.uid))
	}
	if want := p.accel(); m.Accel != want {
		return nil, machine.Invalid(machinePath.Child("accel"), m.Accel, fmt.Sprintf("this launcher pod runs its guest with %s (its --emulation flag)", want))
	}
	if m.Kernel != nil {
		if err := p.checkImage(m.Kernel.Image, machinePath.Child("kernel", "image", "ref")); err != nil {
			return nil, err
		}
	}
	for i := range m.Disks {
		if err := p.checkDisk(&m.Disks[i], machinePath.Child("disks").Index(i)); err != nil {
			return nil, err
		}
	}
	return p.host.Resolve(m, runDir)
}

func (p podResolver) ResolveDisk(d *machine.Disk, runDir string, path machine.Path) (DiskImage, *machine.FieldError) {
	if err := p.checkDisk(d, path); err != nil {
		return DiskImage{}, err
	}
	return p.host.ResolveDisk(d, runDir, path)
}

func (p podResolver) checkDisk(d *machine.Disk, path machine.Path) *machine.FieldError {
	if d.Source.Container == nil {
		return nil
	}
	return p.checkImage(d.Source.Container.Image, path.Child("source", "container", "image", "ref"))
}

// checkImage refuses a file:// image unless this launcher allows them.
func (p podResolver) checkImage(ref machine.ImageRef, path machine.Path) *machine.FieldError {
	if p.host.FileImagesInPod || !strings.HasPrefix(ref.Ref, "file://") {
		return nil
	}
	return machine.Invalid(path, ref.Ref, "file:// images are for `qvirt-launcher run` outside Kubernetes; a launcher pod "+
		"boots only images from a registry (a file:// reference would name a path on the node)")
}

func (p podResolver) accel() machine.Accel {
	if p.emulation {
		return machine.AccelTCG
	}
	return machine.AccelKVM
}

// ownedFiles are the files of the socket directory this launcher pod made, by identity. Another
// launcher pod of the same VMI may be using the directory by the time this one ends (a migration
// retried to this node while the last target pod still shuts down): its files have other
// identities and stay, and so does the directory.
type ownedFiles map[string]os.FileInfo

func (o ownedFiles) record(paths ...string) {
	for _, p := range paths {
		if fi, err := os.Lstat(p); err == nil {
			o[p] = fi
		}
	}
}

func (o ownedFiles) remove(dir string) error {
	var errs []error
	for p, fi := range o {
		if cur, err := os.Lstat(p); err != nil || !os.SameFile(fi, cur) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	err := os.Remove(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
