package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// Block migration: the disks whose written contents exist only in a file of this launcher (an
// emptyDisk, the writable overlay of a containerDisk or of an ephemeral claim) travel with the
// guest, as libvirt's non-shared storage migration does and QEMU's tests/qemu-iotests/194 shows:
//
//  1. The target launcher, started with the same machine, has made the same disks afresh (blank
//     emptyDisks, empty overlays over the same read-only images). When asked to prepare for the
//     guest, its QEMU exports each of them, writable, on an NBD server on a unix socket in its
//     own directory (Dir.NBDIn); exporting activates the node that -incoming left inactive.
//  2. The source launcher adds an NBD client node per disk (through the node agents' mutual TLS
//     tunnel in a cluster: Dir.NBDOut, handler/migproxy) and mirrors the disk into it: the whole
//     disk for an emptyDisk, only the overlay (sync "top") where both sides have the image under
//     it, since a containerDisk is pinned to a digest and a claim is the same volume. Mirrors copy
//     in write-blocking mode: once ready, every guest write reaches the target before it
//     completes, so the copy converges however fast the guest writes (libvirt's
//     VIR_MIGRATE_NON_SHARED_SYNCHRONOUS_WRITES).
//  3. Only when every mirror is ready does the memory migration start, with
//     pause-before-switchover (libvirt enables it on every source for this): in the
//     pre-switchover state the vCPUs are stopped and block I/O still works, and the launcher ends
//     each ready mirror with block-job-cancel, which makes the target a point-in-time copy
//     (BLOCK_JOB_COMPLETED, offset equal to length), and only then lets the migration go on
//     (migrate-continue). A mirror that fails at any moment cancels the migration. The NBD client
//     nodes go once the migration has ended.
//  4. The target stops its NBD server once the migration completed, before it runs the guest
//     (the handover, switchover.go), so that nothing else can write to the disks through it.
//
// A failure anywhere (a mirror that cannot reach the target, a target that goes away, a
// cancelled migration) ends the mirrors (force-cancelled) and removes the client nodes; the
// source's disks were written directly all along and stay as they are, with the guest running
// on them.

// localDisk is a disk whose contents a migration must copy. Its NBD export is named after it.
type localDisk struct {
	name string
	// sync is what the mirror copies: qmp.SyncFull, or qmp.SyncTop for an overlay over a
	// read-only image both nodes have.
	sync string
}

func (d localDisk) node() string     { return DriveNode(d.name) }
func (d localDisk) client() string   { return nodeName("nbd-", d.name) }
func (d localDisk) job() string      { return "mirror-" + d.name }
func (d localDisk) exportID() string { return "export-" + d.name }

// localDisks lists p's local disks, cold- and hot-plugged, by name. The source and the target
// of a migration find the same list: they run the same machine.
func (l *Launcher) localDisks(p *Process) []localDisk {
	var out []localDisk
	add := func(d *machine.Disk, img DiskImage) {
		if !img.Ephemeral || img.ReadOnly || d.ReadOnly || d.CDROM {
			return
		}
		sync := qmp.SyncFull
		if img.Backing != nil {
			sync = qmp.SyncTop
		}
		out = append(out, localDisk{name: d.Name, sync: sync})
	}
	m := p.Machine()
	for i := range m.Disks {
		if d := &m.Disks[i]; d.Port == "" {
			add(d, m.Images[d.Name])
		}
	}
	l.mu.Lock()
	for _, h := range l.hotplug {
		add(&h.Disk, h.img)
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b localDisk) int { return strings.Compare(a.name, b.name) })
	return out
}

// blockState is the launcher's block migration, under Launcher.mu.
type blockState struct {
	// exported: this (target) QEMU's NBD server runs.
	exported bool
	// mirror is this (source) launcher's current outgoing block migration.
	mirror *mirror
}

