package launcher

import (
	"context"
	"fmt"
	"time"

	gqmp "github.com/digitalocean/go-qemu/qmp"
	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// Post-copy: a migration whose guest dirties memory faster than the link carries it never
// converges in pre-copy. With PostCopy the source switches it (migrate-start-postcopy) once it
// ran PostCopyAfter: the source's vCPUs stop, the devices' state goes over, and the target runs
// the guest at once, fetching each page still on the source when the guest touches it while the
// source pushes the rest.
//
// That changes the handover (switchover.go): at the switch the guest becomes the target's. The
// target launcher records its handover done and runs the guest as soon as its QEMU reports
// postcopy-active, without waiting for the node agents, which could only stretch the time the
// guest is stopped; the source refuses to cancel or reclaim from then on, since the target may
// have run the guest. A migration that fails after the switch has the guest's memory split
// between the nodes: neither side can run it, and each launcher ends its QEMU, saying so, as
// KubeVirt's virt-launcher does (the VMI fails).
//
// Except when only the link broke (the node agents' tunnel went with an agent's restart, say):
// QEMU then pauses the migration at both ends (postcopy-paused), the target's guest stalled on
// its next missing page, and the migration can go on over a new link. Given a PostCopyRecovery
// window, each launcher waits that long for it: the target listens again on RecoverMigration
// (QEMU's migrate-recover), the source then sends the rest there on ResumeMigration (migrate with
// resume), and the migration completes as if the link had never broken. A side still paused at
// the end of its window ends its QEMU as above.

// postCopyWatch tells the source when to switch its migration to post-copy.
type postCopyWatch struct {
	allowed bool
	after   time.Duration
	begun   time.Time
	asked   bool
	// recovery is how long a pause after the switch (a broken link) waits for ResumeMigration;
	// pausedAt is when the current pause began (zero when not paused).
	recovery time.Duration
	pausedAt time.Time
}

// seen follows the migration's status: a pause (a broken link) begins when QEMU reports
// postcopy-paused, and ends when it leaves it.
func (w *postCopyWatch) seen(info *protocol.MigrationInfo, now time.Time, log logr.Logger) {
	switch {
	case info == nil:
	case info.Status != string(qmp.MigrationPostcopyPaused):
		w.pausedAt = time.Time{}
	case w.pausedAt.IsZero():
		w.pausedAt = now
		if w.recovery > 0 {
			log.Info("the post-copy migration's link broke: waiting for a resume", "within", w.recovery)
		}
	}
}

// awaitsResume reports whether info, a migration that stopped moving, is a pause after the switch
// to post-copy still within its recovery window. At the end of the window it says so in info's
// error, for failPostCopy.
func (w *postCopyWatch) awaitsResume(info *protocol.MigrationInfo, now time.Time, log logr.Logger) bool {
	if info == nil || info.Status != string(qmp.MigrationPostcopyPaused) || w.recovery <= 0 {
		return false
	}
	w.seen(info, now, log)
	if now.Sub(w.pausedAt) < w.recovery {
		return true
	}
	info.Error = fmt.Sprintf("the link to the target broke and the migration was not resumed within %s", w.recovery)
	return false
}

// ResumeMigration (source) sends the rest of a post-copy migration whose link broke to the target,
// which listens again (RecoverMigration) at req.URI. A resume that cannot reach the target leaves
// the migration paused, to be resumed again within the window.
func (l *Launcher) ResumeMigration(ctx context.Context, req protocol.MigrationResume) error {
	if err := validateMigrationURI(req.URI); err != nil {
		return err
	}
	p, err := l.process()
	if err != nil {
		return err
	}
	if !l.pausedPostCopy(protocol.RoleSource) {
		return &ConflictError{Msg: "no post-copy migration waits for a resume here"}
	}
	if err := p.Monitor().Migrate(ctx, qmp.MigrateOptions{URI: req.URI, Resume: true}); err != nil {
		return fmt.Errorf("resume the migration to %s: %w", req.URI, err)
	}
	return nil
}

// RecoverMigration (target) listens again, on req.Listen, for the source of a post-copy migration
// whose link broke, and returns the URI the source resumes to.
func (l *Launcher) RecoverMigration(ctx context.Context, req protocol.MigrationRecover) (string, error) {
	p, err := l.process()
	if err != nil {
		return "", err
	}
	if !l.pausedPostCopy(protocol.RoleTarget) {
		return "", &ConflictError{Msg: "no post-copy migration waits to recover here"}
	}
	uri, err := l.incomingURI(req.Listen)
	if err != nil {
		return "", err
	}
	if err := p.Monitor().MigrateRecover(ctx, uri); err != nil {
		return "", fmt.Errorf("recover the migration on %s: %w", uri, err)
	}
	return uri, nil
}

// pausedPostCopy reports whether this side's migration, as role, is paused after the switch to
// post-copy.
func (l *Launcher) pausedPostCopy(role protocol.MigrationRole) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.migration
	return m != nil && m.Role == role && m.PostCopy && m.Status == string(qmp.MigrationPostcopyPaused)
}

