package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/qmp"
)

// qemuArgv is the command line of a QEMU one of this cluster's launchers started, with what it
// needs to run again outside its pod: the files it names outside its run directory are copied
// into files (read through the process's root, since the pod has its own mount namespace).
type qemuArgv struct {
	args   []string
	runDir string // the launcher's run directory (-pidfile's), replaced per instance
}

// captureLauncherArgv reads the argv of a QEMU child of one of this cluster's launchers and copies
// the files it names (the kernel) into files.
func captureLauncherArgv(b *testing.B, files string) qemuArgv {
	b.Helper()
	_, qemus := clusterProcesses()
	if len(qemus) == 0 {
		b.Fatal("no QEMU started by this cluster's launchers is running")
	}
	pid := qemus[0]
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		b.Fatal(err)
	}
	args := strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")[1:]
	a := qemuArgv{args: args}
	if i := slices.Index(args, "-pidfile"); i >= 0 && i+1 < len(args) {
		a.runDir = filepath.Dir(args[i+1])
	}
	if a.runDir == "" || a.runDir == "/" {
		b.Fatalf("launcher's QEMU argv has no -pidfile in a run directory: %q", args)
	}
	for i, arg := range a.args {
		if !strings.HasPrefix(arg, "/") || strings.HasPrefix(arg, a.runDir+"/") {
			continue
		}
		copied := filepath.Join(files, fmt.Sprintf("%d-%s", i, filepath.Base(arg)))
		if err := copyFile(fmt.Sprintf("/proc/%d/root%s", pid, arg), copied); err != nil {
			b.Fatalf("copy %s the launcher's QEMU reads: %v", arg, err)
		}
		a.args[i] = copied
	}
	return a
}

var ifnameOpt = regexp.MustCompile(`ifname=[^,]+`)

// instance is the argv for bare instance i: its own run directory, and its own tap (QEMU creates
// it, as root, in this network namespace).
func (a qemuArgv) instance(i int, runDir string) []string {
	out := make([]string, len(a.args))
	for j, arg := range a.args {
		arg = strings.ReplaceAll(arg, a.runDir, runDir)
		out[j] = ifnameOpt.ReplaceAllString(arg, fmt.Sprintf("ifname=qvbf%d", i))
	}
	return out
}

// benchFloor starts n bare QEMUs with the launcher's argv, interval apart, each resumed over QMP
// as soon as its monitor listens, and returns each one's time from exec to running, sorted, and
// the mean CPU-seconds one used until then. This is the physical floor for the same guests on the
// same machine: no API, no pod, no launcher.
func benchFloor(b *testing.B, a qemuArgv, n int, interval time.Duration) (lat []float64, cpuPerQEMU float64) {
	b.Helper()
	root := b.TempDir()
	var (
		mu    sync.Mutex
		procs = make([]*exec.Cmd, n)
		ticks uint64
	)
	defer func() {
		for _, cmd := range procs {
			if cmd != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
		}
	}()
	onSchedule(b, n, interval, func(i int) error {
		runDir := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(runDir, 0o700); err != nil {
			return err
		}
		start := time.Now()
		cmd := exec.Command("qemu-system-x86_64", a.instance(i, runDir)...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("bare QEMU %d: %w", i, err)
		}
		mu.Lock()
		procs[i] = cmd
		mu.Unlock()
		if err := resumeWhenListening(launcher.Dir(runDir).QMP(), 30*time.Second); err != nil {
			return fmt.Errorf("bare QEMU %d: %w", i, err)
		}
		took := time.Since(start).Seconds()
		used, ok := cpuTicks(cmd.Process.Pid)
		if !ok {
			return fmt.Errorf("bare QEMU %d: no CPU time in /proc/%d/stat", i, cmd.Process.Pid)
		}
		mu.Lock()
		defer mu.Unlock()
		lat = append(lat, took)
		ticks += used
		return nil
	})
	slices.Sort(lat)
	return lat, float64(ticks) / 100 / float64(n) // USER_HZ
}

// onSchedule calls fn(i) for i in [0, n), each in its own goroutine, the i-th at interval×i from
// now: a call that takes long delays no other. It waits for all of them, fails the benchmark with
// the first error.
func onSchedule(b *testing.B, n int, interval time.Duration, fn func(i int) error) {
	b.Helper()
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	first := time.Now()
	for i := range n {
		time.Sleep(time.Until(first.Add(time.Duration(i) * interval)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(i); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		b.Fatal(errs[0])
	}
}

// resumeWhenListening connects to the QMP socket once QEMU listens there and continues the vCPUs,
// as the launcher does.
func resumeWhenListening(socket string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		mon, err := qmp.Dial(ctx, socket)
		if err == nil {
			defer mon.Close()
			return mon.Cont(ctx)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("QMP at %s: %w", socket, err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
