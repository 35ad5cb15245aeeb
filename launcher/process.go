package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"
	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/qmp"
)

// StartError is returned by Start when QEMU cannot be started or exits before it runs the guest.
type StartError struct {
	Step   string
	Stderr string
	Err    error
}

func (e *StartError) Error() string {
	msg := fmt.Sprintf("start qemu: %s: %v", e.Step, e.Err)
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

func (e *StartError) Unwrap() error { return e.Err }

// Options tune a Process.
type Options struct {
	// QEMU is the emulator binary; qemu-system-x86_64 from PATH when empty.
	QEMU string
	// Log receives QEMU's stderr lines and lifecycle messages.
	Log logr.Logger
	// StartTimeout bounds how long QEMU may take to open its monitor and answer on it; 60s when
	// zero. QEMU exiting ends the wait at once, so the bound only matters for a QEMU that hangs;
	// on a busy node (many guests booting under emulation) a healthy one can take over 10 s.
	StartTimeout time.Duration
	// Virtiofsd is the daemon serving the machine's filesystems; DefaultVirtiofsd when empty.
	Virtiofsd string
	// SWTPM is the TPM emulator behind the machine's TPM; DefaultSWTPM when empty.
	SWTPM string
	// Passt is the user-mode network of passt NICs; DefaultPasst when empty.
	Passt string
}

// Process supervises one QEMU: it starts it paused, connects QMP, resumes the guest and tracks the
// run state from QMP events until QEMU exits. All methods are safe for concurrent use. Start once;
// Wait and Done may be used by any number of callers.
type Process struct {
	machine *Machine
	log     logr.Logger
	cmd     *exec.Cmd
	mon     *qmp.Monitor
	stderr  *tailBuffer
	daemons *daemons // virtiofsd and swtpm processes; nil when the machine needs none

	exited chan struct{} // closed when QEMU's process has been reaped
	done   chan struct{} // closed when the exit is classified

	mu        sync.Mutex
	state     qmp.RunState
	shutdown  string // reason of the last SHUTDOWN event
	panicked  bool
	killedFor error // why the launcher killed QEMU: a daemon that ended, a failed post-copy
	migrated  bool
	// postCopyIn: the guest runs here from an incoming migration past its post-copy switch, with
	// pages still on the source. QEMU exits by itself when that migration fails (its listen
	// thread's loadvm error), which may come before the launcher ends it (killFor).
	postCopyIn bool
	exit       *protocol.Exit
	version    string
	changed    chan struct{} // closed and replaced on every state change
	closeOnce  sync.Once
	// sockets is how many sockets of vCPUs the guest has: the machine's, then more as they are
	// hot-plugged (cpu_hotplug.go).
	sockets atomic.Uint32
	// memRequested and memPlugged are the MiB the virtio-mem device was asked for and has plugged
	// (memory_hotplug.go).
	memRequested, memPlugged atomic.Int64
}

// Start starts QEMU for m and returns once the guest runs (or, for a migration target, once QEMU
// waits for the incoming migration). A QEMU that exits early is reported with its own error.
func Start(ctx context.Context, m *Machine, opts Options) (*Process, error) {
	argv, err := BuildArgv(m)
	if err != nil {
		return nil, err
	}
	if opts.QEMU == "" {
		opts.QEMU = "qemu-system-x86_64"
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 60 * time.Second
	}
	p := &Process{
		machine: m, log: opts.Log, stderr: newTailBuffer(4096),
		exited: make(chan struct{}), done: make(chan struct{}), changed: make(chan struct{}),
		state: qmp.StatePrelaunch,
	}
	p.sockets.Store(m.CPU.Sockets)
	p.memRequested.Store(m.PluggedMemoryMiB)
	p.memPlugged.Store(m.PluggedMemoryMiB)
	if m.Incoming {
		p.state = qmp.StateInMigrate
	}
	steps := []struct {
		name string
		run  func(context.Context) error
	}{
		{"prepare run directory", p.prepareRunDir},
		{"start daemons", func(context.Context) error { return p.startDaemons(opts) }},
		{"exec " + opts.QEMU, func(context.Context) error { return p.exec(opts.QEMU, argv) }},
		{"connect QMP", func(ctx context.Context) error { return p.connect(ctx, opts.StartTimeout) }},
		{"check CPU features", p.checkCPUFeatures},
		{"pin CPUs", p.pinCPUs},
		{"resume guest", p.resume},
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			p.abort()
			return nil, p.startError(s.name, err)
		}
	}
	return p, nil
}