// due reports whether the migration should switch now: allowed, not asked yet, past after, in
// pre-copy, and the guest running (a paused guest dirties nothing and converges on its own).
func (w *postCopyWatch) due(info *protocol.MigrationInfo, running bool, now time.Time) bool {
	if !w.allowed || w.asked || !running || info == nil || info.Status != string(qmp.MigrationActive) {
		return false
	}
	return now.Sub(w.begun) >= w.after
}

// startPostCopy switches the outgoing migration to post-copy; a refusal leaves it in pre-copy.
// The migration counts as post-copy from before the command: QEMU switches a moment after it
// accepts it, and a cancel in between would restart the guest here while the target runs it.
// Only followOutgoing's goroutine refreshes the migration, so nothing overwrites the mark.
func (l *Launcher) startPostCopy(mon *qmp.Monitor) {
	l.markPostCopy(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := mon.MigrateStartPostcopy(ctx); err != nil {
		l.markPostCopy(false)
		l.opts.Log.Error(err, "switch the migration to post-copy; it goes on in pre-copy")
		return
	}
	l.opts.Log.Info("switching the migration to post-copy")
}

func (l *Launcher) markPostCopy(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.migration == nil {
		return
	}
	m := *l.migration
	m.PostCopy = on
	l.migration = &m
	l.notifyLocked()
}

// inPostCopy reports whether the current migration switched to post-copy.
func (l *Launcher) inPostCopy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.migration != nil && l.migration.PostCopy
}

// checkPostCopy refuses what QEMU 7.2 cannot do in post-copy.
func checkPostCopy(req *protocol.MigrationSource, localDisks int) error {
	switch {
	case req.PostCopyAfter < 0:
		return machine.Invalid("postCopyAfter", req.PostCopyAfter, "must be 0 or more")
	case !req.PostCopy && req.PostCopyAfter > 0:
		return machine.Invalid("postCopyAfter", req.PostCopyAfter, "needs postCopy")
	case req.PostCopyRecovery < 0 || (req.PostCopyRecovery > 0 && !req.PostCopy):
		return machine.Invalid("postCopyRecovery", req.PostCopyRecovery, "must be 0 or more, and needs postCopy")
	case !req.PostCopy:
		return nil
	case req.Parallel != nil:
		return machine.Invalid("postCopy", true, "cannot be combined with parallel streams: QEMU 7.2 sends post-copy pages over the main stream only")
	case localDisks > 0 || req.BlockMigration != nil:
		return machine.Invalid("postCopy", true, "cannot be combined with a block migration: the local disks' copy must be complete before the guest runs on the target")
	}
	return nil
}

// takePostCopy (target) makes the guest this side's when the source switched to post-copy, and
// runs it: the source will never run it again.
func (l *Launcher) takePostCopy(p *Process) {
	l.mu.Lock()
	mig := l.migration
	if mig == nil || mig.Role != protocol.RoleTarget || mig.Handover != "" {
		l.mu.Unlock()
		return
	}
	if _, err := p.daemons.adoptTPMState(); err != nil {
		l.mu.Unlock()
		p.killFor(fmt.Errorf("take the TPM's state over at the post-copy switch: %w", err))
		return
	}
	p.setPostCopyIn(true)
	taken := *mig
	taken.Status, taken.PostCopy, taken.Handover = string(qmp.MigrationPostcopyActive), true, protocol.HandoverDone
	l.migration = &taken
	l.phase = protocol.PhaseRunning
	l.notifyLocked()
	l.mu.Unlock()
	// Generous: QEMU's main loop waits for the pages the devices touch as they resume, fetched
	// from the source (seconds under emulation over a capped link).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.Resume(ctx); err != nil {
		p.killFor(fmt.Errorf("run the guest at the post-copy switch: %w", err))
		return
	}
	p.daemons.dropOldTPMStates()
	l.opts.Log.Info("the migration switched to post-copy: the guest runs here")
}

