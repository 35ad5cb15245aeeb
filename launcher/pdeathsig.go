package launcher

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"syscall"
)

// startTied starts cmd so that it dies with the launcher, and returns once it has started (or
// failed to). started runs once cmd has started, before anything else can see it end. Each line cmd
// writes to stderr then goes to line; once stderr has ended, cmd is reaped and how it ended goes to
// exited.
//
// The death signal (Pdeathsig) is sent when the thread that forked the child ends, not the process
// (prctl(2), PR_SET_PDEATHSIG; golang/go#27505), and the Go runtime ends a thread whenever a
// goroutine that locked it returns without unlocking: a child forked from such a thread would be
// killed while the launcher runs on. That happened in the launcher's tests, whose DHCP tests lock
// threads into network namespaces: swtpm was killed under a running guest. So one goroutine forks
// cmd from a thread it locks and keeps it, running only this child's callbacks, until cmd is
// reaped and exited has returned: one goroutine and one thread per child.
func startTied(cmd *exec.Cmd, started func(), line func(string), exited func(error)) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	result := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			result <- err
			return
		}
		started()
		result <- nil
		copyLines(stderr, line) // Wait closes the pipe: read all of it first
		exited(cmd.Wait())
	}()
	return <-result
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