func (p *Process) prepareRunDir(context.Context) error {
	if err := os.MkdirAll(p.machine.RunDir, 0o700); err != nil {
		return err
	}
	// Sockets from an earlier QEMU would make the wait for the new ones succeed too early.
	for _, s := range []string{p.machine.QMPSocket(), p.machine.ShellQMPSocket(), p.machine.SerialSocket(), p.machine.VNCSocket(), p.machine.PIDFile()} {
		if err := os.Remove(s); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// startDaemons starts the filesystems' and the TPM's daemons, which QEMU connects to when it
// starts.
func (p *Process) startDaemons(opts Options) error {
	d, err := startDaemons(p.machine, opts, p.log)
	if err != nil {
		return err
	}
	p.daemons = d
	return nil
}

// daemonFailed ends QEMU because a daemon it needs ended; the exit carries err.
func (p *Process) daemonFailed(err error) {
	p.log.Error(err, "ending QEMU: a daemon it needs ended")
	p.killFor(err)
}

// setPostCopyIn records whether an incoming post-copy migration is under way (postCopyIn).
func (p *Process) setPostCopyIn(on bool) {
	p.mu.Lock()
	p.postCopyIn = on
	p.mu.Unlock()
}

// killFor kills QEMU; its exit (crashed) carries err.
func (p *Process) killFor(err error) {
	p.mu.Lock()
	if p.killedFor == nil {
		p.killedFor = err
	}
	p.mu.Unlock()
	_ = p.cmd.Process.Kill()
}

func (p *Process) exec(qemu string, argv []string) error {
	cmd := exec.Command(qemu, argv...)
	cmd.Stdin = nil
	// QEMU outlives the request that started it but dies with the launcher.
	started := func() {
		p.cmd = cmd
		p.log.Info("qemu started", "pid", cmd.Process.Pid)
		if p.daemons != nil {
			go p.daemons.watch(p)
		}
	}
	return startTied(cmd, started, p.stderrLine, p.onExit)
}

func (p *Process) stderrLine(line string) {
	p.stderr.Write([]byte(line + "\n"))
	p.log.Info("qemu", "stderr", line)
}

func (p *Process) connect(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	mon, err := p.dialWhenReady(ctx)
	if err != nil {
		return err
	}
	p.mon = mon
	v := mon.Version()
	p.version = fmt.Sprintf("%d.%d.%d", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro)
	sub := mon.Subscribe(256)
	go p.watchEvents(sub)
	st, err := mon.QueryStatus(ctx)
	if err != nil {
		return err
	}
	p.setState(st.Status)
	return nil
}

// dialWhenReady connects to QEMU's monitor as soon as it listens. It sleeps until something is
// created in the run directory (inotify, through fsnotify as the device plugin watches the
// kubelet's socket): on a loaded node QEMU takes seconds to bind, and a poll every 5 ms was most
// of a launcher's start-up CPU. The file appears at bind, a moment before listen, so a refused
// connection is retried every millisecond; QEMU exiting ends the wait at once.
func (p *Process) dialWhenReady(ctx context.Context) (*qmp.Monitor, error) {
	sock := p.machine.QMPSocket()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch for the monitor socket: %w", err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(sock)); err != nil {
		return nil, fmt.Errorf("watch %s for the monitor socket: %w", filepath.Dir(sock), err)
	}
	for {
		var retry <-chan time.Time // nil: wait for a change in the directory
		if _, err := os.Stat(sock); err == nil {
			mon, err := qmp.Dial(ctx, sock)
			if err == nil {
				return mon, nil
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				return nil, err
			}
			retry = time.After(time.Millisecond)
		}
		select {
		case <-p.exited:
			return nil, errors.New("qemu exited before opening its monitor")
		case <-ctx.Done():
			return nil, fmt.Errorf("monitor socket %s did not answer: %w", sock, ctx.Err())
		case <-w.Events:
		case <-w.Errors: // an overflow: look again
		case <-retry:
		}
	}
}

func (p *Process) resume(ctx context.Context) error {
	if p.machine.Incoming || p.machine.StartPaused {
		return nil
	}
	return p.Resume(ctx)
}

// neverRan is true for the run states before the guest's first instruction: prelaunch (started
// paused) and inmigrate (a migration target waiting for the guest).
func neverRan(s qmp.RunState) bool {
	return s == qmp.StatePrelaunch || s == qmp.StateInMigrate
}

// pausedState is true for the run states in which the guest's vCPUs are stopped on request: a
// pause, or a start with startStrategy Paused (prelaunch; a migration target waits in inmigrate).
func pausedState(s qmp.RunState) bool {
	return s == qmp.StatePaused || s == qmp.StatePrelaunch
}

// startError turns a failed step into a StartError carrying QEMU's stderr once QEMU is gone.
func (p *Process) startError(step string, err error) error {
	var se *StartError
	if errors.As(err, &se) {
		return err
	}
	if p.cmd != nil {
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
		}
	}
	return &StartError{Step: step, Stderr: strings.TrimSpace(p.stderr.String()), Err: err}
}

