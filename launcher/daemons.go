package launcher

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
)

// daemons are the helper processes of one QEMU: a virtiofsd per filesystem (filesystem.go), a
// passt per passt NIC (passt.go) and a swtpm for the TPM (tpm.go). Each listens on a unix socket
// (the launcher makes it and hands it over; passt makes its own and says when) and is ready before
// QEMU starts and connects. They die with the launcher (Pdeathsig), are ended
// when QEMU ends, and one that ends on its own while QEMU runs ends QEMU too (watch): the guest
// would hang on its device otherwise.
type daemons struct {
	log     logr.Logger
	mu      sync.Mutex
	running []*running
	// stopping is set once the launcher ends them, so their exit is not a failure.
	stopping bool
	// failed receives the first daemon that ended on its own while QEMU needed it.
	failed chan error
	// tpmIncoming is the new state directory of a persistent TPM's swtpm on a migration target
	// (tpm.go), "" otherwise.
	tpmIncoming string
}

// running is a daemon started: exited closes once it has exited, after failure is set when the
// exit was one.
type running struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	failure error
}

// daemonStopGrace is how long stop lets the daemons end on SIGTERM before it kills them.
const daemonStopGrace = 2 * time.Second

// daemon is one helper process to start: name is the program, of what it serves, for messages.
// A daemon that outlives QEMU's connection (passt waits for another) ends only when the launcher
// ends it: for it even an exit 0 is a failure (anyExitFails).
type daemon struct {
	name, of     string
	cmd          *exec.Cmd
	anyExitFails bool
	// noise, when set, says which stderr lines are not worth logging.
	noise func(line string) bool
}

// startDaemons starts the daemons m needs: nil when it needs none.
func startDaemons(m *Machine, opts Options, log logr.Logger) (*daemons, error) {
	passts := passtNICs(m)
	if len(m.Filesystems) == 0 && !m.TPM && len(passts) == 0 {
		return nil, nil
	}
	d := &daemons{log: log, failed: make(chan error, 1)}
	virtiofsd := opts.Virtiofsd
	if virtiofsd == "" {
		virtiofsd = DefaultVirtiofsd
	}
	for i, f := range m.Filesystems {
		if err := d.startFilesystem(f, m.FilesystemSocket(i), virtiofsd); err != nil {
			d.stop()
			return nil, fmt.Errorf("filesystem %q: %w", f.Name, err)
		}
	}
	passt := opts.Passt
	if passt == "" {
		passt = DefaultPasst
	}
	for _, i := range passts {
		if err := d.startPasst(m, i, passt); err != nil {
			d.stop()
			return nil, fmt.Errorf("interface %q: %w", m.NICs[i].Name, err)
		}
	}
	if m.TPM {
		if err := d.startTPM(m, opts.SWTPM); err != nil {
			d.stop()
			return nil, fmt.Errorf("tpm: %w", err)
		}
	}
	return d, nil
}

// listenFor makes the listening unix socket at path that QEMU connects to, for a daemon to accept
// on: the file to pass it. The daemon owns the socket from then on; the launcher's copy only keeps
// it from being removed when closed.
func listenFor(path string) (*os.File, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen for QEMU: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	_ = ln.Close()
	return f, err
}

// run starts the daemon, logging its stderr, and returns it running. An exit 0 is the daemon
// seeing QEMU close its socket, which QEMU does only as it ends: no failure, QEMU's own exit tells
// why (unless anyExitFails); any other exit while the launcher has not stopped it is a failure
// (watch).
func (d *daemons) run(dm daemon, log logr.Logger) (*running, error) {
	cmd := dm.cmd
	r := &running{cmd: cmd, exited: make(chan struct{})}
	tail := newTailBuffer(1024)
	line := func(line string) {
		if dm.noise != nil && dm.noise(line) {
			return
		}
		tail.Write([]byte(line + "\n"))
		log.Info(dm.name, "pid", cmd.Process.Pid, "stderr", line)
	}
	exited := func(err error) {
		defer close(r.exited)
		d.mu.Lock()
		stopping := d.stopping
		d.mu.Unlock()
		if stopping || (err == nil && !dm.anyExitFails) {
			log.Info(dm.name+" ended", "pid", cmd.Process.Pid, "error", err)
			return
		}
		if err == nil {
			err = errors.New("exit status 0")
		}
		log.Error(err, dm.name+" ended while the guest needs it", "pid", cmd.Process.Pid)
		r.failure = fmt.Errorf("%s of %s ended (%v): %s", dm.name, dm.of, err, tail.String())
		select {
		case d.failed <- r.failure:
		default:
		}
	}
	started := func() {
		d.mu.Lock()
		d.running = append(d.running, r)
		d.mu.Unlock()
		log.Info(dm.name+" started", "pid", cmd.Process.Pid)
	}
	if err := startTied(cmd, started, line, exited); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return r, nil
}

// stop ends the daemons (QEMU has ended or failed to start): SIGTERM first, so that a daemon
// busy writing (swtpm, a persistent TPM's state) finishes, then SIGKILL for any still there after
// daemonStopGrace.
func (d *daemons) stop() {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.stopping = true
	all := d.running
	d.mu.Unlock()
	for _, r := range all {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
	}
	grace := time.NewTimer(daemonStopGrace)
	defer grace.Stop()
	expired := false
	for _, r := range all {
		if !expired {
			select {
			case <-r.exited:
				continue
			case <-grace.C:
				expired = true
			}
		}
		_ = r.cmd.Process.Kill()
	}
	d.dropUnadoptedTPMState()
}

// watch kills QEMU when a daemon ends before it. The exit says which daemon ended.
func (d *daemons) watch(p *Process) {
	select {
	case err := <-d.failed:
		p.daemonFailed(err)
	case <-p.exited:
	}
}