// exportLocalDisks has an incoming QEMU export its local disks, writable, on an NBD server on
// Dir.NBDIn, one connection each; it does nothing for a guest without local disks.
func (l *Launcher) exportLocalDisks(ctx context.Context, p *Process) error {
	disks := l.localDisks(p)
	l.mu.Lock()
	exported := l.blocks.exported
	l.mu.Unlock()
	if len(disks) == 0 || exported {
		return nil
	}
	path := Dir(l.runDir).NBDIn()
	// A socket left by an earlier attempt would make QEMU's bind fail.
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("export the local disks: %w", err)
	}
	mon := p.Monitor()
	if err := mon.NBDServerStart(ctx, path, uint32(len(disks))); err != nil {
		return fmt.Errorf("export the local disks: %w", err)
	}
	for _, d := range disks {
		err := mon.BlockExportAdd(ctx, qmp.BlockExportNBD{ID: d.exportID(), NodeName: d.node(), Writable: true, Name: d.name})
		if err != nil {
			_ = mon.NBDServerStop(ctx)
			return fmt.Errorf("export disk %q: %w", d.name, err)
		}
	}
	l.mu.Lock()
	l.blocks.exported = true
	l.mu.Unlock()
	return nil
}

// stopDiskExport stops the NBD server of a target whose guest has arrived: the source's mirrors
// ended before the switch-over, and nothing else may write to the disks.
func (l *Launcher) stopDiskExport(p *Process) error {
	l.mu.Lock()
	exported := l.blocks.exported
	l.blocks.exported = false
	l.mu.Unlock()
	if !exported {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Monitor().NBDServerStop(ctx); err != nil {
		return fmt.Errorf("stop exporting the local disks: %w", err)
	}
	_ = os.Remove(Dir(l.runDir).NBDIn())
	return nil
}

// checkBlockMigration refuses to migrate local disks nowhere: without a target to mirror into, the
// guest would find them blank on the target.
func checkBlockMigration(req *protocol.MigrationSource, disks []localDisk) error {
	if req.BlockMigration == nil {
		if len(disks) == 0 {
			return nil
		}
		names := make([]string, len(disks))
		for i, d := range disks {
			names[i] = fmt.Sprintf("%q", d.name)
		}
		return machine.Required("blockMigration", fmt.Sprintf("disks %s keep what the guest wrote on this node only: "+
			"name the target's NBD server so that they are copied", strings.Join(names, ", ")))
	}
	path, ok := strings.CutPrefix(req.BlockMigration.URI, "unix:")
	if !ok || !filepath.IsAbs(path) {
		return machine.Invalid("blockMigration.uri", req.BlockMigration.URI, "must be unix:/ABSOLUTE/PATH")
	}
	return nil
}

// errMirrorCancelled ends a block migration cancelled before its memory migration started.
var errMirrorCancelled = errors.New("cancelled while copying the local disks")

// migrateWithDisks starts mirroring the local disks to req.BlockMigration and returns; the memory
// migration to req.URI follows once every mirror is ready (mirrorThenMigrate).
func (l *Launcher) migrateWithDisks(ctx context.Context, p *Process, req *protocol.MigrationSource, disks []localDisk, wasRunning bool) error {
	m, err := startMirror(ctx, p, strings.TrimPrefix(req.BlockMigration.URI, "unix:"), disks)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	l.setMirror(m)
	l.setMigration(&protocol.MigrationInfo{Role: protocol.RoleSource, Status: string(qmp.MigrationSetup)})
	go l.mirrorThenMigrate(p, m, req.URI, req.ProgressTimeout, wasRunning)
	return nil
}

// mirrorThenMigrate waits for the mirrors to be ready, reporting their progress, then starts the
// memory migration and watches it for the mirrors' sake (superviseMirror). A block migration that
// ends before then leaves the guest running here, as it ran all along.
func (l *Launcher) mirrorThenMigrate(p *Process, m *mirror, uri string, progressTimeout time.Duration, wasRunning bool) {
	err := m.waitReady(p.Done(), func() { l.publishMirrorProgress(m, string(qmp.MigrationSetup)) }, &stallWatch{timeout: progressTimeout})
	if err == nil {
		err = m.beginMemory()
	}
	if err == nil {
		// The waiters go in before migrate so that no state change is missed.
		mon := p.Monitor()
		paused := mon.NewWaiter(qmp.EventMigration, func(ev gqmp.Event) bool { return ev.Data["status"] == string(qmp.MigrationPreSwitchover) })
		ended := mon.NewWaiter(qmp.EventMigration, migrationFinished)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = l.startMemoryMigration(ctx, p, uri, progressTimeout, postCopyWatch{}, wasRunning)
		cancel()
		if err == nil {
			l.superviseMirror(p, m, paused, ended)
			return
		}
		paused.Cancel()
		ended.Cancel()
	}
	// Say so before aborting: a copy stuck on a link that stopped taking data ends only once the
	// node agent cuts that link, which it does for a migration it sees cancelling.
	ending := &protocol.MigrationInfo{Role: protocol.RoleSource, Status: string(qmp.MigrationCancelling), Error: err.Error()}
	m.addProgress(ending)
	l.setMigration(ending)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.abort(ctx)
	status := qmp.MigrationFailed
	if errors.Is(err, errMirrorCancelled) {
		status = qmp.MigrationCancelled
	}
	info := &protocol.MigrationInfo{Role: protocol.RoleSource, Status: string(status), Error: err.Error()}
	m.addProgress(info)
	l.setMigration(info)
}

// superviseMirror follows the memory migration for the mirrors: at the switch-over it ends them
// in sync and lets the migration go on; a mirror that fails cancels the migration; a migration
// that fails ends the mirrors. followOutgoing does the rest, as for any migration, and reports
// the mirrors' failure (diskMigrationInfo).
func (l *Launcher) superviseMirror(p *Process, m *mirror, paused, ended *qmp.Waiter) {
	defer paused.Cancel()
	defer ended.Cancel()
	mon := p.Monitor()
	pausedC, endedC := eventOf(paused), eventOf(ended)
	cancelled := false
	for {
		m.mu.Lock()
		failed, changed := m.failureLocked(), m.changed
		m.mu.Unlock()
		if failed != nil && !cancelled {
			m.fail(failed)
			l.cancelMemory(mon)
			cancelled = true
		}
		select {
		case _, ok := <-pausedC:
			pausedC = nil
			if ok && !cancelled {
				l.switchOver(mon, m)
			}
		case ev, ok := <-endedC:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if ok && ev.Data["status"] != string(qmp.MigrationCompleted) {
				m.abort(ctx)
			} else {
				// The source holds the guest until the handover ends (switchover.go); if it takes
				// the guest back, a later migration needs the names.
				_ = m.removeClients(ctx)
			}
			cancel()
			return
		case <-changed:
		case <-p.Done():
			return
		}
	}
}

// eventOf delivers w's event, or closes without one when w ends otherwise.
func eventOf(w *qmp.Waiter) <-chan gqmp.Event {
	c := make(chan gqmp.Event, 1)
	go func() {
		defer close(c)
		if ev, err := w.Wait(context.Background()); err == nil {
			c <- ev
		}
	}()
	return c
}

// switchOver ends the mirrors while the guest is paused before the switch-over, then lets the
// migration go on; if the disks cannot be handed over in sync, it cancels the migration instead.
func (l *Launcher) switchOver(mon *qmp.Monitor, m *mirror) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := m.complete(ctx); err != nil {
		m.fail(err)
		l.cancelMemory(mon)
		return
	}
	if err := mon.MigrateContinue(ctx, qmp.MigrationPreSwitchover); err != nil {
		m.fail(fmt.Errorf("continue after the disks were copied: %w", err))
		l.cancelMemory(mon)
	}
}

