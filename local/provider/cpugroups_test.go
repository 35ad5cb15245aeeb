package provider

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The thread that forks a container joins the pod's CPU cgroup so that the child starts there, and
// must leave it again: the Go runtime retires that thread, except the process's main thread, which
// it parks for good. A main thread left in the pod's cgroup kept it from ever being removed (a
// virtual node's stop failed with "remove cgroup ...: device or resource busy").
func TestSandboxStartLeavesThePodsCgroup(t *testing.T) {
	if _, err := os.Stat(cgroupCPURoot + "/cpu.shares"); err != nil {
		t.Skipf("no cgroup v1 cpu controller here (%v): pods run unconfined", err)
	}
	g, err := newCPUGroups(t.TempDir(), resource.MustParse("1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeCgroup(g.dir, 0) })
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "cg-pod-1"}}
	tasks, err := g.addPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	before := threadCPUCgroup(t)
	cmd := exec.Command("/bin/busybox", "sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	type result struct {
		err   error
		after string
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread has entered the pod's namespaces
		err := (sandbox{netns: "/proc/self/ns/net", cpuTasks: tasks, hostname: "cg-pod"}).enterAndStart(cmd)
		done <- result{err, threadCPUCgroup(t)}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if child := pidCPUCgroup(t, cmd.Process.Pid); !strings.HasSuffix(child, "/pod"+string(pod.UID)) {
		t.Errorf("the container's process is in cpu cgroup %q, want the pod's", child)
	}
	if r.after != before {
		t.Errorf("the forking thread stayed in cpu cgroup %q, want %q (where it was)", r.after, before)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := g.removePod(pod.UID); err != nil {
		t.Errorf("remove the pod's cgroup once its process is gone: %v", err)
	}
}

func threadCPUCgroup(t *testing.T) string {
	return cgroupOf(t, "/proc/self/task/"+strconv.Itoa(unix.Gettid())+"/cgroup")
}

func pidCPUCgroup(t *testing.T, pid int) string {
	return cgroupOf(t, "/proc/"+strconv.Itoa(pid)+"/cgroup")
}

func cgroupOf(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	path, ok := cpuCgroupPath(string(data))
	if !ok {
		t.Fatalf("no cpu controller in %s:\n%s", file, data)
	}
	return path
}
