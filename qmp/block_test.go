package qmp_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	gqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qvirt/qvirt/qmp"
)

// TestQEMUStorageMigrationOverNBD migrates a QEMU whose disks live only on the source: a raw
// disk (mirrored whole) and a qcow2 overlay over a base image both sides have (mirrored from the
// top only). The destination exports its fresh copies over NBD while it waits for the migration;
// the source mirrors into them, migrates with pause-before-switchover, ends the ready mirrors
// while paused (block-job-cancel: the targets become point-in-time copies) and lets the
// migration go on. Afterwards the destination's images read as the source's.
func TestQEMUStorageMigrationOverNBD(t *testing.T) {
	dir := t.TempDir()
	img := func(name string) string { return filepath.Join(dir, name) }
	run := func(name string, args ...string) {
		t.Helper()
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
	}
	run("qemu-img", "create", "-q", "-f", "raw", img("base.raw"), "4M")
	run("qemu-io", "-f", "raw", "-c", "write -P 0x42 0 64k", img("base.raw"))
	for _, side := range []string{"src", "dst"} {
		run("qemu-img", "create", "-q", "-f", "raw", img(side+"-empty.raw"), "8M")
		run("qemu-img", "create", "-q", "-f", "qcow2", "-b", img("base.raw"), "-F", "raw", img(side+"-overlay.qcow2"))
	}
	run("qemu-io", "-f", "raw", "-c", "write -P 0x5a 1M 64k", img("src-empty.raw"))
	run("qemu-io", "-f", "qcow2", "-c", "write -P 0x41 2M 64k", img("src-overlay.qcow2"))

	disks := func(side string) []string {
		return []string{
			"-blockdev", `{"driver":"file","node-name":"file-empty","filename":"` + img(side+"-empty.raw") + `"}`,
			"-blockdev", `{"driver":"raw","node-name":"drive-empty","file":"file-empty"}`,
			"-blockdev", `{"driver":"file","node-name":"file-base","filename":"` + img("base.raw") + `","read-only":true}`,
			"-blockdev", `{"driver":"raw","node-name":"drive-base","file":"file-base","read-only":true}`,
			"-blockdev", `{"driver":"file","node-name":"file-overlay","filename":"` + img(side+"-overlay.qcow2") + `"}`,
			"-blockdev", `{"driver":"qcow2","node-name":"drive-overlay","file":"file-overlay","backing":"drive-base"}`,
			"-device", "virtio-blk-pci,drive=drive-empty,id=disk-empty",
			"-device", "virtio-blk-pci,drive=drive-overlay,id=disk-overlay",
		}
	}
	src, srcProc := startQEMU(t, qemuConfig{args: disks("src")})
	dst, dstProc := startQEMU(t, qemuConfig{args: append(disks("dst"), "-incoming", "defer")})
	ctx := qemuContext(t)

	// The destination: its NBD server with a writable export per disk, then the incoming socket.
	nbdSock := filepath.Join(t.TempDir(), "nbd.sock")
	migSock := filepath.Join(t.TempDir(), "mig.sock")
	events := []qmp.MigrationCapabilityStatus{{Capability: qmp.CapEvents, State: true}}
	must(t, dst.MigrateSetCapabilities(ctx, events))
	must(t, dst.NBDServerStart(ctx, nbdSock, 2))
	for _, d := range []string{"empty", "overlay"} {
		must(t, dst.BlockExportAdd(ctx, qmp.BlockExportNBD{ID: "export-" + d, NodeName: "drive-" + d, Writable: true, Name: d}))
	}
	must(t, dst.MigrateIncoming(ctx, "unix:"+migSock))

	// The source: a client node per export and a mirror into it.
	must(t, src.Cont(ctx))
	var ready, ends []*qmp.Waiter
	for _, d := range []struct{ name, sync string }{{"empty", qmp.SyncFull}, {"overlay", qmp.SyncTop}} {
		job := "mirror-" + d.name
		must(t, src.BlockdevAdd(ctx, qmp.NBDBlockdev("nbd-"+d.name, nbdSock, d.name)))
		ready = append(ready, src.NewWaiter(qmp.EventBlockJobReady, qmp.IsBlockJob(job)))
		ends = append(ends, src.NewWaiter("", qmp.IsBlockJobEnd(job)))
		must(t, src.BlockdevMirror(ctx, qmp.BlockdevMirror{JobID: job, Device: "drive-" + d.name, Target: "nbd-" + d.name,
			Sync: d.sync, CopyMode: qmp.CopyWriteBlocking}))
	}
	for _, w := range ready {
		if _, err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	jobs, err := src.QueryBlockJobs(ctx)
	if err != nil || len(jobs) != 2 || !jobs[0].Ready || !jobs[1].Ready {
		t.Fatalf("query-block-jobs = %+v, %v; want two ready mirrors", jobs, err)
	}

	// Memory, paused before the switch-over so the mirrors end while the guest is stopped.
	must(t, src.MigrateSetCapabilities(ctx, append(events, qmp.MigrationCapabilityStatus{Capability: qmp.CapPauseBeforeSwitchover, State: true})))
	paused := src.NewWaiter(qmp.EventMigration, migrationStatus(qmp.MigrationPreSwitchover, qmp.MigrationFailed))
	srcDone := src.NewWaiter(qmp.EventMigration, migrationStatus(qmp.MigrationCompleted, qmp.MigrationFailed))
	dstDone := dst.NewWaiter(qmp.EventMigration, migrationStatus(qmp.MigrationCompleted, qmp.MigrationFailed))
	must(t, src.Migrate(ctx, qmp.MigrateOptions{URI: "unix:" + migSock}))
	if ev, err := paused.Wait(ctx); err != nil || ev.Data["status"] != string(qmp.MigrationPreSwitchover) {
		t.Fatalf("migration before the switch-over: %v %v", ev.Data, err)
	}
	for i, job := range []string{"mirror-empty", "mirror-overlay"} {
		must(t, src.BlockJobCancel(ctx, job, false))
		ev, err := ends[i].Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		end, err := qmp.ParseBlockJobEnd(ev)
		if err != nil || end.Cancelled || end.Error != "" || end.Offset != end.Len {
			t.Fatalf("%s ended %+v (%v); want completed in sync", job, end, err)
		}
	}
	for _, d := range []string{"empty", "overlay"} {
		must(t, src.BlockdevDel(ctx, "nbd-"+d))
	}
	must(t, src.MigrateContinue(ctx, qmp.MigrationPreSwitchover))
	for _, w := range []*qmp.Waiter{srcDone, dstDone} {
		if ev, err := w.Wait(ctx); err != nil || ev.Data["status"] != string(qmp.MigrationCompleted) {
			t.Fatalf("migration ended %v %v", ev.Data, err)
		}
	}
	must(t, dst.NBDServerStop(ctx))

	quit(ctx, t, src, srcProc)
	quit(ctx, t, dst, dstProc)
	run("qemu-img", "compare", "-q", "-f", "raw", "-F", "raw", img("src-empty.raw"), img("dst-empty.raw"))
	run("qemu-img", "compare", "-q", "-f", "qcow2", "-F", "qcow2", img("src-overlay.qcow2"), img("dst-overlay.qcow2"))
	// The overlay got the top only: the destination's file holds the written cluster, not the base.
	if st, err := os.Stat(img("dst-overlay.qcow2")); err != nil || st.Size() > 1<<20 {
		t.Errorf("destination overlay: %v, %d bytes; want a small overlay over the same base", err, st.Size())
	}
}

func migrationStatus(want ...qmp.MigrationStatus) func(gqmp.Event) bool {
	return func(ev gqmp.Event) bool {
		for _, s := range want {
			if ev.Data["status"] == string(s) {
				return true
			}
		}
		return false
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func quit(ctx context.Context, t *testing.T, m *qmp.Monitor, p *qemuProc) {
	t.Helper()
	if err := m.Quit(ctx); err != nil {
		t.Fatal(err)
	}
	p.waitExit(t, qemuTimeout)
}

// TestQEMUSchemaMatchesBlockCommands checks the block job and export commands' members and enums
// against the running QEMU's schema, as TestQEMUSchemaMatchesTypedCommands does for the others.
func TestQEMUSchemaMatchesBlockCommands(t *testing.T) {
	m, _ := startQEMU(t, qemuConfig{})
	ctx := testContext(t)
	s, err := m.QueryQMPSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	args := func(cmd, tag string) map[string]bool {
		t.Helper()
		members, ok := s.CommandArgs(cmd, tag)
		if !ok {
			t.Fatalf("schema has no command %s (variant %q)", cmd, tag)
		}
		return memberSet(members)
	}
	assertSubset(t, "nbd-server-start", []string{"addr", "max-connections"}, args("nbd-server-start", ""))
	assertSubset(t, "block-export-add nbd", append(jsonNames(qmp.BlockExportNBD{}), "type"), args("block-export-add", "nbd"))
	assertSubset(t, "blockdev-add nbd", []string{"driver", "node-name", "server", "export"}, args("blockdev-add", "nbd"))
	assertSubset(t, "blockdev-mirror", jsonNames(qmp.BlockdevMirror{}), args("blockdev-mirror", ""))
	assertSubset(t, "block-job-cancel", []string{"device", "force"}, args("block-job-cancel", ""))
	assertSubset(t, "migrate-continue", []string{"state"}, args("migrate-continue", ""))
	if _, ok := s.CommandArgs("nbd-server-stop", ""); !ok {
		t.Error("schema has no command nbd-server-stop")
	}
	jobs, _ := s.Lookup(mustRetType(t, s, "query-block-jobs"))
	assertSubset(t, "query-block-jobs entry", jsonNames(qmp.BlockJobInfo{}), objectMembers(t, s, jobs.ElementType))
	mirror := mustArgType(t, s, "blockdev-mirror")
	assertSubset(t, "mirror sync modes", []string{qmp.SyncFull, qmp.SyncTop}, toSet(enumValues(t, s, memberType(t, s, mirror, "sync"))))
	assertSubset(t, "mirror copy modes", []string{qmp.CopyBackground, qmp.CopyWriteBlocking}, toSet(enumValues(t, s, memberType(t, s, mirror, "copy-mode"))))
	for _, ev := range []string{qmp.EventBlockJobReady, qmp.EventBlockJobCompleted, qmp.EventBlockJobCancelled, qmp.EventBlockJobError} {
		if info, ok := s.Lookup(ev); !ok || info.MetaType != "event" {
			t.Errorf("schema has no event %s", ev)
		}
	}
}