func (l *Launcher) cancelMemory(mon *qmp.Monitor) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = mon.MigrateCancel(ctx)
}

// setMirror makes m the current block migration; the last one stays for its figures and its
// failure until the next migration starts.
func (l *Launcher) setMirror(m *mirror) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.blocks.mirror = m
}

// cancelDiskCopy cancels a block migration that has not started its memory migration yet; false
// when there is none, and cancelling is migrate_cancel's.
func (l *Launcher) cancelDiskCopy() bool {
	l.mu.Lock()
	m := l.blocks.mirror
	l.mu.Unlock()
	return m != nil && m.cancelBeforeMemory()
}

// publishMirrorProgress reports the copy of the disks before the memory migration starts.
func (l *Launcher) publishMirrorProgress(m *mirror, status string) {
	info := &protocol.MigrationInfo{Role: protocol.RoleSource, Status: status}
	m.addProgress(info)
	l.setMigration(info)
}

// diskMigrationInfo adds the disks' copy to a source's migration info, and the reason of a
// migration the launcher cancelled because the disks could not be copied: that migration failed.
func (l *Launcher) diskMigrationInfo(info *protocol.MigrationInfo) {
	l.mu.Lock()
	m := l.blocks.mirror
	l.mu.Unlock()
	if m == nil {
		return
	}
	m.addProgress(info)
	if err := m.failure(); err != nil && (info.Status == string(qmp.MigrationCancelled) || info.Status == string(qmp.MigrationFailed)) {
		info.Status = string(qmp.MigrationFailed)
		if info.Error == "" {
			info.Error = err.Error()
		}
	}
}

