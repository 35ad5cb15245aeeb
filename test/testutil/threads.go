package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Thread is one thread of a process: its ID, its name (comm, such as QEMU's "CPU 0/TCG") and the
// CPUs it may run on, as the kernel lists them (Cpus_allowed_list: "0-1,3").
type Thread struct {
	TID, Name, CPUs string
}

// Threads lists process pid's threads; one that ends while it is read is left out.
func Threads(pid int) ([]Thread, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Thread
	for _, e := range entries {
		comm, err1 := os.ReadFile(filepath.Join(dir, e.Name(), "comm"))
		status, err2 := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err1 != nil || err2 != nil {
			continue // the thread ended
		}
		th := Thread{TID: e.Name(), Name: strings.TrimSpace(string(comm))}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				th.CPUs = strings.TrimSpace(v)
			}
		}
		out = append(out, th)
	}
	return out, nil
}

// SchedStats sums the schedstat of process pid's threads (0: this process): the CPU time they
// have run and how many times they were scheduled in (each a wake-up of a sleeping thread, or a
// return after preemption). A thread that ends while it is read is left out.
func SchedStats(pid int) (cpu time.Duration, runs int64, err error) {
	proc := "self"
	if pid != 0 {
		proc = strconv.Itoa(pid)
	}
	pattern := "/proc/" + proc + "/task/*/schedstat"
	stats, err := filepath.Glob(pattern)
	if err != nil || len(stats) == 0 {
		return 0, 0, fmt.Errorf("no %s (the process ended, or the kernel keeps no schedstat): %v", pattern, err)
	}
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		fields := strings.Fields(string(data))
		if len(fields) < 3 {
			return 0, 0, fmt.Errorf("%s: %q is not three numbers", f, data)
		}
		ns, err1 := strconv.ParseInt(fields[0], 10, 64)
		n, err2 := strconv.ParseInt(fields[2], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, fmt.Errorf("%s: %w", f, err)
		}
		cpu += time.Duration(ns)
		runs += n
	}
	return cpu, runs, nil
}

// MustSchedStats is SchedStats, failing tb when the figures cannot be read.
func MustSchedStats(tb testing.TB, pid int) (time.Duration, int64) {
	tb.Helper()
	cpu, runs, err := SchedStats(pid)
	if err != nil {
		tb.Fatal(err)
	}
	return cpu, runs
}
