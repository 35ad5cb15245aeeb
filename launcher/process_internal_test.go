package launcher

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/qmp"
)

// TestExitInPostCopySaysTheMigrationFailed: a migration target's QEMU whose post-copy fails may
// exit by itself (its listen thread's loadvm error) before the launcher ends it for the failed
// migration. Either way the exit says the post-copy failed, not only QEMU's own words.
func TestExitInPostCopySaysTheMigrationFailed(t *testing.T) {
	for _, postCopy := range []bool{false, true} {
		p := &Process{mon: &qmp.Monitor{}, stderr: newTailBuffer(1024)}
		_, _ = p.stderr.Write([]byte("qemu-system-x86_64: postcopy_ram_listen_thread: loadvm failed: -22\n"))
		p.setPostCopyIn(postCopy)
		e := p.classify(exec.Command("sh", "-c", "exit 1").Run())
		if e.Reason != protocol.ExitCrashed || !strings.Contains(e.Detail, "exit code 1: qemu-system-x86_64: postcopy_ram_listen_thread") {
			t.Errorf("post-copy %v: exit %+v; want crashed with QEMU's exit code and words", postCopy, e)
		}
		if said := strings.Contains(e.Detail, "after it switched to post-copy") && strings.Contains(e.Detail, "split between"); said != postCopy {
			t.Errorf("post-copy %v: exit detail %q says the post-copy failed: %v", postCopy, e.Detail, said)
		}
	}
}

// TestExitAfterACompletedPostCopyIsNotASplit: once the incoming post-copy migration completes the
// target holds the whole guest, so a later failure of its QEMU is QEMU's own, not a split guest.
func TestExitAfterACompletedPostCopyIsNotASplit(t *testing.T) {
	l := &Launcher{changed: make(chan struct{})}
	p := &Process{mon: &qmp.Monitor{}, stderr: newTailBuffer(1024)}
	_, _ = p.stderr.Write([]byte("qemu-system-x86_64: something else failed\n"))
	p.setPostCopyIn(true)
	l.finishIncomingPostCopy(p, string(qmp.MigrationCompleted), 0)
	if l.migration == nil || l.migration.Status != string(qmp.MigrationCompleted) {
		t.Fatalf("migration %+v, want completed", l.migration)
	}
	e := p.classify(exec.Command("sh", "-c", "exit 1").Run())
	if e.Reason != protocol.ExitCrashed || strings.Contains(e.Detail, "post-copy") {
		t.Errorf("exit after the post-copy completed: %+v; want QEMU's own failure, no post-copy split", e)
	}
}
