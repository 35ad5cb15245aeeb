package launcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// Resolver finds a machine's kernel, initrd and disk images on this host, creating those the
// launcher makes (emptyDisks). Run mode resolves host paths; a launcher pod resolves the volumes
// mounted into it. ResolveDisk is called again for each disk hot-plugged while the VM runs, and
// must create nothing but that disk's image; errors are at p.
type Resolver interface {
	Resolve(m *machine.Machine, runDir string) (*Machine, error)
	ResolveDisk(d *machine.Disk, runDir string, p machine.Path) (DiskImage, *machine.FieldError)
}

// Launcher owns one VM: it starts QEMU on Sync and serves the node agent's commands. Safe for
// concurrent use.
type Launcher struct {
	runDir   string
	resolver Resolver
	opts     Options

	mu        sync.Mutex
	req       *protocol.SyncRequest
	proc      *Process
	phase     protocol.Phase
	startErr  string
	migration *protocol.MigrationInfo
	hotplug   map[string]hotDisk
	nics      map[string]hotNIC
	cpuPlug   sync.Mutex  // held by SetSockets
	memPlug   sync.Mutex  // held by SetGuestMemory
	blocks    blockState  // block migration (blockmigration.go)
	agent     *agentState // the current QEMU's guest agent (agent.go); nil without a channel
	changed   chan struct{}

	// terminated (guarded by mu): the launcher's process was told to stop (SIGTERM) and stops
	// the guest.
	terminated bool

	// volumes serialises HotplugDisk and UnplugDisk, which resolve and clean up images outside mu.
	volumes sync.Mutex
}

// New returns a launcher that keeps QEMU's sockets in runDir.
func New(runDir string, resolver Resolver, opts Options) *Launcher {
	return &Launcher{runDir: runDir, resolver: resolver, opts: opts, phase: protocol.PhaseWaiting,
		hotplug: map[string]hotDisk{}, nics: map[string]hotNIC{}, changed: make(chan struct{})}
}

// ConflictError is returned for a request that does not fit the launcher's state.
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

// Sync starts the VM described by req. A second Sync for the same UID is a no-op; one for another
// UID is a conflict, since a launcher runs exactly one VM in its life.
func (l *Launcher) Sync(ctx context.Context, req *protocol.SyncRequest) error {
	l.mu.Lock()
	if l.req != nil {
		running := l.req.Machine.UID
		l.mu.Unlock()
		if running == req.Machine.UID {
			return nil
		}
		return &ConflictError{Msg: fmt.Sprintf("launcher already runs VMI %s", running)}
	}
	m, err := l.resolver.Resolve(&req.Machine, l.runDir)
	if err != nil {
		l.mu.Unlock()
		return err
	}
	m.Incoming = req.Incoming
	placedNICs, err := placeNICs(m)
	if err != nil {
		l.mu.Unlock()
		return err
	}
	l.req = req
	l.phase = protocol.PhaseStarting
	for _, d := range m.Disks {
		if d.Port != "" {
			l.hotplug[d.Name] = hotDisk{Disk: d, img: m.Images[d.Name]}
		}
	}
	l.notifyLocked()
	l.mu.Unlock()

	proc, err := Start(ctx, m, l.opts)
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.notifyLocked()
	if err != nil {
		stopNICDHCP(placedNICs)
		l.phase, l.startErr = protocol.PhaseFailed, err.Error()
		return err
	}
	l.proc = proc
	l.adoptNICs(proc, placedNICs)
	l.phase = protocol.PhaseRunning
	if req.Incoming {
		l.phase = protocol.PhaseIncoming
	}
	go l.follow(proc)
	l.serveDHCP(proc, m.NICs)
	if m.GuestAgent {
		l.agent = newAgentState()
		go l.watchAgent(proc, l.agent)
	}
	if m.DownwardMetrics != nil {
		go l.serveDownwardMetrics(proc)
	}
	return nil
}

// serveDHCP runs a DHCP server for each interface that wants one, for as long as QEMU runs. A
// server that cannot start is logged: the guest then keeps asking, and its NIC has no address.
func (l *Launcher) serveDHCP(p *Process, nics []machine.NIC) {
	for _, in := range nics {
		if in.DHCP == nil || in.Port != "" {
			continue // hot-plugged NICs have their own servers (placeNICs)
		}
		lease, err := leaseFor(in.DHCP, in.MAC)
		if err != nil {
			l.opts.Log.Error(err, "no DHCP for interface", "interface", in.Name)
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-p.Done()
			cancel()
		}()
		go func() {
			if err := ServeDHCP(ctx, in.DHCP.Interface, lease); err != nil {
				l.opts.Log.Error(err, "DHCP server stopped", "interface", in.Name)
			}
		}()
	}
}

// follow forwards the process's state changes to watchers until QEMU exits, then discards the
// images the launcher created for the VM.
func (l *Launcher) follow(p *Process) {
	for {
		state, exit, changed := p.State()
		l.mu.Lock()
		if l.phase == protocol.PhaseIncoming && state == qmp.StateRunning {
			l.phase = protocol.PhaseRunning
		}
		l.notifyLocked()
		l.mu.Unlock()
		if exit != nil {
			l.removeEphemeralImages(p)
			return
		}
		<-changed
	}
}