// abort kills a QEMU whose start failed and releases what Start set up.
func (p *Process) abort() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.daemons.stop()
	p.close()
}

func (p *Process) close() {
	p.closeOnce.Do(func() {
		if p.mon != nil {
			_ = p.mon.Close()
		}
	})
}

func (p *Process) watchEvents(sub *qmp.Subscription) {
	defer sub.Close()
	for ev := range sub.Events() {
		p.onEvent(ev)
	}
}

func (p *Process) onEvent(ev gqmp.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev.Event {
	case qmp.EventReset:
		// A reboot from inside the guest (or a soft reboot) is a reset, not an end: QEMU runs
		// without -no-reboot, so the machine restarts and the run state does not change.
		p.log.Info("guest reset", "reason", ev.Data["reason"])
		return
	case qmp.EventResume:
		p.state = qmp.StateRunning
	case qmp.EventStop:
		if p.state == qmp.StateRunning {
			p.state = qmp.StatePaused
		}
	case qmp.EventShutdown:
		p.shutdown, _ = ev.Data["reason"].(string)
		p.state = qmp.StateShutdown
	case qmp.EventGuestPanicked:
		p.panicked = true
		p.state = qmp.StateGuestPanicked
	case qmp.EventMemoryDeviceSizeChange:
		if !p.onMemorySizeChange(ev) {
			return
		}
	case qmp.EventMigration:
		s, _ := ev.Data["status"].(string)
		if s == string(qmp.MigrationCompleted) && p.machine.Incoming {
			// Not under p.mu, and not on this goroutine, which must go on reading events.
			go p.refreshMemorySize(context.Background())
		}
		if s == string(qmp.MigrationCompleted) && !p.machine.Incoming {
			p.migrated = true
			p.state = qmp.StatePostMigrate
		}
	default:
		return
	}
	p.notifyLocked()
}

func (p *Process) setState(s qmp.RunState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = s
	p.notifyLocked()
}

func (p *Process) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Process) onExit(waitErr error) {
	close(p.exited)
	p.daemons.stop() // the daemons serve this QEMU only
	exit := p.classify(waitErr)
	p.mu.Lock()
	p.exit = &exit
	p.state = qmp.StateShutdown
	p.notifyLocked()
	p.mu.Unlock()
	p.log.Info("qemu exited", "reason", exit.Reason, "detail", exit.Detail)
	p.close()
	close(p.done)
}

// classify says why QEMU ended from its wait status and the events it sent before.
func (p *Process) classify(waitErr error) protocol.Exit {
	p.mu.Lock()
	shutdown, panicked, migrated, connected, killedFor, postCopyIn := p.shutdown, p.panicked, p.migrated, p.mon != nil, p.killedFor, p.postCopyIn
	p.mu.Unlock()
	e := protocol.Exit{At: time.Now()}
	if killedFor != nil {
		e.Reason, e.Detail = protocol.ExitCrashed, killedFor.Error()
		return e
	}
	var ee *exec.ExitError
	switch {
	case errors.As(waitErr, &ee) && ee.ProcessState != nil:
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Reason, e.Detail = protocol.ExitKilled, "signal "+ws.Signal().String()
			return e
		}
		e.Detail = fmt.Sprintf("exit code %d: %s", ee.ExitCode(), strings.TrimSpace(p.stderr.String()))
		e.Reason = protocol.ExitCrashed
		if postCopyIn {
			e.Detail = postCopySplit("QEMU " + e.Detail)
		}
		if !connected {
			e.Reason = protocol.ExitFailedToStart
		}
		return e
	case waitErr != nil:
		e.Reason, e.Detail = protocol.ExitCrashed, waitErr.Error()
		return e
	}
	switch {
	case panicked:
		e.Reason = protocol.ExitGuestPanicked
	case migrated:
		e.Reason = protocol.ExitMigrated
	case shutdown == "guest-shutdown":
		e.Reason = protocol.ExitGuestShutdown
	case shutdown != "":
		e.Reason, e.Detail = protocol.ExitQuit, shutdown
	case !connected:
		e.Reason, e.Detail = protocol.ExitFailedToStart, strings.TrimSpace(p.stderr.String())
	default:
		e.Reason, e.Detail = protocol.ExitQuit, "exit code 0"
	}
	return e
}

