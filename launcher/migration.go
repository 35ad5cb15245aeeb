package launcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"

	"github.com/qvirt/qvirt/qmp"
)

// Live migration: the target launcher is synced with Incoming (QEMU waits under -incoming defer with
// the source's device set), then told where to listen; the source launcher sets capabilities and
// parameters and runs migrate. Progress comes from MIGRATION events plus query-migrate. Once QEMU
// has moved the guest, both sides hold it paused until the node agents say which one runs it: the
// handover (switchover.go). The source QEMU then quits, ending with ExitMigrated, or takes the
// guest back.
//
// The source gives up its guest only once the target holds it: with the return-path capability
// the target QEMU acknowledges over the migration connection (MIG_RP_MSG_SHUT) after it has loaded
// the whole state, and the source QEMU reports completed only after that acknowledgement. A target
// that fails to load, is killed or loses the connection before then makes the source report
// failed; QEMU then restarts the source's vCPUs, and resumeAfterFailure makes sure of it, so the
// guest keeps running here with its state.

// progressInterval is how often query-migrate refreshes progress while a migration is active. A
// terminal status seen there ends the wait as the MIGRATION event does, whichever comes first:
// the guest stays paused until the source has finished.
const progressInterval = 20 * time.Millisecond

// ListenUnix asks PrepareMigrationTarget for a unix socket in the launcher's own directory
// (Dir.MigrationIn) instead of a TCP port: nothing outside the pod but the node agent reaches it,
// and the agent brings the stream there over the node agents' mutual TLS.
const ListenUnix = "unix"

// PrepareMigrationTarget makes an incoming QEMU listen on req.Listen (ListenUnix, or host:port
// where port 0 picks a free one), over req.Parallel's streams, and returns the URI the source
// must use.
func (l *Launcher) PrepareMigrationTarget(ctx context.Context, req protocol.MigrationTarget) (string, error) {
	if err := validateParallel(req.Parallel); err != nil {
		return "", err
	}
	uri, err := l.incomingURI(req.Listen)
	if err != nil {
		return "", err
	}
	p, err := l.process()
	if err != nil {
		return "", err
	}
	if !p.Machine().Incoming {
		return "", &ConflictError{Msg: "this launcher was not started for an incoming migration"}
	}
	mon := p.Monitor()
	caps := append(slices.Clone(targetCapabilities), qmp.MigrationCapabilityStatus{Capability: qmp.CapMultifd, State: req.Parallel != nil})
	if err := mon.MigrateSetCapabilities(ctx, caps); err != nil {
		return "", fmt.Errorf("prepare migration target: %w", err)
	}
	if req.PostCopyRecovery < 0 || (req.PostCopyRecovery > 0 && !req.PostCopy) {
		return "", machine.Invalid("postCopyRecovery", req.PostCopyRecovery, "must be 0 or more, and needs postCopy")
	}
	if req.PostCopy {
		if req.Parallel != nil {
			return "", machine.Invalid("postCopy", true, "cannot be combined with parallel streams: QEMU 7.2 sends post-copy pages over the main stream only")
		}
		// QEMU opens a userfaultfd here to check it may: an unprivileged launcher may not unless
		// the node sets vm.unprivileged_userfaultfd=1.
		if err := mon.MigrateSetCapabilities(ctx, []qmp.MigrationCapabilityStatus{{Capability: qmp.CapPostcopyRAM, State: true}}); err != nil {
			return "", fmt.Errorf("prepare migration target: post-copy needs userfaultfd, which QEMU may not open here (the node's sysctl vm.unprivileged_userfaultfd must be 1, and the pod's seccomp profile must allow the syscall): %w", err)
		}
	}
	if params, ok := parallelParameters(req.Parallel); ok {
		if err := mon.MigrateSetParameters(ctx, params); err != nil {
			return "", fmt.Errorf("prepare migration target: set parameters: %w", err)
		}
	}
	if err := l.exportLocalDisks(ctx, p); err != nil {
		return "", fmt.Errorf("prepare migration target: %w", err)
	}
	done := mon.NewWaiter(qmp.EventMigration, migrationFinished)
	var postCopy *qmp.Waiter
	if req.PostCopy {
		postCopy = mon.NewWaiter(qmp.EventMigration, postCopyStarted)
	}
	if err := mon.MigrateIncoming(ctx, uri); err != nil {
		done.Cancel()
		if postCopy != nil {
			postCopy.Cancel()
		}
		return "", fmt.Errorf("prepare migration target: %w", err)
	}
	l.setMigration(&protocol.MigrationInfo{Role: protocol.RoleTarget, Status: string(qmp.MigrationSetup)})
	go l.finishIncoming(p, done, postCopy, req.PostCopyRecovery)
	return uri, nil
}

