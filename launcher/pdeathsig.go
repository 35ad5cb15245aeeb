package launcher

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"syscall"
)

// startTied starts cmd so that it dies with the launcher (Pdeathsig, forked from a thread kept
// for it: startPinned). started runs once cmd has started, before anything else can see it end.
// Each line cmd writes to stderr then goes to line; once stderr has ended, cmd is reaped and how it
// ended goes to exited.
func startTied(cmd *exec.Cmd, started func(), line func(string), exited func(error)) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	release, err := startPinned(cmd)
	if err != nil {
		return err
	}
	started()
	go func() {
		copyLines(stderr, line) // Wait closes the pipe: read all of it first
		err := cmd.Wait()
		release()
		exited(err)
	}()
	return nil
}

// copyLines hands each line of r to line until r ends. A line longer than the scanner takes is
// reported, and the rest of r is drained unread: a child blocked writing to a full pipe would hang.
func copyLines(r io.Reader, line func(string)) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line(sc.Text())
	}
	if err := sc.Err(); err != nil {
		line(fmt.Sprintf("(stderr not read further: %v)", err))
		_, _ = io.Copy(io.Discard, r)
	}
}

// startPinned starts cmd, whose SysProcAttr.Pdeathsig ties it to the launcher, from an OS thread
// kept for it until release is called (after cmd.Wait). The kernel sends the death signal when the
// thread that forked the child ends, not the process (prctl(2), PR_SET_PDEATHSIG; golang/go#27505),
// and the Go runtime ends a thread whenever a goroutine that locked it returns without unlocking:
// a child forked from such a thread would be killed while the launcher runs on. That happened in
// the launcher's tests, whose DHCP tests lock threads into network namespaces: swtpm was killed
// under a running guest. A thread locked to a goroutine that waits runs nothing else and never
// ends before release. The stderr copy and the reaping run on an ordinary goroutine: with them on
// the locked one too, a launcher's start cost 0.3 to 1.6 ms more CPU, of about 8, in each of five
// comparisons of 20 starts (BenchmarkLauncherStartCPU); every wake of a goroutine locked to a
// thread is a hand-off between threads.
func startPinned(cmd *exec.Cmd) (release func(), err error) {
	started := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			<-done
		}
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return func() { close(done) }, nil
}
