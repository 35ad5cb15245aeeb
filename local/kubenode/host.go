package kubenode

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
)

// kubeletSysctls are the host settings the kubelet changes at start (unless
// protectKernelDefaults, which makes it refuse to start instead): saved before the first start
// and put back by Cleanup.
var kubeletSysctls = []string{"kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"}

// saveSysctls records the host's values once: a restarted node must not save the kubelet's own.
func saveSysctls(file string) error {
	if _, err := os.Stat(file); err == nil {
		return nil
	}
	vals := map[string]string{}
	for _, k := range kubeletSysctls {
		v, err := os.ReadFile(filepath.Join("/proc/sys", k))
		if err != nil {
			return fmt.Errorf("save sysctl %s: %w", k, err)
		}
		vals[k] = strings.TrimSpace(string(v))
	}
	return writeJSON(file, vals)
}

func restoreSysctls(file string) error {
	data, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	vals := map[string]string{}
	if err := json.Unmarshal(data, &vals); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	var errs []error
	for k, v := range vals {
		if !slices.Contains(kubeletSysctls, k) {
			continue
		}
		errs = append(errs, os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(file)
}

// cgroupMounts are the mount points of the host's cgroup hierarchies: one per v1 controller
// (and named hierarchy), or the single v2 one.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i < 0 || i+1 >= len(fields) {
			continue
		}
		if t := fields[i+1]; t == "cgroup" || t == "cgroup2" {
			out = append(out, fields[4])
		}
	}
	return out, sc.Err()
}

// createCgroupRoot makes root in every hierarchy: the kubelet refuses a cgroupRoot that does
// not exist, and creates the rest (kubepods, QoS classes, pods) itself.
func createCgroupRoot(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := os.MkdirAll(filepath.Join(m, root), 0o755); err != nil {
			return fmt.Errorf("cgroup root %s: %w", root, err)
		}
	}
	return nil
}

// removeCgroupRoot removes root's cgroups, deepest first, in every hierarchy. A cgroup with
// processes still in it cannot be removed: the error says which.
func removeCgroupRoot(root string) error {
	mounts, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range mounts {
		top := filepath.Join(m, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for _, d := range slices.Backward(dirs) {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts everything mounted at or below dir (the kubelet bind-mounts its root
// directory and mounts pod volumes; containerd mounts snapshots and sandbox files), deepest first.
func unmountUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		p := unescapeMount(fields[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	// Deeper paths are longer; a path mounted twice is unmounted twice.
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// Cleanup removes what node opts left on the host once its containerd and kubelet have stopped:
// the mounts under its directory, its cgroup root, its CNI bridge; and puts back the sysctls the
// kubelet changed. It also cleans up after a crashed run.
func Cleanup(opts Options) error {
	n := &Node{opts: opts}
	killLeftovers(n)
	errs := []error{unmountUnder(opts.Dir), removeCgroupRoot(n.CgroupRoot()), restoreSysctls(n.path("sysctls.json"))}
	if l, err := netlink.LinkByName(opts.Bridge); err == nil {
		if _, ok := l.(*netlink.Bridge); ok {
			errs = append(errs, netlink.LinkDel(l))
		}
	}
	errs = append(errs, removeLinksInto("/var/log/containers", opts.Dir))
	// Pods' IP reservations die with their network; a next run starts afresh.
	errs = append(errs, os.RemoveAll(n.path("cni", "ipam")))
	return errors.Join(errs...)
}

// killLeftovers kills what outlives containerd: the node's runc shims (containerd daemonises
// them; found by their binary and the node's containerd address on their command line) and the
// containers' processes (found in the node's cgroup root).
func killLeftovers(n *Node) {
	shim := filepath.Join(n.opts.Bin, "containerd-shim-runc-v2")
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		exe, err := os.Readlink(filepath.Join(p, "exe"))
		if err != nil || exe != shim {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), n.ContainerdSocket()) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	mounts, _ := cgroupMounts()
	for _, m := range mounts {
		_ = filepath.WalkDir(filepath.Join(m, n.CgroupRoot()), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			data, _ := os.ReadFile(p)
			for f := range strings.FieldsSeq(string(data)) {
				if pid, err := strconv.Atoi(f); err == nil {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
	// The kernel removes killed processes from their cgroups asynchronously.
	time.Sleep(200 * time.Millisecond)
}

// removeLinksInto removes the symbolic links in dir that point under target: the kubelet links
// every container's log into /var/log/containers, whatever its podLogsDir.
func removeLinksInto(dir, target string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if dst, err := os.Readlink(p); err == nil && strings.HasPrefix(dst, target+"/") {
			errs = append(errs, os.Remove(p))
		}
	}
	return errors.Join(errs...)
}

func dialUnix(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}