// incomingURI is the migrate-incoming URI for listen.
func (l *Launcher) incomingURI(listen string) (string, error) {
	if listen == ListenUnix {
		path := Dir(l.runDir).MigrationIn()
		// A socket left by an earlier attempt would make QEMU's bind fail.
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("prepare migration target: %w", err)
		}
		return "unix:" + path, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil || net.ParseIP(host) == nil {
		return "", machine.Invalid("listen", listen, "must be IP:PORT or "+ListenUnix)
	}
	if port == "0" {
		if port, err = freePort(host); err != nil {
			return "", err
		}
	}
	return "tcp:" + net.JoinHostPort(host, port), nil
}

// freePort asks the kernel for a free TCP port on host. QEMU binds it moments later; the window
// for another process to take it is small and the migration then fails loudly.
func freePort(host string) (string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("find a free port on %s: %w", host, err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// migrationFinished: a MIGRATION event that ends the migration, or pauses it after the switch to
// post-copy (postcopy-paused: its link broke; see postcopy.go for the recovery).
func migrationFinished(ev gqmp.Event) bool {
	s, _ := ev.Data["status"].(string)
	return migrationDone(s) && s != string(qmp.MigrationNone)
}

// finishIncoming records the end of the incoming migration. On completion QEMU (started with -S)
// holds the guest paused, or in prelaunch if it never ran on the source, until RunMigrated. With
// postCopy (nil without), the guest is this side's from the post-copy switch (takePostCopy), and
// a failure after it ends QEMU (or waits for a recovery: finishIncomingPostCopy).
func (l *Launcher) finishIncoming(p *Process, done, postCopy *qmp.Waiter, recovery time.Duration) {
	ended := eventChan(done)
	var switched <-chan gqmp.Event // nil: never ready
	if postCopy != nil {
		defer postCopy.Cancel()
		switched = eventChan(postCopy)
	}
	var ev gqmp.Event
	for wait := true; wait; {
		var ok bool
		select {
		case _, ok = <-switched:
			switched = nil
			if ok {
				l.takePostCopy(p)
			}
		case ev, ok = <-ended:
			if !ok {
				l.postCopyLost() // QEMU went away; the process's exit says why
				return
			}
			wait = false
		}
	}
	status, _ := ev.Data["status"].(string)
	if l.inPostCopy() {
		l.finishIncomingPostCopy(p, status, recovery)
		return
	}
	info := &protocol.MigrationInfo{Role: protocol.RoleTarget, Status: status}
	if status == string(qmp.MigrationCompleted) {
		if err := l.stopDiskExport(p); err != nil {
			info.Error = err.Error()
		}
		info.Handover = protocol.HandoverHolding
		// No event tells the run state the guest arrived in: ask.
		if err := p.refreshState(context.Background()); err != nil {
			info.Error = err.Error()
		}
	}
	l.setMigration(info)
}

// MigrateSource starts sending the guest to req.URI and returns once QEMU accepted the command;
// Status reports progress.
func (l *Launcher) MigrateSource(ctx context.Context, req *protocol.MigrationSource) error {
	if err := validateMigrationSource(req); err != nil {
		return err
	}
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	active := l.migration != nil && l.migration.Role == protocol.RoleSource && !migrationDone(l.migration.Status)
	l.mu.Unlock()
	if active {
		return &ConflictError{Msg: "a migration is already running"}
	}
	if err := migrationUnderTCGRefused(p.Machine()); err != nil {
		return err
	}
	disks := l.localDisks(p)
	if err := checkPostCopy(req, len(disks)); err != nil {
		return err
	}
	if err := checkBlockMigration(req, disks); err != nil {
		return err
	}
	l.setMirror(nil)
	before, err := p.currentState(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	mon := p.Monitor()
	caps := []qmp.MigrationCapabilityStatus{
		{Capability: qmp.CapEvents, State: true},
		{Capability: qmp.CapReturnPath, State: true}, // see the contract at the top of this file
		{Capability: qmp.CapAutoConverge, State: req.AutoConverge},
		{Capability: qmp.CapPostcopyRAM, State: req.PostCopy},
		// Local disks are handed over while the guest is paused before the switch-over (blockmigration.go).
		{Capability: qmp.CapPauseBeforeSwitchover, State: len(disks) > 0},
		{Capability: qmp.CapMultifd, State: req.Parallel != nil},
	}
	if err := mon.MigrateSetCapabilities(ctx, caps); err != nil {
		return fmt.Errorf("migrate: set capabilities: %w", err)
	}
	if params, ok := migrationParameters(req); ok {
		if err := mon.MigrateSetParameters(ctx, params); err != nil {
			return fmt.Errorf("migrate: set parameters: %w", err)
		}
	}
	if len(disks) > 0 {
		return l.migrateWithDisks(ctx, p, req, disks, before == qmp.StateRunning)
	}
	post := postCopyWatch{allowed: req.PostCopy, after: req.PostCopyAfter, recovery: req.PostCopyRecovery}
	return l.startMemoryMigration(ctx, p, req.URI, req.ProgressTimeout, post, before == qmp.StateRunning)
}

// startMemoryMigration sends the guest to uri and follows the migration (followOutgoing).
func (l *Launcher) startMemoryMigration(ctx context.Context, p *Process, uri string, progressTimeout time.Duration, post postCopyWatch, wasRunning bool) error {
	done := p.Monitor().NewWaiter(qmp.EventMigration, migrationFinished)
	if err := p.Monitor().Migrate(ctx, qmp.MigrateOptions{URI: uri}); err != nil {
		done.Cancel()
		return fmt.Errorf("migrate to %s: %w", uri, err)
	}
	l.setMigration(&protocol.MigrationInfo{Role: protocol.RoleSource, Status: string(qmp.MigrationSetup)})
	post.begun = time.Now()
	go l.followOutgoing(p, done, stallWatch{timeout: progressTimeout}, post, wasRunning)
	return nil
}

func validateMigrationSource(req *protocol.MigrationSource) error {
	if err := validateMigrationURI(req.URI); err != nil {
		return err
	}
	if req.DowntimeLimit < 0 {
		return machine.Invalid("downtimeLimit", req.DowntimeLimit, "must be 0 or more")
	}
	return validateParallel(req.Parallel)
}

// validateMigrationURI checks the target URI a source sends to.
func validateMigrationURI(uri string) error {
	if path, isUnix := strings.CutPrefix(uri, "unix:"); isUnix {
		if !filepath.IsAbs(path) {
			return machine.Invalid("uri", uri, "must be unix:/ABSOLUTE/PATH or tcp:IP:PORT")
		}
		return nil
	}
	addr, isTCP := strings.CutPrefix(uri, "tcp:")
	host, port, err := net.SplitHostPort(addr)
	if !isTCP || err != nil || net.ParseIP(host) == nil || port == "" || port == "0" {
		return machine.Invalid("uri", uri, "must be tcp:IP:PORT or unix:/ABSOLUTE/PATH")
	}
	return nil
}

// validateParallel checks a request's parallel streams; nil is one stream.
func validateParallel(p *protocol.ParallelStreams) error {
	if p == nil {
		return nil
	}
	if p.Channels < 1 || p.Channels > protocol.MaxParallelChannels {
		return machine.Invalid("parallel.channels", p.Channels, fmt.Sprintf("must be 1 to %d", protocol.MaxParallelChannels))
	}
	switch p.Compression {
	case "", protocol.CompressionNone, protocol.CompressionZstd:
		return nil
	}
	return machine.Invalid("parallel.compression", p.Compression, "must be none or zstd")
}

// parallelParameters are the migrate-set-parameters of parallel streams, the same on both ends.
func parallelParameters(p *protocol.ParallelStreams) (qmp.MigrateParameters, bool) {
	if p == nil {
		return qmp.MigrateParameters{}, false
	}
	compression := p.Compression
	if compression == "" {
		compression = protocol.CompressionNone
	}
	return qmp.MigrateParameters{MultifdChannels: ptrTo(int64(p.Channels)), MultifdCompression: &compression}, true
}

// migrationParameters maps the request to migrate-set-parameters; a negative bandwidth lifts
// QEMU's default cap.
func migrationParameters(req *protocol.MigrationSource) (qmp.MigrateParameters, bool) {
	var p qmp.MigrateParameters
	set := false
	switch {
	case req.BandwidthBytesPerSecond > 0:
		p.MaxBandwidth, set = ptrTo(req.BandwidthBytesPerSecond), true
		if req.PostCopy {
			// The cap holds after a switch to post-copy too (QEMU's default there is none); the
			// pages the guest asks for still go first.
			p.MaxPostcopyBandwidth = ptrTo(req.BandwidthBytesPerSecond)
		}
	case req.BandwidthBytesPerSecond < 0:
		p.MaxBandwidth, set = ptrTo(int64(1)<<62), true
	}
	if req.DowntimeLimit > 0 {
		p.DowntimeLimit, set = ptrTo(req.DowntimeLimit.Milliseconds()), true
	}
	if par, ok := parallelParameters(req.Parallel); ok {
		p.MultifdChannels, p.MultifdCompression, set = par.MultifdChannels, par.MultifdCompression, true
	}
	return p, set
}

// followOutgoing refreshes progress until the migration ends, then holds the guest after a success
// (the target loaded it: the return path said so; see holdOutgoing), or makes sure a guest that
// ran before the migration runs again after a failure. A migration that stalls (stallWatch) is
// cancelled, and its failure says why; one allowed to switch to post-copy does when it is due
// (postCopyWatch), and a failure after the switch ends QEMU (failPostCopy).
func (l *Launcher) followOutgoing(p *Process, done *qmp.Waiter, stall stallWatch, post postCopyWatch, wasRunning bool) {
	mon := p.Monitor()
	finished := make(chan gqmp.Event, 1)
	go func() {
		if ev, err := done.Wait(context.Background()); err == nil {
			finished <- ev
		}
		close(finished)
	}()
	tick := time.NewTicker(progressInterval)
	defer tick.Stop()
	stalled := ""
	for {
		select {
		case <-tick.C:
			info := l.refreshMigration(mon)
			post.seen(info, time.Now(), l.opts.Log)
			if stalled == "" && stall.stalled(info, time.Now()) {
				stalled = stall.reason()
				l.cancelStalled(stalled)
			}
			if post.due(info, wasRunning, time.Now()) {
				post.asked = true
				l.startPostCopy(mon)
			}
			if info == nil || !migrationDone(info.Status) {
				continue
			}
		case _, ok := <-finished:
			if !ok {
				finished = nil // its one event came: the ticks follow a recovery from here
				continue
			}
		case <-p.Done():
			return
		}
		waitMigrationSettled(mon)
		info := l.refreshMigration(mon)
		if info != nil && !migrationDone(info.Status) {
			continue // it went on: a paused post-copy resumed as the pause was sampled
		}
		if post.awaitsResume(info, time.Now(), l.opts.Log) {
			continue
		}
		if info != nil && stalled != "" && info.Status != string(qmp.MigrationCompleted) {
			info.Error = stalled
			l.setMigration(info)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		switch {
		case info != nil && info.Status == string(qmp.MigrationCompleted):
			l.holdOutgoing(info, wasRunning)
		case info != nil && info.PostCopy:
			l.failPostCopy(p, info)
		case wasRunning:
			l.resumeAfterFailure(ctx, p, info)
		}
		cancel()
		return
	}
}

// stallWatch tells when an outgoing migration has made no progress for timeout, as KubeVirt's
// migrations.progressTimeout does: the memory still to send has not fallen below its lowest so far
// (a guest dirtying memory faster than the link carries it never converges, and without this
// would stop only at the completion timeout, tens of minutes later for a large guest). The copy of
// the local disks before it is watched the same way (mirror.waitReady); the switch-over after it
// has its own end.
type stallWatch struct {
	timeout time.Duration // zero: never stalled
	lowest  int64
	since   time.Time
}

func (w *stallWatch) stalled(info *protocol.MigrationInfo, now time.Time) bool {
	if info == nil || info.Status != string(qmp.MigrationActive) {
		return false
	}
	return w.noProgress(info.RemainingBytes, now)
}

// noProgress tells whether remaining has not fallen below its lowest so far for the timeout.
func (w *stallWatch) noProgress(remaining int64, now time.Time) bool {
	if w.timeout <= 0 {
		return false
	}
	if w.since.IsZero() || remaining < w.lowest {
		w.lowest, w.since = remaining, now
		return false
	}
	return now.Sub(w.since) >= w.timeout
}

func (w *stallWatch) reason() string {
	return fmt.Sprintf("no progress for %s (the memory still to send stayed at or above %d bytes): the migration was aborted (progressTimeout)", w.timeout, w.lowest)
}

// copyStalled tells whether the local disks' copy has copied nothing more than copied bytes for
// the timeout. The bytes copied must rise, rather than the data still to copy fall: a mirror
// reports no length at all until it has scanned its disk, and its length grows as the guest
// writes, so a first sample of nothing left would make every later one look stalled.
func (w *stallWatch) copyStalled(copied int64, now time.Time) bool {
	return w.noProgress(-copied, now)
}

func (w *stallWatch) diskReason() string {
	return fmt.Sprintf("no progress copying the local disks for %s (stuck at %d bytes copied): the migration was aborted (progressTimeout)", w.timeout, -w.lowest)
}

// cancelStalled cancels a stalled migration; the guest keeps running here.
func (l *Launcher) cancelStalled(reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.CancelMigration(ctx); err != nil {
		l.opts.Log.Error(err, "cancel a stalled migration", "reason", reason)
		return
	}
	l.opts.Log.Info("cancelled a stalled migration", "reason", reason)
}

// resumeAfterFailure restarts the guest's vCPUs if a failed or cancelled migration left them
// stopped. QEMU 7.2 does so itself when the guest ran before the migration; this guards the
// guest against a QEMU that does not, since the guest's only copy is here.
func (l *Launcher) resumeAfterFailure(ctx context.Context, p *Process, info *protocol.MigrationInfo) {
	state, err := p.currentState(ctx)
	if err == nil && state != qmp.StateRunning {
		err = p.Resume(ctx)
	}
	if err == nil || info == nil {
		return
	}
	failed := *info
	msg := "resume the guest on the source: " + err.Error()
	if failed.Error != "" {
		msg = failed.Error + "; " + msg
	}
	failed.Error = msg
	l.setMigration(&failed)
}

// waitMigrationSettled waits (briefly) for QEMU to leave finish-migrate: QEMU 7.2 sends the
// completed event before it records the migration's total time and downtime.
func waitMigrationSettled(mon *qmp.Monitor) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		st, err := mon.QueryStatus(ctx)
		if err != nil || st.Status != qmp.StateFinishMigrate {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (l *Launcher) refreshMigration(mon *qmp.Monitor) *protocol.MigrationInfo {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	mi, err := mon.QueryMigrate(ctx)
	if err != nil {
		return nil
	}
	info := &protocol.MigrationInfo{Role: protocol.RoleSource, Status: string(mi.Status), DowntimeMs: mi.Downtime,
		TotalTimeMs: mi.TotalTime, Error: mi.ErrorDesc, PostCopy: l.inPostCopy() || postCopyStatus(mi.Status)}
	if mi.RAM != nil {
		info.TotalBytes, info.TransferredBytes, info.RemainingBytes = mi.RAM.Total, mi.RAM.Transferred, mi.RAM.Remaining
		info.ThroughputMbps = mi.RAM.Mbps
		info.ParallelBytes = mi.RAM.MultifdBytes
	}
	l.diskMigrationInfo(info)
	l.setMigration(info)
	return info
}

func migrationDone(status string) bool {
	switch qmp.MigrationStatus(status) {
	case qmp.MigrationCompleted, qmp.MigrationFailed, qmp.MigrationCancelled, qmp.MigrationNone, qmp.MigrationPostcopyPaused:
		return true
	}
	return false
}

// postCopyStatus: QEMU's migration is past the switch to post-copy.
func postCopyStatus(s qmp.MigrationStatus) bool {
	return s == qmp.MigrationPostcopyActive || s == qmp.MigrationPostcopyPaused
}

// CancelMigration cancels an outgoing migration; the guest keeps running here. Once the guest is
// handed over it is too late: only ReclaimMigration takes it back.
func (l *Launcher) CancelMigration(ctx context.Context) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	if l.handingOver() {
		return &ConflictError{Msg: "the guest was handed over to the target: it is too late to cancel"}
	}
	if l.inPostCopy() {
		return &ConflictError{Msg: "the migration switched to post-copy and the guest runs on the target: it is too late to cancel"}
	}
	if l.cancelDiskCopy() {
		return nil
	}
	if err := p.Monitor().MigrateCancel(ctx); err != nil {
		return fmt.Errorf("cancel migration: %w", err)
	}
	return nil
}

func (l *Launcher) setMigration(info *protocol.MigrationInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.migration = info
	l.notifyLocked()
}

func ptrTo[T any](v T) *T { return &v }

// migrationUnderTCGRefused refuses to migrate, under emulation, RAM that cannot be padded out of
// QEMU 7.2's TCG dirty-tracking defect (tcgRAMPadKiB): huge page RAM and the virtio-mem region of
// memory hotplug, both whole 256 KiB blocks.
func migrationUnderTCGRefused(m *Machine) error {
	if m.Accel != machine.AccelTCG {
		return nil
	}
	if m.HugePageKiB != 0 {
		return machine.Invalid(machinePath.Child("hugePageKiB"), m.HugePageKiB,
			"huge page RAM does not live-migrate under emulation (TCG): "+machine.HugePagesTCGMigration)
	}
	if m.MemoryHotplugRoomMiB() != 0 {
		return machine.Invalid(machinePath.Child("maxMemoryMiB"), m.MaxMemoryMiB,
			"memory hotplug room does not live-migrate under emulation (TCG): "+machine.MemoryHotplugTCGMigration)
	}
	return nil
}
