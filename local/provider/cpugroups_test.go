package provider

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The thread that forks a container joins the pod's CPU cgroup so that the child starts there, and
// must leave it again: the Go runtime retires that thread, except the process's main thread, which
// it parks for good. A main thread left in the pod's cgroup kept it from ever being removed (a
// virtual node's stop failed with "remove cgroup ...: device or resource busy"). The same thread
// must leave the pod's network, mount and UTS namespaces too, and so must one that forked a
// command inside a running container (kubectl exec, exec probes): a parked main thread kept them
// alive after the pod was gone.
func TestForkingThreadLeavesThePodsSandbox(t *testing.T) {
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
	podNet := newNetns(t)
	container := sleeper()
	// In a PID namespace of its own, as podRun starts containers: the exec below enters it.
	container.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	forkFromThread(t, "a container's start", func() error {
		return (sandbox{netns: podNet, cpuTasks: tasks, hostname: "cg-pod"}).enterAndStart(container)
	})
	t.Cleanup(func() { _ = container.Process.Kill(); _ = container.Wait() })
	if child := pidCPUCgroup(t, container.Process.Pid); !strings.HasSuffix(child, "/pod"+string(pod.UID)) {
		t.Errorf("the container's process is in cpu cgroup %q, want the pod's", child)
	}
	if child := nsOf(t, "/proc/"+strconv.Itoa(container.Process.Pid), "net"); child != nsOf(t, podNet, "") {
		t.Errorf("the container's process is in network namespace %s, want the pod's", child)
	}

	inContainer := sleeper()
	forkFromThread(t, "an exec in the container", func() error { return enterContainerAndStart(container.Process.Pid, inContainer) })
	t.Cleanup(func() { _ = inContainer.Process.Kill(); _ = inContainer.Wait() })
	for _, kind := range []string{"net", "mnt", "uts", "pid"} {
		proc := "/proc/" + strconv.Itoa(inContainer.Process.Pid)
		if got, want := nsOf(t, proc, kind), nsOf(t, "/proc/"+strconv.Itoa(container.Process.Pid), kind); got != want {
			t.Errorf("the exec'd process is in %s namespace %s, want the container's %s", kind, got, want)
		}
	}

	// The exec first: a PID namespace's first process is not reaped before every other in it is.
	for _, p := range []*exec.Cmd{inContainer, container} {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	if err := g.removePod(pod.UID); err != nil {
		t.Errorf("remove the pod's cgroup once its process is gone: %v", err)
	}
}

func sleeper() *exec.Cmd {
	cmd := exec.Command("/bin/busybox", "sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd
}

// forkFromThread runs start on a locked thread, as sandbox.start and startInContainer do, and
// checks that the thread ends where it began.
func forkFromThread(t *testing.T, what string, start func() error) {
	t.Helper()
	type result struct {
		err           error
		before, after threadPlace
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread may have entered the pod's namespaces
		before := placeOfThread(t)
		err := start()
		done <- result{err, before, placeOfThread(t)}
	}()
	r := <-done
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	if r.after != r.before {
		t.Errorf("the thread that forked %s stayed in the pod's sandbox: it is in %+v, want %+v (where it was)", what, r.after, r.before)
	}
}

// threadPlace is where the calling thread is: its cpu cgroup and namespaces.
type threadPlace struct{ cgroup, net, mnt, uts, pidForChildren string }

func placeOfThread(t *testing.T) threadPlace {
	self := "/proc/self/task/" + strconv.Itoa(unix.Gettid())
	return threadPlace{cgroup: threadCPUCgroup(t), net: nsOf(t, self, "net"), mnt: nsOf(t, self, "mnt"), uts: nsOf(t, self, "uts"),
		pidForChildren: nsOf(t, self, "pid_for_children")}
}

// nsOf names the namespace of kind at proc (a /proc/<pid> or task directory), or the one bound at
// proc itself when kind is "".
func nsOf(t *testing.T, proc, kind string) string {
	t.Helper()
	path := proc
	if kind != "" {
		path = proc + "/ns/" + kind
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return strconv.FormatUint(st.Ino, 10)
}

// newNetns makes a network namespace for the test and returns the path it is bound at.
func newNetns(t *testing.T) string {
	t.Helper()
	name := "qvp-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	made := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread entered the new namespace
		own, err := netns.Get()
		if err != nil {
			made <- err
			return
		}
		defer own.Close()
		h, err := netns.NewNamed(name)
		if err == nil {
			_ = h.Close()
			err = netns.Set(own) // a parked thread must not keep the namespace alive
		}
		made <- err
	}()
	if err := <-made; err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	return "/run/netns/" + name
}

func threadCPUCgroup(t *testing.T) string {
	return cgroupOf(t, "/proc/self/task/"+strconv.Itoa(unix.Gettid()))
}

func pidCPUCgroup(t *testing.T, pid int) string {
	return cgroupOf(t, "/proc/"+strconv.Itoa(pid))
}

func cgroupOf(t *testing.T, proc string) string {
	t.Helper()
	path, err := cpuCgroupOf(proc)
	if err != nil {
		t.Fatal(err)
	}
	return path
}
