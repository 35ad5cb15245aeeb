package provider

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/prometheus/procfs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// newNetNS makes a network namespace and bind-mounts it at path (which must not exist).
func newNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("netns file: %w", err)
	}
	_ = f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread's namespace changes for good: it stays locked, so the runtime retires it
		// when this goroutine ends and no other goroutine runs in the new namespace.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount netns at %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// removeNetNS unmounts and removes a namespace file made by newNetNS; a missing one is fine.
func removeNetNS(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// Cleanup removes what a run with this state directory left behind, for example after a crash:
// the pods' processes (from their pid files), network namespaces, the veths on the node's bridge and
// the bridge, IPAM reservations, CNI cache, volumes, the pods' CPU cgroups, and restores ip_forward if that run changed it.
// Logs stay. A missing state directory is nothing to clean. Run calls it at start and at exit.
func Cleanup(stateDir string) error {
	if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	errs = append(errs, killLeftovers(filepath.Join(stateDir, podsDir)))
	errs = append(errs, detachLeftoverLoops(filepath.Join(stateDir, podsDir)))
	errs = append(errs, removeNetNSes(filepath.Join(stateDir, netnsDir)))
	errs = append(errs, teardownState(stateDir))
	errs = append(errs, removeCPUGroups(stateDir))
	errs = append(errs, restoreIPForward(stateDir))
	return errors.Join(errs...)
}

// teardownState removes the node's bridge with its veths and the per-pod state; Run's pods are
// stopped by then.
func teardownState(stateDir string) error {
	var errs []error
	if name, err := os.ReadFile(filepath.Join(stateDir, bridgeFile)); err == nil {
		errs = append(errs, removeBridge(strings.TrimSpace(string(name))))
	}
	errs = append(errs, removeNetNSes(filepath.Join(stateDir, netnsDir)))
	for _, d := range []string{podsDir, ipamDir, cniCacheDir, multusDir, multusPodsDir, netnsDir, bridgeFile} {
		if err := os.RemoveAll(filepath.Join(stateDir, d)); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

func removeNetNSes(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list netns dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, removeNetNS(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// removeBridge deletes the veths enslaved to the bridge (a namespace kept alive elsewhere would keep
// its pair) and then the bridge.
func removeBridge(name string) error {
	br, err := netlink.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bridge %s: %w", name, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index && l.Type() == "veth" {
			// A veth goes by itself when its peer's namespace goes: gone is fine.
			if err := netlink.LinkDel(l); err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) && !errors.Is(err, unix.ENODEV) {
				errs = append(errs, fmt.Errorf("delete veth %s: %w", l.Attrs().Name, err))
			}
		}
	}
	if err := netlink.LinkDel(br); err != nil {
		errs = append(errs, fmt.Errorf("delete bridge %s: %w", name, err))
	}
	return errors.Join(errs...)
}

// Pid files: podsDir/<uid>/<container>.pid holds "PID STARTTIME", STARTTIME from /proc/PID/stat,
// so a recycled pid is never killed.

func writePidFile(path string, pid int) error {
	st, err := procStartTime(pid)
	if err != nil {
		return err
	}
	return os.WriteFile(path, fmt.Appendf(nil, "%d %d\n", pid, st), 0o644)
}

// procStartTime is when process pid started, in clock ticks since boot: with its ID, what tells it
// from a later process given the same ID.
func procStartTime(pid int) (uint64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return st.Starttime, nil
}

// detachLeftoverLoops detaches the loop devices the pods under dir recorded; their processes are
// gone.
func detachLeftoverLoops(dir string) error {
	pods, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range pods {
		errs = append(errs, detachRecordedLoops(p))
	}
	return errors.Join(errs...)
}

func killLeftovers(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*", "*.pid"))
	if err != nil {
		return fmt.Errorf("list pid files: %w", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var pid int
		var start uint64
		if _, err := fmt.Sscan(string(b), &pid, &start); err != nil || pid <= 1 {
			continue
		}
		if st, err := procStartTime(pid); err == nil && st == start {
			// Each container is its own process group (Setpgid).
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}
