package vmisync

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/rand"
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
