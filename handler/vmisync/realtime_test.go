package vmisync

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/cpuset"

	"github.com/qvirt/qvirt/internal/affinity"
)

// TestNoRTBudget: on a kernel that schedules real-time threads by cgroup (cgroup v1's
// cpu.rt_runtime_us, as on this machine), a process in a new cpu cgroup, which has no real-time
// budget, cannot be made SCHED_FIFO even by root, and noRTBudget says why, naming the file.
func TestNoRTBudget(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.rt_runtime_us"); err != nil {
		t.Skipf("no real-time group scheduling on this kernel (%v): nothing to explain", err)
	}
	dir := filepath.Join("/sys/fs/cgroup/cpu", "qvirt-test-rt-"+rand.String(6))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
		_ = os.Remove(dir)
	})
	pid := sleep.Process.Pid
	if err := os.WriteFile(filepath.Join(dir, "tasks"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: rtPriority}
	if err := unix.SchedSetAttr(pid, attr, 0); !errors.Is(err, unix.EPERM) {
		t.Fatalf("SCHED_FIFO in a cgroup with no real-time budget: %v, want EPERM", err)
	}
	why := noRTBudget(pid)
	if !strings.Contains(why, "cpu cgroup /"+filepath.Base(dir)+" has no real-time budget: its cpu.rt_runtime_us is 0") || !strings.Contains(why, "CONFIG_RT_GROUP_SCHED") {
		t.Errorf("noRTBudget = %q, want the cgroup's cpu.rt_runtime_us named", why)
	}
	if why := noRTBudget(os.Getpid()); why != "" {
		t.Errorf("noRTBudget of the test (its cgroup has the root's budget) = %q, want none", why)
	}
}

// TestSetFIFO: a thread that may run on a CPU beyond the container's own is refused and left as it
// was; one held to them becomes SCHED_FIFO at priority 1, reset on fork; and a thread whose process
// is no longer the one found (its ID reused) is set back and refused.
func TestSetFIFO(t *testing.T) {
	sleep := fakeQEMU(t)
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	pid := sleep.Process.Pid
	p, _ := started(t, sleep)
	ppid, start := p.ppid, p.start
	policy := func() (uint32, uint64) {
		a, err := unix.SchedGetAttr(pid, 0)
		if err != nil {
			t.Fatal(err)
		}
		return a.Policy, a.Flags
	}
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &all); err != nil || all.Count() < 2 {
		t.Fatalf("the test needs a thread that may run on 2 CPUs or more: %v (%d)", err, all.Count())
	}
	own := cpuset.New(affinity.CPUs(&all)[0])
	if did, err := setFIFO(p, pid, own); did || err == nil || !strings.Contains(err.Error(), "not only on the container's own "+own.String()) {
		t.Errorf("a thread on every CPU: %v, %v; want a refusal naming the container's CPUs", did, err)
	}
	if pol, _ := policy(); pol != unix.SCHED_NORMAL {
		t.Errorf("after the refusal the thread's policy is %d, want SCHED_OTHER", pol)
	}

	var one unix.CPUSet
	one.Set(own.List()[0])
	if err := unix.SchedSetaffinity(pid, &one); err != nil {
		t.Fatal(err)
	}
	if did, err := setFIFO(process{pid: pid, ppid: ppid, start: start + 1}, pid, own); did || err == nil || !strings.Contains(err.Error(), "set back") {
		t.Errorf("a process not the one found: %v, %v; want it set back and refused", did, err)
	}
	if pol, _ := policy(); pol != unix.SCHED_NORMAL {
		t.Errorf("after setting back the thread's policy is %d, want SCHED_OTHER", pol)
	}
	if did, err := setFIFO(p, pid, own); !did || err != nil {
		t.Fatalf("a thread held to the container's CPU: %v, %v; want it made real-time", did, err)
	}
	if pol, flags := policy(); pol != unix.SCHED_FIFO || flags&unix.SCHED_FLAG_RESET_ON_FORK == 0 {
		t.Errorf("the thread's policy %d flags %#x, want SCHED_FIFO reset on fork", pol, flags)
	}
	if did, err := setFIFO(p, pid, own); did || err != nil {
		t.Errorf("again: %v, %v; want nothing to change", did, err)
	}
}

// TestQEMUOf: the launcher's QEMU is its running child named qemu-system-*, found from the
// kernel's list of its children; another child is not taken, nor a process with no such child.
func TestQEMUOf(t *testing.T) {
	other := exec.Command("sleep", "60") // a child that is not QEMU, started first
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
	fake := fakeQEMU(t)
	if err := fake.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fake.Process.Kill(); _ = fake.Wait() })
	qemu := fake.Process.Pid
	if p, err := qemuOf(os.Getpid()); err != nil || p.pid != qemu || p.ppid != os.Getpid() || p.start == 0 {
		t.Errorf("our child qemu-system-x86_64 (process %d): %+v, %v; want it taken with its start time", qemu, p, err)
	}
	if p, err := qemuOf(qemu); err == nil || !strings.Contains(err.Error(), "runs no QEMU") {
		t.Errorf("a process with no QEMU child: %+v, %v; want an error saying so", p, err)
	}
}

// fakeQEMU is `sleep 60` from a copy of its binary named as QEMU's is, so that its process is
// taken for QEMU (the kernel names a process after its file; argv[0] stays "sleep" for a
// multi-call binary that picks its command by it).
func fakeQEMU(t *testing.T) *exec.Cmd {
	t.Helper()
	sleepBin, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleepBin)
	if err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.WriteFile(fake, data, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(fake, "60")
	cmd.Args[0] = "sleep"
	return cmd
}

// owns takes only the QEMU it found: a process of the same PID, parent and start time whose name
// is not QEMU's is not it.
func TestOwnsOnlyQEMU(t *testing.T) {
	for _, c := range []struct {
		cmd  *exec.Cmd
		want bool
	}{{exec.Command("sleep", "60"), false}, {fakeQEMU(t), true}} {
		if err := c.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.cmd.Process.Kill(); _ = c.cmd.Wait() })
		p, comm := started(t, c.cmd)
		if got := p.owns(p.pid); got != c.want {
			t.Errorf("%s (process %d) owns its main thread: %v, want %v", comm, p.pid, got, c.want)
		}
	}
}

// started is cmd's running process as the kernel lists it, and its name.
func started(t *testing.T, cmd *exec.Cmd) (process, string) {
	t.Helper()
	proc, err := procfs.NewProc(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	st, err := proc.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return process{pid: st.PID, ppid: st.PPID, start: st.Starttime}, st.Comm
}