// mirror is an outgoing block migration: an NBD client node and a mirror job per local disk.
// Safe for concurrent use.
type mirror struct {
	mon   *qmp.Monitor
	disks []localDisk

	mu      sync.Mutex
	jobs    map[string]*mirrorJob // by disk name, for the jobs started
	clients []string              // client nodes added
	changed chan struct{}         // closed at every job change
	// memory: the memory migration started (cancelling it is migrate_cancel's); cancelled: the
	// copy was cancelled before; ending: the jobs are being ended on purpose.
	memory, cancelled, ending bool
	stop                      chan struct{} // closed when cancelled
	err                       error         // why the block migration failed, first cause
	total, done               int64         // the copy's last known progress
}

type mirrorJob struct {
	disk       localDisk
	ready      *qmp.Waiter
	end        *qmp.Waiter
	isReady    bool
	ended      bool
	endErr     error // why the job ended, nil for a completion in sync
	total, off int64
}

// startMirror reaches the target's export of each disk at the NBD socket path and starts its
// mirror. On error what it started is undone.
func startMirror(ctx context.Context, p *Process, path string, disks []localDisk) (*mirror, error) {
	m := &mirror{mon: p.Monitor(), disks: disks, jobs: map[string]*mirrorJob{}, changed: make(chan struct{}), stop: make(chan struct{})}
	for _, d := range disks {
		if err := m.start(ctx, d, path); err != nil {
			undo, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			m.abort(undo)
			cancel()
			return nil, err
		}
	}
	return m, nil
}

func (m *mirror) start(ctx context.Context, d localDisk, path string) error {
	if err := m.mon.BlockdevAdd(ctx, qmp.NBDBlockdev(d.client(), path, d.name)); err != nil {
		return fmt.Errorf("reach the target's copy of disk %q: %w", d.name, err)
	}
	m.mu.Lock()
	m.clients = append(m.clients, d.client())
	m.mu.Unlock()
	j := &mirrorJob{disk: d,
		ready: m.mon.NewWaiter(qmp.EventBlockJobReady, qmp.IsBlockJob(d.job())),
		end:   m.mon.NewWaiter("", qmp.IsBlockJobEnd(d.job()))}
	err := m.mon.BlockdevMirror(ctx, qmp.BlockdevMirror{JobID: d.job(), Device: d.node(), Target: d.client(),
		Sync: d.sync, CopyMode: qmp.CopyWriteBlocking})
	if err != nil {
		j.ready.Cancel()
		j.end.Cancel()
		return fmt.Errorf("copy disk %q to the target: %w", d.name, err)
	}
	m.mu.Lock()
	m.jobs[d.name] = j
	m.mu.Unlock()
	go m.follow(j)
	return nil
}