// Monitor is the launcher's QMP connection to this QEMU.
func (p *Process) Monitor() *qmp.Monitor { return p.mon }

// Machine is the machine this process runs.
func (p *Process) Machine() *Machine { return p.machine }

// Pid is QEMU's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// QEMUVersion is the version QEMU announced in its QMP greeting.
func (p *Process) QEMUVersion() string { return p.version }

// Done is closed once QEMU has exited and Exit is known.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait blocks until QEMU exits or ctx ends, and returns how it ended.
func (p *Process) Wait(ctx context.Context) (protocol.Exit, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return *p.exit, nil
	case <-ctx.Done():
		return protocol.Exit{}, ctx.Err()
	}
}

// State is the current run state and a channel closed at the next change.
func (p *Process) State() (qmp.RunState, *protocol.Exit, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var exit *protocol.Exit
	if p.exit != nil {
		e := *p.exit
		exit = &e
	}
	return p.state, exit, p.changed
}

// Pause stops the guest's vCPUs. The run state is read back before returning, so a Status taken
// right after reflects it without waiting for the STOP event.
func (p *Process) Pause(ctx context.Context) error {
	if err := p.mon.Stop(ctx); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	return p.refreshState(ctx)
}

// Resume restarts the guest's vCPUs.
func (p *Process) Resume(ctx context.Context) error {
	if err := p.mon.Cont(ctx); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return p.refreshState(ctx)
}

// currentState asks QEMU for the run state (an operator's QMP shell may have changed it a moment
// ago) and records it.
func (p *Process) currentState(ctx context.Context) (qmp.RunState, error) {
	if err := p.refreshState(ctx); err != nil {
		return "", err
	}
	state, _, _ := p.State()
	return state, nil
}

func (p *Process) refreshState(ctx context.Context) error {
	st, err := p.mon.QueryStatus(ctx)
	if err != nil {
		return fmt.Errorf("query status: %w", err)
	}
	p.setState(st.Status)
	return nil
}

// Reset resets the guest like its reset button.
func (p *Process) Reset(ctx context.Context) error {
	if err := p.mon.SystemReset(ctx); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	return nil
}

// Kill ends QEMU at once with SIGKILL.
func (p *Process) Kill() error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill qemu: %w", err)
	}
	return nil
}

// Shutdown presses the ACPI power button and waits up to grace for the guest to power off; then it
// tells QEMU to quit, and kills it if that does not work either. It returns once QEMU is gone.
func (p *Process) Shutdown(ctx context.Context, grace time.Duration) (protocol.Exit, error) {
	select {
	case <-p.done:
		return p.Wait(ctx)
	default:
	}
	if state, _, _ := p.State(); neverRan(state) {
		// No guest has run yet (started paused, or a migration target still waiting): nothing can
		// answer the power button and nothing can be lost.
		p.log.Info("the guest never ran; quitting without a grace period", "runState", state)
		grace = 0
	} else if err := p.mon.SystemPowerdown(ctx); err != nil && !errors.Is(err, qmp.ErrDisconnected) {
		p.log.Error(err, "ACPI powerdown failed; quitting")
		grace = 0
	}
	select {
	case <-p.done:
		return p.Wait(ctx)
	case <-time.After(grace):
	case <-ctx.Done():
		return protocol.Exit{}, ctx.Err()
	}
	p.log.Info("guest did not power off within the grace period; quitting", "grace", grace)
	quitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := p.mon.Quit(quitCtx); err == nil {
		select {
		case <-p.done:
			return p.Wait(ctx)
		case <-time.After(5 * time.Second):
		}
	}
	if err := p.Kill(); err != nil {
		return protocol.Exit{}, err
	}
	return p.Wait(ctx)
}

// tailBuffer keeps the last n bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func newTailBuffer(n int) *tailBuffer { return &tailBuffer{n: n} }

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > t.n {
		t.buf = t.buf[len(t.buf)-t.n:]
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
