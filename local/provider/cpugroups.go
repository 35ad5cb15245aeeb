package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
)

// CPU shares, as the kubelet gives them. The kubelet keeps all pods under one cgroup (kubepods)
// whose CPU weight is the node's allocatable CPU, and each pod in its own cgroup weighted by its
// CPU requests. Local mode's pods are host processes: without the same, every QEMU thread of every
// guest competed one for one with the control plane and the node agents sharing the host, so a
// busy host held back the API server and qvirt while guests booted, and a guest with more threads
// took more CPU than its request said. Only cgroup v1's cpu controller is used (this is what the
// machines local mode targets have); elsewhere pods run unconfined and Run logs that once.

// cgroupCPURoot is where cgroup v1's cpu controller is mounted.
const cgroupCPURoot = "/sys/fs/cgroup/cpu"

// cpuGroups is one node's cgroup of pods. A nil *cpuGroups confines nothing.
type cpuGroups struct {
	dir string
}

// cpuGroupDir is the node's cgroup, named by its state directory so that nodes sharing a host, and
// clusters sharing it, each remove only their own.
func cpuGroupDir(stateDir string) string {
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		abs = stateDir
	}
	sum := sha256.Sum256([]byte(abs))
	return filepath.Join(cgroupCPURoot, "qvirt-local-"+hex.EncodeToString(sum[:6]))
}

// newCPUGroups creates the node's cgroup weighted by its allocatable CPU.
func newCPUGroups(stateDir string, allocatable resource.Quantity) (*cpuGroups, error) {
	if _, err := os.Stat(filepath.Join(cgroupCPURoot, "cpu.shares")); err != nil {
		return nil, fmt.Errorf("no cgroup v1 cpu controller at %s: %w", cgroupCPURoot, err)
	}
	g := &cpuGroups{dir: cpuGroupDir(stateDir)}
	if err := os.Mkdir(g.dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("create the node's cgroup %s: %w", g.dir, err)
	}
	if err := writeShares(g.dir, allocatable.MilliValue()); err != nil {
		return nil, err
	}
	return g, nil
}

// addPod creates the pod's cgroup weighted by its CPU requests and returns the file a thread
// writes its ID to, to move there ("" when g is nil).
func (g *cpuGroups) addPod(pod *corev1.Pod) (string, error) {
	if g == nil {
		return "", nil
	}
	dir := filepath.Join(g.dir, "pod"+string(pod.UID))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("create the pod's cgroup: %w", err)
	}
	if err := writeShares(dir, podCPURequest(pod)); err != nil {
		return "", err
	}
	return filepath.Join(dir, "tasks"), nil
}

// removePod removes the pod's cgroup once its processes are gone: a process the pod's last
// signal killed can take a moment to leave it.
func (g *cpuGroups) removePod(uid types.UID) error {
	if g == nil {
		return nil
	}
	return removeCgroup(filepath.Join(g.dir, "pod"+string(uid)), 5*time.Second)
}

// removeCPUGroups removes the node's cgroup and what is left of its pods' (their processes are
// killed by then).
func removeCPUGroups(stateDir string) error {
	dir := cpuGroupDir(stateDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list the node's cgroup: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() {
			errs = append(errs, removeCgroup(filepath.Join(dir, e.Name()), 5*time.Second))
		}
	}
	errs = append(errs, removeCgroup(dir, time.Second))
	return errors.Join(errs...)
}

// removeCgroup removes a cgroup, waiting up to wait while processes still leave it (EBUSY).
func removeCgroup(dir string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := os.Remove(dir)
		switch {
		case err == nil || errors.Is(err, os.ErrNotExist):
			return nil
		case errors.Is(err, syscall.EBUSY) && time.Now().Before(deadline):
			time.Sleep(50 * time.Millisecond)
		default:
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
	}
}

// podCPURequest is the pod's CPU request in millicores as the kubelet sizes a pod's cgroup: its
// containers' requests plus the pod's overhead.
func podCPURequest(pod *corev1.Pod) int64 {
	var m int64
	for _, c := range pod.Spec.Containers {
		m += c.Resources.Requests.Cpu().MilliValue()
	}
	return m + pod.Spec.Overhead.Cpu().MilliValue()
}

// milliCPUToShares converts millicores to cgroup v1 CPU shares as the kubelet does: 1024 per CPU,
// at least 2 (a pod without requests), at most the kernel's 262144.
func milliCPUToShares(milli int64) int64 {
	const minShares, maxShares = 2, 262144
	return min(max(milli*1024/1000, minShares), maxShares)
}

func writeShares(dir string, milli int64) error {
	shares := strconv.FormatInt(milliCPUToShares(milli), 10)
	if err := os.WriteFile(filepath.Join(dir, "cpu.shares"), []byte(shares), 0o644); err != nil {
		return fmt.Errorf("cgroup %s: set cpu.shares %s: %w", dir, shares, err)
	}
	return nil
}

// cpuCgroupOf is the cpu cgroup of proc, a /proc/<pid> or /proc/self/task/<tid> directory.
func cpuCgroupOf(proc string) (string, error) {
	listing, err := os.ReadFile(proc + "/cgroup")
	if err != nil {
		return "", fmt.Errorf("read the cgroups of %s: %w", proc, err)
	}
	path, ok := cpuCgroupPath(string(listing))
	if !ok {
		return "", fmt.Errorf("no cpu cgroup in %s/cgroup", proc)
	}
	return path, nil
}

// cpuCgroupPath is the cpu controller's cgroup in a /proc/PID/cgroup listing (cgroup v1: lines
// "ID:controllers:path", where cpu may share its line with cpuacct).
func cpuCgroupPath(listing string) (string, bool) {
	for line := range strings.Lines(listing) {
		parts := strings.SplitN(strings.TrimSuffix(line, "\n"), ":", 3)
		if len(parts) == 3 && slices.Contains(strings.Split(parts[1], ","), "cpu") {
			return parts[2], true
		}
	}
	return "", false
}