// follow records the job's readiness and its end as QEMU reports them.
func (m *mirror) follow(j *mirrorJob) {
	go func() {
		if _, err := j.ready.Wait(context.Background()); err == nil {
			m.update(func() { j.isReady = true })
		}
	}()
	ev, err := j.end.Wait(context.Background())
	if errors.Is(err, qmp.ErrWaiterCancelled) {
		return
	}
	m.update(func() {
		j.ended = true
		j.endErr = jobEndError(j.disk, ev, err)
		if err == nil {
			if end, perr := qmp.ParseBlockJobEnd(ev); perr == nil {
				j.total, j.off = end.Len, end.Offset
			}
		}
	})
}

// jobEndError is why a mirror ended, nil when it completed with its target in sync.
func jobEndError(d localDisk, ev gqmp.Event, waitErr error) error {
	if waitErr != nil {
		return fmt.Errorf("copy of disk %q: %w", d.name, waitErr)
	}
	end, err := qmp.ParseBlockJobEnd(ev)
	switch {
	case err != nil:
		return fmt.Errorf("copy of disk %q: %w", d.name, err)
	case end.Error != "":
		return fmt.Errorf("copy of disk %q failed: %s", d.name, end.Error)
	case end.Cancelled:
		return fmt.Errorf("copy of disk %q was cancelled", d.name)
	case end.Offset != end.Len:
		return fmt.Errorf("copy of disk %q ended at %d of %d bytes", d.name, end.Offset, end.Len)
	}
	return nil
}

func (m *mirror) update(fn func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fn()
	close(m.changed)
	m.changed = make(chan struct{})
}

// failureLocked is why the block migration cannot go on: a job that ended unasked, or a failure
// recorded before.
func (m *mirror) failureLocked() error {
	if m.err != nil {
		return m.err
	}
	if m.ending {
		return nil
	}
	for _, d := range m.disks {
		if j := m.jobs[d.name]; j != nil && j.ended {
			if j.endErr != nil {
				return j.endErr
			}
			return fmt.Errorf("copy of disk %q ended before the switch-over", d.name)
		}
	}
	return nil
}

func (m *mirror) failure() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// fail records the first cause of the block migration's failure.
func (m *mirror) fail(err error) {
	m.update(func() {
		if m.err == nil {
			m.err = err
		}
	})
}

// waitReady waits until every mirror is ready, calling progress about every progressEvery, or
// returns why one never will: a mirror failed, or the copy made no progress for stall's timeout
// (a target, or a link, that stopped taking the data).
func (m *mirror) waitReady(qemuDone <-chan struct{}, progress func(), stall *stallWatch) error {
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		m.mu.Lock()
		err, ready, changed := m.failureLocked(), m.allReadyLocked(), m.changed
		m.mu.Unlock()
		if err != nil {
			return err
		}
		if ready {
			return nil
		}
		select {
		case <-changed:
		case <-tick.C:
			progress()
			if stall.copyStalled(m.copied(), time.Now()) {
				return errors.New(stall.diskReason())
			}
		case <-m.stop:
			return errMirrorCancelled
		case <-qemuDone:
			return errors.New("QEMU exited while copying the local disks")
		}
	}
}

// copied is the copy's bytes copied so far, as last reported (addProgress).
func (m *mirror) copied() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.done
}

// cancelGrace is how long cancelled copies may take to end before their connections are cut.
const cancelGrace = 3 * time.Second

// progressEvery is how often the copy's progress is reported before the memory migration.
const progressEvery = 200 * time.Millisecond

func (m *mirror) allReadyLocked() bool {
	for _, d := range m.disks {
		if j := m.jobs[d.name]; j == nil || !j.isReady {
			return false
		}
	}
	return true
}

// beginMemory marks the memory migration started, unless the copy was cancelled.
func (m *mirror) beginMemory() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancelled {
		return errMirrorCancelled
	}
	m.memory = true
	return nil
}

// cancelBeforeMemory cancels the copy if the memory migration has not started.
func (m *mirror) cancelBeforeMemory() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.memory {
		return false
	}
	if !m.cancelled {
		m.cancelled = true
		close(m.stop)
	}
	return true
}

