package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// OpenPTY opens a pseudo-terminal pair through /dev/ptmx, for driving a command that wants a
// terminal (qvirtctl console, the QMP shell); both ends are closed when the test ends.
func OpenPTY(t testing.TB) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fd := int(m.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		m.Close()
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err != nil {
		m.Close()
		t.Fatalf("pty number: %v", err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); m.Close() })
	return m, s
}

// PTYCommand is a command run on a pseudo-terminal (qvirtctl console), with everything it wrote
// kept.
type PTYCommand struct {
	// Master is the terminal's side a user types into.
	Master *os.File
	// Screen is what the command wrote.
	Screen SyncBuffer
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
}

// StartOnPTY starts cmd with its standard input, output and error on a new pseudo-terminal. A
// command still running when the test ends is killed.
func StartOnPTY(t testing.TB, cmd *exec.Cmd) *PTYCommand {
	t.Helper()
	master, slave := OpenPTY(t)
	p := &PTYCommand{Master: master, cmd: cmd, done: make(chan struct{})}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := master.Read(b)
			_, _ = p.Screen.Write(b[:n])
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Type writes s to the terminal.
func (p *PTYCommand) Type(t testing.TB, s string) {
	t.Helper()
	if _, err := p.Master.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// Detach types Ctrl+], as a user leaves a console, and waits up to d for the command to exit; it
// returns the command's error, or, having killed it, one saying it still ran. A command that
// already exited is not typed to.
func (p *PTYCommand) Detach(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_, _ = p.Master.Write([]byte{0x1d})
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s still ran %s after Ctrl+]", p.cmd.Path, d)
	}
}