// failPostCopy ends this side's QEMU after a migration failed past the post-copy switch: the
// guest's memory is split between the two nodes, and neither may run it.
func (l *Launcher) failPostCopy(p *Process, info *protocol.MigrationInfo) {
	why := info.Status
	if info.Error != "" {
		why += ": " + info.Error
	}
	why = postCopySplit(why)
	failed := *info
	failed.Error = why
	l.setMigration(&failed)
	p.killFor(fmt.Errorf("%s", why))
}

// postCopyLost records as failed a migration past its post-copy switch whose QEMU went away before
// it ended, when no failure was recorded for it yet (failPostCopy): QEMU 7.2 exits by itself when
// the source is lost, which can come before its MIGRATION event, and the guest's memory is split
// all the same.
func (l *Launcher) postCopyLost() {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.migration
	if m == nil || !m.PostCopy || m.Status == string(qmp.MigrationCompleted) || m.Error != "" {
		return
	}
	failed := *m
	failed.Status, failed.Error = string(qmp.MigrationFailed), postCopySplit("QEMU exited before the migration ended")
	l.migration = &failed
	l.notifyLocked()
}

// postCopySplit says why a guest ended whose migration failed past the post-copy switch.
func postCopySplit(cause string) string {
	return "the migration failed after it switched to post-copy (" + cause +
		"); the guest's memory is split between the source and the target, so it cannot run on either"
}

// finishIncomingPostCopy (target) ends an incoming migration past the switch to post-copy from its
// status: completed, or failed (failPostCopy), or paused by a broken link, when it waits up to
// recovery for RecoverMigration and the source's resume, and follows the migration again.
func (l *Launcher) finishIncomingPostCopy(p *Process, status string, recovery time.Duration) {
	for {
		info := &protocol.MigrationInfo{Role: protocol.RoleTarget, Status: status, PostCopy: true, Handover: protocol.HandoverDone}
		wait := time.Duration(0) // for the end of a migration that went on after a recovery
		switch {
		case status == string(qmp.MigrationCompleted):
			p.setPostCopyIn(false)
			l.setMigration(info)
			return
		case status == string(qmp.MigrationPostcopyPaused) && recovery > 0:
			wait = recovery
			l.opts.Log.Info("the post-copy migration's link broke: waiting for it to recover", "within", recovery)
		case status != string(qmp.MigrationPostcopyActive):
			l.failPostCopy(p, info)
			return
		}
		// Nothing moves until RecoverMigration, nor between postcopy-active and the next event
		// this waits for: no event can come before this waiter.
		next := p.Monitor().NewWaiter(qmp.EventMigration, postCopyMoved)
		l.setMigration(info)
		ev, err := waitFor(next, wait)
		if err != nil {
			select {
			case <-p.Done():
				l.postCopyLost() // QEMU went away; the process's exit says why
				return
			default:
			}
			info.Error = fmt.Sprintf("the link to the source broke and the migration did not recover within %s", recovery)
			l.failPostCopy(p, info)
			return
		}
		status, _ = ev.Data["status"].(string)
	}
}

// postCopyMoved: a MIGRATION event that ends or pauses the migration (migrationFinished), or
// takes it back to postcopy-active after a recovery.
func postCopyMoved(ev gqmp.Event) bool {
	return migrationFinished(ev) || postCopyStarted(ev)
}

// waitFor waits for w's event for up to d (without limit when d is zero).
func waitFor(w *qmp.Waiter, d time.Duration) (gqmp.Event, error) {
	defer w.Cancel()
	ctx := context.Background()
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	return w.Wait(ctx)
}

// eventChan delivers w's event, or is closed when w ends without one.
func eventChan(w *qmp.Waiter) <-chan gqmp.Event {
	c := make(chan gqmp.Event, 1)
	go func() {
		if ev, err := w.Wait(context.Background()); err == nil {
			c <- ev
		}
		close(c)
	}()
	return c
}

func postCopyStarted(ev gqmp.Event) bool {
	s, _ := ev.Data["status"].(string)
	return s == string(qmp.MigrationPostcopyActive)
}
