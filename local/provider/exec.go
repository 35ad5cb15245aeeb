package provider

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// bindMount is one volume (or termination-message file) a container sees at target.
type bindMount struct {
	source, target string
	readOnly, file bool
}

// sandbox is where a container's process starts: the pod's network namespace plus a fresh mount
// namespace where the hidden paths are covered and the binds made, and a UTS namespace with the
// pod's hostname. (The PID namespace is the process's own: see podRun.command.)
type sandbox struct {
	netns    string
	cpuTasks string // the pod's CPU cgroup's tasks file, or ""
	hostname string
	hidden   []string
	mounts   []bindMount
}

// start starts cmd inside the sandbox. Go cannot run code between fork and exec, so a dedicated
// OS thread enters the namespaces (setns for the network, unshare for mount and UTS, which only
// touches this thread) and forks from there: the child inherits the thread's namespaces. The
// thread goes home afterwards (keepHome), but is never unlocked all the same, so the Go runtime
// retires it instead of reusing it elsewhere: it no longer shares its filesystem attributes
// (CLONE_FS), its working directory is reset, and going home is best effort.
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
	home, err := keepHome([]namespace{mntNS, utsNS, netNS})
	if err != nil {
		return err
	}
	leaveCgroup := func() {}
	// Home first: the cgroup's files are the host's, and the pod's mount namespace may hide them.
	defer func() {
		home()
		leaveCgroup()
	}()
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
	// Each source is opened (in this namespace: a bind's source must be in the caller's) before the
	// hidden paths are covered; many of them lie under one.
	srcs, err := openSources(s.mounts)
	if err != nil {
		return err
	}
	defer closeAll(srcs)
	for _, h := range s.hidden {
		if err := hide(h); err != nil {
			return err
		}
	}
	for _, m := range sortedMounts(s.mounts) {
		if err := m.mount(srcs[m.source]); err != nil {
			return err
		}
	}
	for _, h := range s.hidden {
		if err := seal(h); err != nil {
			return err
		}
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter netns %s: %w", s.netns, err)
	}
	// cgroup v1 moves this thread alone; the child forked from it starts in the pod's cgroup, as
	// does everything it forks (the launcher's QEMU).
	if s.cpuTasks != "" {
		// Left in the pod's cgroup, a parked thread (keepHome) would keep the cgroup from ever
		// being removed.
		leave, err := enterCPUGroup(s.cpuTasks)
		if err != nil {
			return err
		}
		leaveCgroup = leave
	}
	return cmd.Start()
}

// enterCPUGroup moves the calling thread into the cgroup of tasks file tasks; leave moves it back
// to the cpu cgroup it was in. A failure to move back shows later, as the pod's cgroup that cannot
// be removed (removePod's error).
func enterCPUGroup(tasks string) (leave func(), err error) {
	tid := strconv.Itoa(unix.Gettid())
	was, err := cpuCgroupOf("/proc/self/task/" + tid)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(tasks, []byte(tid), 0o644); err != nil {
		return nil, fmt.Errorf("enter the pod's CPU cgroup: %w", err)
	}
	return func() { _ = os.WriteFile(filepath.Join(cgroupCPURoot, was, "tasks"), []byte(tid), 0o644) }, nil
}

// sortedMounts orders binds parents first, so a bind inside another lands on top of it.
func sortedMounts(ms []bindMount) []bindMount {
	out := slices.Clone(ms)
	slices.SortStableFunc(out, func(a, b bindMount) int {
		return strings.Count(filepath.Clean(a.target), "/") - strings.Count(filepath.Clean(b.target), "/")
	})
	return out
}

// openSources opens each mount's source as an O_PATH descriptor, by source path.
func openSources(ms []bindMount) (map[string]int, error) {
	fds := map[string]int{}
	for _, m := range ms {
		if _, ok := fds[m.source]; ok {
			continue
		}
		fd, err := unix.Open(m.source, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("open bind source %s: %w", m.source, err)
		}
		fds[m.source] = fd
	}
	return fds, nil
}