// phaseOf is the phase of a VM whose launcher recorded phase: once QEMU has exited, its exit
// decides it. The exit is the one record of the end, so a caller reading right after Shutdown or
// Wait returned sees the end as the exit says, whether follow has woken yet or not.
func phaseOf(recorded protocol.Phase, exit *protocol.Exit) protocol.Phase {
	switch {
	case exit == nil:
		return recorded
	case exit.Reason.Clean():
		return protocol.PhaseSucceeded
	default:
		return protocol.PhaseFailed
	}
}

// currentPhase is phaseOf the recorded phase and QEMU's exit, if it has exited.
func (l *Launcher) currentPhase() protocol.Phase {
	l.mu.Lock()
	phase, proc := l.phase, l.proc
	l.mu.Unlock()
	if proc == nil {
		return phase
	}
	_, exit, _ := proc.State()
	return phaseOf(phase, exit)
}

// removeEphemeralImages deletes the emptyDisk images and containerDisk overlays of a VM whose QEMU
// has exited: what the guest wrote there ends with it, as in KubeVirt, and the node's disk space
// comes back now rather than when the pod is deleted (a finished pod keeps its emptyDirs).
func (l *Launcher) removeEphemeralImages(p *Process) {
	m := p.Machine()
	for name, img := range m.Images {
		removeEphemeral(name, img)
	}
	l.volumes.Lock()
	defer l.volumes.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, d := range l.hotplug {
		removeEphemeral(name, d.img)
	}
}

// notify is notifyLocked for a caller that does not hold l.mu.
func (l *Launcher) notify() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notifyLocked()
}

func (l *Launcher) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Status reports the VM's state and a channel closed at the next change.
func (l *Launcher) Status(ctx context.Context) (protocol.Status, <-chan struct{}) {
	l.mu.Lock()
	st := protocol.Status{Phase: l.phase, StartError: l.startErr, Migration: l.migration, Terminated: l.terminated}
	if l.req != nil {
		st.UID = l.req.Machine.UID
	}
	proc, changed, agent := l.proc, l.changed, l.agent
	for _, d := range l.hotplug {
		st.Hotplugged = append(st.Hotplugged, d.Disk)
	}
	l.mu.Unlock()
	if proc == nil {
		return st, changed
	}
	state, exit, _ := proc.State()
	st.RunState = string(state)
	st.Paused = pausedState(state)
	st.QEMUVersion = proc.QEMUVersion()
	st.PID = proc.Pid()
	st.Sockets = proc.Sockets()
	st.Memory = proc.memoryStatus()
	st.Exit = exit
	st.Phase = phaseOf(st.Phase, exit)
	st.Disks, st.NICs = l.devices(proc)
	if agent != nil {
		st.GuestAgent = agent.snapshot()
	}
	return st, changed
}

func (l *Launcher) devices(p *Process) ([]protocol.DiskStatus, []protocol.NICStatus) {
	m := p.Machine()
	var disks []protocol.DiskStatus
	var nics []protocol.NICStatus
	for _, d := range m.Disks {
		if d.Port == "" {
			disks = append(disks, protocol.DiskStatus{Name: d.Name, BlockSize: volumeBlockSizeStatus(&d)})
		}
	}
	for _, n := range m.NICs {
		if n.Port == "" {
			nics = append(nics, protocol.NICStatus{Name: n.Name, MAC: n.MAC})
		}
	}
	cold := len(nics)
	l.mu.Lock()
	for name, hot := range l.hotplug {
		disks = append(disks, protocol.DiskStatus{Name: name, Hotplugged: true, BlockSize: volumeBlockSizeStatus(&hot.Disk)})
	}
	for name, n := range l.nics {
		nics = append(nics, protocol.NICStatus{Name: name, MAC: n.MAC, Hotplugged: true, Port: n.Port})
	}
	l.mu.Unlock()
	slices.SortFunc(nics[cold:], func(a, b protocol.NICStatus) int { return strings.Compare(a.Name, b.Name) })
	return disks, nics
}

// ErrNotRunning is returned for commands that need a running QEMU.
var ErrNotRunning = errors.New("no QEMU is running")

func (l *Launcher) process() (*Process, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.proc == nil {
		return nil, &ConflictError{Msg: ErrNotRunning.Error()}
	}
	select {
	case <-l.proc.Done():
		return nil, &ConflictError{Msg: "QEMU has exited"}
	default:
	}
	return l.proc, nil
}

// Pause stops the guest's vCPUs.
func (l *Launcher) Pause(ctx context.Context) error {
	p, err := l.pausable()
	if err != nil {
		return err
	}
	state, err := p.currentState(ctx)
	if err != nil {
		return err
	}
	if state != qmp.StateRunning {
		return &ConflictError{Msg: fmt.Sprintf("VMI is not running (QEMU run state %q): nothing to pause", state)}
	}
	return p.Pause(ctx)
}