// complete ends every ready mirror in sync (block-job-cancel on a ready mirror completes it with
// the target a copy of the source as of now). The guest must be stopped, or the copies would be
// stale at once. The client nodes stay until the migration has ended: removing them takes time
// (an NBD disconnect each) that the guest would spend paused, and nothing writes through them
// any more.
func (m *mirror) complete(ctx context.Context) error {
	m.mu.Lock()
	err := m.failureLocked()
	m.ending = true
	m.mu.Unlock()
	if err != nil {
		return err
	}
	for _, d := range m.disks {
		if err := m.mon.BlockJobCancel(ctx, d.job(), false); err != nil {
			return fmt.Errorf("end the copy of disk %q: %w", d.name, err)
		}
	}
	if err := m.waitEnded(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	for _, d := range m.disks {
		if j := m.jobs[d.name]; j.endErr != nil {
			err = j.endErr
			break
		}
	}
	m.mu.Unlock()
	return err
}

// waitEnded waits until every started job has ended.
func (m *mirror) waitEnded(ctx context.Context) error {
	for {
		m.mu.Lock()
		ended, changed := true, m.changed
		for _, j := range m.jobs {
			ended = ended && j.ended
		}
		m.mu.Unlock()
		if ended {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("wait for the copies of the disks to end: %w", ctx.Err())
		}
	}
}

// abort ends what is left of the block migration: jobs force-cancelled (their targets are not
// copies), client nodes removed. The source's disks are untouched. A job whose requests wait on a
// target that stopped answering does not end on a cancel, and with the write-blocking copy the
// guest's own writes wait with it: then the clients' connections are shut down (yank). That
// fails requests waiting on a TCP peer; one waiting to write into a unix socket whose reader
// stopped (the node agent's tunnel) waits on, since Linux does not wake a poll for writing on a
// unix socket shut down by its own side, until the reader's end is closed: the node agent does
// that for a migration its launcher reports cancelling.
func (m *mirror) abort(ctx context.Context) {
	m.mu.Lock()
	m.ending = true
	var running []*mirrorJob
	for _, j := range m.jobs {
		if !j.ended {
			running = append(running, j)
		}
	}
	clients := slices.Clone(m.clients)
	m.mu.Unlock()
	for _, j := range running {
		_ = m.mon.BlockJobCancel(ctx, j.disk.job(), true)
	}
	if len(running) > 0 && len(clients) > 0 {
		grace, cancel := context.WithTimeout(ctx, cancelGrace)
		err := m.waitEnded(grace)
		cancel()
		if err != nil {
			_ = m.mon.YankBlockNodes(ctx, clients...)
		}
	}
	_ = m.waitEnded(ctx)
	_ = m.removeClients(ctx)
	m.mu.Lock()
	for _, j := range m.jobs {
		j.ready.Cancel()
		j.end.Cancel()
	}
	m.mu.Unlock()
}

func (m *mirror) removeClients(ctx context.Context) error {
	m.mu.Lock()
	clients := m.clients
	m.clients = nil
	m.mu.Unlock()
	var errs []error
	for _, c := range clients {
		if err := m.mon.BlockdevDel(ctx, c); err != nil {
			errs = append(errs, fmt.Errorf("remove the NBD client %s: %w", c, err))
		}
	}
	return errors.Join(errs...)
}

// addProgress adds the copy's progress to info: from QEMU while the jobs run, as last known after.
func (m *mirror) addProgress(info *protocol.MigrationInfo) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	jobs, err := m.mon.QueryBlockJobs(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		for _, q := range jobs {
			for _, j := range m.jobs {
				if q.Device == j.disk.job() {
					j.total, j.off = q.Len, q.Offset
				}
			}
		}
		m.total, m.done = 0, 0
		for _, j := range m.jobs { // ended jobs keep their last figures
			m.total, m.done = m.total+j.total, m.done+j.off
		}
	}
	info.DiskTotalBytes, info.DiskTransferredBytes = m.total, m.done
}