func closeAll(fds map[string]int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// hide covers dir with an empty tmpfs in this mount namespace; seal makes it read-only once the
// mount points of the binds under it exist.
func hide(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", hiddenFlags, "size=64k,mode=0755"); err != nil {
		return fmt.Errorf("hide %s: %w", dir, err)
	}
	return nil
}

const hiddenFlags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

func seal(dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|hiddenFlags, ""); err != nil {
		return fmt.Errorf("make hidden %s read-only: %w", dir, err)
	}
	return nil
}

// mount binds the source open at fd at target, creating the target in the host's filesystem when
// missing (as a runtime creates mount points in an image's root filesystem).
func (m bindMount) mount(fd int) error {
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
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fd), m.target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
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

// startInContainer starts cmd inside the running container whose first process is pid: its mount,
// UTS and network namespaces, and its PID namespace for the child, as `kubectl exec` and the
// kubelet's exec probes run a command. As in start, a dedicated OS thread enters the namespaces
// and forks from there, and is never unlocked. The namespace files are opened before the first
// setns: once in the container's mount namespace, its /proc no longer shows pid.
func startInContainer(pid int, cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- enterContainerAndStart(pid, cmd)
	}()
	return <-errc
}

func enterContainerAndStart(pid int, cmd *exec.Cmd) error {
	nss := []namespace{mntNS, utsNS, netNS, pidNS}
	fds, err := openNamespaces(fmt.Sprintf("/proc/%d/ns/", pid), nss, "the container's")
	if err != nil {
		return err
	}
	defer closeFDs(fds)
	home, err := keepHome(nss)
	if err != nil {
		return err
	}
	defer home()
	// A thread sharing its filesystem attributes with others cannot change its mount namespace.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare filesystem attributes: %w", err)
	}
	for i, ns := range nss {
		if err := unix.Setns(fds[i], ns.flag); err != nil {
			return fmt.Errorf("enter the container's %s namespace: %w", ns.name, err)
		}
	}
	return cmd.Start()
}

// namespace is a kind of Linux namespace that a forking thread enters.
type namespace struct {
	name string // its file in /proc/<pid>/ns
	flag int
}

var (
	mntNS = namespace{"mnt", unix.CLONE_NEWNS}
	utsNS = namespace{"uts", unix.CLONE_NEWUTS}
	netNS = namespace{"net", unix.CLONE_NEWNET}
	pidNS = namespace{"pid", unix.CLONE_NEWPID}
)

// keepHome opens the calling thread's own namespaces of the kinds given; home moves the thread
// back into them and closes them. A thread that entered a pod's namespaces to fork must go home
// afterwards: the runtime retires it once its locked goroutine returns, unless it is the process's
// main thread, which it parks for good, and a parked thread would keep the pod's network and mount
// namespaces alive after the pod. The way home is best effort: the child has started by then.
func keepHome(kinds []namespace) (home func(), err error) {
	own := make([]namespace, len(kinds))
	for i, k := range kinds {
		own[i] = k
		if k.flag == unix.CLONE_NEWPID {
			own[i].name = "pid_for_children" // what setns changes: the thread's own never does
		}
	}
	fds, err := openNamespaces("/proc/thread-self/ns/", own, "this thread's")
	if err != nil {
		return nil, err
	}
	return func() {
		for i, fd := range fds {
			_ = unix.Setns(fd, kinds[i].flag)
		}
		closeFDs(fds)
	}, nil
}

// openNamespaces opens the namespace files of kinds in dir (a /proc/<pid>/ns/ directory, with its
// slash); whose says whose they are, for the error.
func openNamespaces(dir string, kinds []namespace, whose string) ([]int, error) {
	fds := make([]int, 0, len(kinds))
	for _, k := range kinds {
		fd, err := unix.Open(dir+k.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			closeFDs(fds)
			return nil, fmt.Errorf("open %s %s namespace: %w", whose, k.name, err)
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