// Resume restarts the guest's vCPUs, or starts them for a guest started paused.
func (l *Launcher) Resume(ctx context.Context) error {
	p, err := l.pausable()
	if err != nil {
		return err
	}
	state, err := p.currentState(ctx)
	if err != nil {
		return err
	}
	if !pausedState(state) {
		return &ConflictError{Msg: fmt.Sprintf("VMI is not paused (QEMU run state %q)", state)}
	}
	return p.Resume(ctx)
}

// pausable is the process, unless a migration is under way: pausing or resuming then would race
// with the run state the migration hands over (KubeVirt refuses too).
func (l *Launcher) pausable() (*Process, error) {
	l.mu.Lock()
	mig := l.migration
	l.mu.Unlock()
	if mig != nil && (!migrationDone(mig.Status) || mig.Handover == protocol.HandoverHolding) {
		return nil, &ConflictError{Msg: "a migration of this VMI is under way; pause or unpause it once the migration has ended"}
	}
	return l.process()
}

// Reset resets the guest.
func (l *Launcher) Reset(ctx context.Context) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	return p.Reset(ctx)
}

// pausedRefusal is the refusal of a soft reboot while the vCPUs are stopped: the keys would wait in
// the keyboard controller and reboot the guest at some later unpause, which nobody expects.
const pausedRefusal = "VMI is paused; unpause it first"

// SoftReboot asks the guest to reboot itself by pressing Ctrl+Alt+Del on its keyboard; there is no
// guest agent. Linux hands the keys to init (busybox and systemd reboot cleanly), so the guest
// syncs and restarts its own way; it returns once the keys are sent, not when the guest is back.
// Until the guest's init has claimed the keys (busybox init and systemd do so at start), the
// Linux kernel's default is an immediate restart, without a clean shutdown.
// QEMU runs without -no-reboot, so the guest's reset is a RESET event and QEMU, the launcher's
// phase and the run state stay as they are.
func (l *Launcher) SoftReboot(ctx context.Context) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	// Ask QEMU rather than the event-tracked state: a pause from the operator QMP shell may not
	// have been seen yet.
	st, err := p.Monitor().QueryStatus(ctx)
	if err != nil {
		return fmt.Errorf("soft reboot: %w", err)
	}
	switch st.Status {
	case qmp.StateRunning:
	case qmp.StatePaused, qmp.StatePrelaunch:
		return &ConflictError{Msg: pausedRefusal}
	default:
		return &ConflictError{Msg: fmt.Sprintf("the guest is not running (QEMU run state %q): nothing to reboot", st.Status)}
	}
	if err := p.Monitor().SendKey(ctx, "ctrl", "alt", "delete"); err != nil {
		return fmt.Errorf("soft reboot: send Ctrl+Alt+Del: %w", err)
	}
	l.opts.Log.Info("soft reboot: Ctrl+Alt+Del sent to the guest")
	return nil
}

// Kill ends QEMU at once.
func (l *Launcher) Kill(context.Context) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	return p.Kill()
}

// Shutdown stops the guest gracefully; grace nil means the machine's grace period. It returns once
// QEMU is gone.
func (l *Launcher) Shutdown(ctx context.Context, grace *int64) (protocol.Exit, error) {
	p, err := l.process()
	if err != nil {
		return protocol.Exit{}, err
	}
	if l.handingOver() {
		// The guest runs on neither side of a handover: nothing answers the power button, and
		// nothing is lost by quitting now.
		grace = ptrTo(int64(0))
	}
	return p.Shutdown(ctx, GracePeriod(p.Machine(), grace))
}

// terminate records that the launcher's process was told to stop (SIGTERM), before it stops the
// guest: Status says so, so that the node agent can tell a guest stopped because its pod's
// container was stopped from one that powered off by itself.
func (l *Launcher) terminate() {
	l.mu.Lock()
	l.terminated = true
	l.notifyLocked()
	l.mu.Unlock()
}

// GracePeriod is the shutdown grace period: the override, else the machine's.
func GracePeriod(m *Machine, override *int64) time.Duration {
	if override != nil {
		return time.Duration(*override) * time.Second
	}
	return time.Duration(m.GracePeriodSeconds) * time.Second
}

// Wait blocks until QEMU has exited (after a successful Sync) or ctx ends.
func (l *Launcher) Wait(ctx context.Context) (protocol.Exit, error) {
	p, err := l.anyProcess()
	if err != nil {
		return protocol.Exit{}, err
	}
	return p.Wait(ctx)
}

func (l *Launcher) anyProcess() (*Process, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.proc == nil {
		return nil, ErrNotRunning
	}
	return l.proc, nil
}

// volumeBlockSizeStatus is the block sizes d took from its volume, for the node agent to record;
// nil for a disk whose sizes are its own.
func volumeBlockSizeStatus(d *machine.Disk) *machine.BlockSize {
	if !d.MatchVolumeBlockSize {
		return nil
	}
	return d.BlockSize
}
