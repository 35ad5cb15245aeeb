package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
