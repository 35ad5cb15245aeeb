package provider

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// bindMount is one volume (or termination-message file) a container sees at target.
type bindMount struct {
	source, target string
	readOnly, file bool
}

// sandbox is where a container's process starts: the pod's network namespace plus a fresh mount
// namespace with the binds, and a UTS namespace with the pod's hostname.
type sandbox struct {
	netns    string
	hostname string
	mounts   []bindMount
}

// start starts cmd inside the sandbox. Go cannot run code between fork and exec, so a dedicated
// OS thread enters the namespaces (setns for the network, unshare for mount and UTS, which only
// touches this thread) and forks from there: the child inherits the thread's namespaces. The
// thread is never unlocked, so the Go runtime retires it instead of reusing it elsewhere.
func (s sandbox) start(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- s.enterAndStart(cmd)
	}()
	return <-errc
}

func (s sandbox) enterAndStart(cmd *exec.Cmd) error {
	fd, err := unix.Open(s.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", s.netns, err)
	}
	defer unix.Close(fd)
	if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS | unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("unshare mount and uts namespaces: %w", err)
	}
	if err := unix.Sethostname([]byte(s.hostname)); err != nil {
		return fmt.Errorf("set hostname %q: %w", s.hostname, err)
	}
	// Binds made here must not reach the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave mount: %w", err)
	}
	for _, m := range sortedMounts(s.mounts) {
		if err := m.mount(); err != nil {
			return err
		}
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter netns %s: %w", s.netns, err)
	}
	return cmd.Start()
}

// sortedMounts orders binds parents first, so a bind inside another lands on top of it.
func sortedMounts(ms []bindMount) []bindMount {
	out := slices.Clone(ms)
	slices.SortStableFunc(out, func(a, b bindMount) int {
		return strings.Count(filepath.Clean(a.target), "/") - strings.Count(filepath.Clean(b.target), "/")
	})
	return out
}

// mount binds source at target, creating the target in the host's filesystem when missing (as
// a runtime creates mount points in an image's root filesystem).
func (m bindMount) mount() error {
	if m.file {
		if err := os.MkdirAll(filepath.Dir(m.target), 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", m.target, err)
		}
		f, err := os.OpenFile(m.target, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return fmt.Errorf("mount point %s: %w", m.target, err)
		}
		_ = f.Close()
	} else if err := os.MkdirAll(m.target, 0o755); err != nil {
		return fmt.Errorf("mount point %s: %w", m.target, err)
	}
	if err := unix.Mount(m.source, m.target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", m.source, m.target, err)
	}
	if m.readOnly {
		if err := unix.Mount("", m.target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", m.target, err)
		}
	}
	return nil
}

// errNoBinary is a container whose image has no host binary in Options.Images.
var errNoBinary = errors.New("no host binary for image")

// argv maps a container to the host binary and argv it runs: the image's binary from the map,
// with command[0] as argv[0] (so multi-call binaries pick their applet) and the rest of command and
// args after it.
func argv(images map[string]string, image string, command, args []string) (string, []string, error) {
	bin, ok := images[image]
	if !ok {
		return "", nil, fmt.Errorf("%w %q (Options.Images)", errNoBinary, image)
	}
	if len(command) == 0 {
		return bin, append([]string{bin}, args...), nil
	}
	return bin, append(slices.Clone(command), args...), nil
}
