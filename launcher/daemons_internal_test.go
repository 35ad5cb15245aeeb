package launcher

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// TestDaemonsStopLetsThemFinish: stopping the daemons (QEMU has ended) first asks them to end, so
// one that writes state on its way out (swtpm, a persistent TPM's) gets to; one that does not end
// on the request is killed after the grace period, and stop does not wait on it for ever.
func TestDaemonsStopLetsThemFinish(t *testing.T) {
	dir := t.TempDir()
	saved := filepath.Join(dir, "saved")
	d := &daemons{log: logr.Discard(), failed: make(chan error, 1)}
	// Each says it is ready once its trap is set: a signal before that would end it regardless.
	polite := exec.Command("/bin/sh", "-c", `trap 'echo state > `+saved+`; exit 0' TERM; : > `+dir+`/ready-polite; while :; do sleep 0.05; done`)
	stubborn := exec.Command("/bin/sh", "-c", `trap '' TERM; : > `+dir+`/ready-stubborn; while :; do sleep 0.05; done`)
	for _, c := range []*exec.Cmd{polite, stubborn} {
		if _, err := d.run(daemon{name: "sh", of: "the test", cmd: c}, d.log); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"ready-polite", "ready-stubborn"} {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	d.stop()
	if b, err := os.ReadFile(saved); err != nil || string(b) != "state\n" {
		t.Errorf("the daemon that ends on SIGTERM did not finish its work: %q, %v", b, err)
	}
	for _, r := range d.running {
		<-r.exited
		ws, ok := r.cmd.ProcessState.Sys().(syscall.WaitStatus)
		if r.cmd == stubborn && (!ok || ws.Signal() != syscall.SIGKILL) {
			t.Errorf("the daemon that ignores SIGTERM ended with %v; want killed", r.cmd.ProcessState)
		}
	}
	select {
	case err := <-d.failed:
		t.Errorf("a stopped daemon counts as failed: %v", err)
	default:
	}
}

// TestTPMStateNames: tpm-current, on the tenant's own claim, names a TPM state directory in the
// state directory or is refused naming itself; never a path elsewhere.
func TestTPMStateNames(t *testing.T) {
	for name, ok := range map[string]bool{"tpm": true, "tpm-123456": true, "tpm-aZ9": true, "tpm-": false, "tpm-current": false,
		"../tpm": false, "tpm/../../x": false, "tpm-1/x": false, "": false, "tpmx": false, "tpm-1\n": false} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, tpmCurrentFile), []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := currentTPMState(dir)
		if ok && (err != nil || got != name) {
			t.Errorf("tpm-current %q: %q, %v; want it taken", name, got, err)
		}
		if !ok && (err == nil || !strings.Contains(err.Error(), tpmCurrentFile)) {
			t.Errorf("tpm-current %q: %q, %v; want an error naming %s", name, got, err, tpmCurrentFile)
		}
	}
}

// A daemon that outlives QEMU's connection (passt) fails the guest even when it exits 0 on its
// own; another daemon's exit 0 is QEMU closing its socket, no failure.
func TestDaemonExitZero(t *testing.T) {
	for _, anyExitFails := range []bool{true, false} {
		d := &daemons{log: logr.Discard(), failed: make(chan error, 1)}
		r, err := d.run(daemon{name: "passt", of: `interface "default"`, cmd: exec.Command("/bin/sh", "-c", "echo bye >&2; exit 0"),
			anyExitFails: anyExitFails}, d.log)
		if err != nil {
			t.Fatal(err)
		}
		<-r.exited
		switch {
		case anyExitFails && (r.failure == nil || !strings.Contains(r.failure.Error(), `passt of interface "default" ended (exit status 0): bye`)):
			t.Errorf("passt's exit 0: failure %v, want it named with its last words", r.failure)
		case anyExitFails && len(d.failed) != 1:
			t.Error("passt's exit 0 did not reach the watch")
		case !anyExitFails && (r.failure != nil || len(d.failed) != 0):
			t.Errorf("a daemon's exit 0: failure %v, want none", r.failure)
		}
	}
}

// TestDaemonOutlivesTheThreadThatStartedIt: a daemon dies with the launcher (Pdeathsig), and the
// kernel sends that signal when the thread that forked it ends. A daemon started from a goroutine
// whose locked thread then ends (the Go runtime ends such a thread) keeps running: it was forked
// from a thread held for it, not from the caller's.
func TestDaemonOutlivesTheThreadThatStartedIt(t *testing.T) {
	d := &daemons{log: logr.Discard(), failed: make(chan error, 1)}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		_, err := d.run(daemon{name: "sleep", of: "the test", cmd: exec.Command("sleep", "60")}, d.log)
		started <- err
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	defer d.stop()
	select {
	case err := <-d.failed:
		t.Fatalf("the daemon ended once the thread that asked for it did: %v", err)
	case <-time.After(2 * time.Second):
	}
}
