package launcher_test

import (
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// nbdOf is dst's NBD server of local disks, which a source on the same host reaches directly.
func nbdOf(dst *vm) *protocol.BlockMigration {
	return &protocol.BlockMigration{URI: "unix:" + launcher.Dir(dst.runDir).NBDIn()}
}

// localDiskVMI is the test guest with two disks whose contents live only beside the launcher:
// its emptyDisk (serial SCRATCH) and a writable containerDisk (serial CDISK) over a qcow2 image
// that starts with QVIRT-ORIGINAL-2.
func localDiskVMI(t *testing.T) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	dir, _ := containerDiskImage(t, "QVIRT-ORIGINAL-2", "qcow2")
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{
		{Name: "scratch", Serial: "SCRATCH", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}},
		{Name: "cd", Serial: "CDISK", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}},
	}
	vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: "cd", VolumeSource: v1alpha1.VolumeSource{
		ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "file://" + dir}}})
	return vmi
}

// diskShell defines, in the guest's shell, dev (a disk's device by serial), put (write a string
// at a 512-byte block of a disk, flushed) and get (read a block from the disk itself, the page
// cache dropped, printed between markers that the typed line does not contain).
const diskShell = `dev() { for d in /sys/block/vd*; do [ "$(cat $d/serial)" = "$1" ] && echo /dev/${d##*/}; done; }; ` +
	`put() { printf "$3" | dd of=$(dev $1) bs=512 seek=$2 conv=notrunc,fsync 2>/dev/null; }; ` +
	`get() { sync; echo 3 > /proc/sys/vm/drop_caches; echo "<$1:$2=$(dd if=$(dev $1) bs=512 skip=$2 count=1 2>/dev/null | head -c 24 | tr -d '\000')>"; }`

// bootLocalDiskGuest boots localDiskVMI and defines diskShell in its shell.
func bootLocalDiskGuest(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) (*vm, *console) {
	t.Helper()
	v := newLauncher(t)
	if _, err := v.client.Sync(context.Background(), testutil.SyncRequest(t, vmi, nil)); err != nil {
		t.Fatalf("sync: %v", err)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Send(t, diskShell)
	return v, c
}

// localDiskTarget is a launcher waiting for src's guest with vmi's machine.
func localDiskTarget(t *testing.T, src *vm, vmi *v1alpha1.VirtualMachineInstance) *vm {
	t.Helper()
	return incomingTarget(t, src, testutil.SyncRequest(t, vmi, nil))
}

// incomingTarget is a launcher waiting for src's guest, synced with req made incoming.
func incomingTarget(t *testing.T, src *vm, req *protocol.SyncRequest) *vm {
	t.Helper()
	ctx := context.Background()
	st, err := src.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dst := newLauncher(t)
	req.Machine.UID, req.Incoming = st.UID, true
	if st, err := dst.client.Sync(ctx, req); err != nil || st.Phase != protocol.PhaseIncoming {
		t.Fatalf("sync target: %v (phase %s)", err, st.Phase)
	}
	return dst
}

// liveMigrate moves src's guest to dst, unthrottled, with no local disk to copy, and hands it over.
func liveMigrate(t *testing.T, src, dst *vm) {
	t.Helper()
	ctx := context.Background()
	uri, err := dst.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.client.MigrateSource(ctx, protocol.MigrationSource{URI: uri, BandwidthBytesPerSecond: -1}); err != nil {
		t.Fatal(err)
	}
	handOver(t, src, dst)
}

// read returns what get prints for block n of the disk with serial s.
func read(t *testing.T, c *console, s string, n int) string {
	t.Helper()
	from := len(c.Text())
	tag := s + ":" + strconv.Itoa(n)
	c.Send(t, "get "+s+" "+strconv.Itoa(n))
	re := regexp.MustCompile(`<` + regexp.QuoteMeta(tag) + `=([^>\r\n]*)>`)
	var got string
	waitFor(t, time.Minute, "block "+tag+" read back", func() bool {
		m := re.FindStringSubmatch(c.Text()[from:])
		if m != nil {
			got = m[1]
		}
		return m != nil
	})
	return got
}

// guestNumber runs a command printing a number in the guest and returns it. An answer that is not
// a number fails the test at once, naming it: waiting on would only time out. The answer cannot
// start with "$", so the echo of the typed line ("<N=$(...") is not taken for it.
func guestNumber(t *testing.T, c *console, cmd string) int {
	t.Helper()
	from := len(c.Text())
	c.Send(t, `echo "<N=$(`+cmd+`)>"`)
	re := regexp.MustCompile(`<N=([^$>\r\n]*)>`)
	var answer []string
	testutil.Eventually(t, time.Minute, "the guest's answer to "+cmd, func() bool {
		answer = re.FindStringSubmatch(c.Text()[from:])
		return answer != nil
	}, func() string { return "console ends with " + strconv.Quote(testutil.Tail(c.Text(), 300)) })
	n, err := strconv.Atoi(answer[1])
	if err != nil {
		t.Fatalf("the guest answered %q to %s, want a number", answer[1], cmd)
	}
	return n
}

// TestBlockMigrationCarriesLocalDisks migrates a guest with an emptyDisk and a writable
// containerDisk: what the guest wrote to both before the migration, and what it keeps writing to
// the emptyDisk while the migration runs, reads back from the target's disks (the guest's page
// cache dropped), the containerDisk's image still shows under the guest's writes, and the target's
// NBD server is gone once the guest runs there.
func TestBlockMigrationCarriesLocalDisks(t *testing.T) {
	t.Parallel()
	vmi := localDiskVMI(t)
	src, c := bootLocalDiskGuest(t, vmi)
	ctx := context.Background()
	c.Send(t, "put SCRATCH 2048 QVIRT-EMPTY-MARK; put CDISK 2048 QVIRT-CDISK-MARK")
	if got := read(t, c, "SCRATCH", 2048); got != "QVIRT-EMPTY-MARK" {
		t.Fatalf("the emptyDisk reads %q on the source", got)
	}
	// A writer that goes on during the migration: sequence number n at block 8192, then n in
	// /tmp/seq (guest memory, which migrates), renamed into place: a cat between the shell's
	// truncation of the file and its write would read nothing (seen once in CI).
	c.Send(t, `(i=0; while :; do i=$((i+1)); put SCRATCH 8192 "SEQ-$i"; echo $i > /tmp/seq.new; mv /tmp/seq.new /tmp/seq; sleep 0.05; done) & W=$!`)
	waitFor(t, time.Minute, "the writer to write", func() bool { return guestNumber(t, c, "cat /tmp/seq 2>/dev/null || echo 0") > 3 })

	dst := localDiskTarget(t, src, vmi)
	dc := attach(t, dst.runDir)
	uri, err := dst.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	before := guestNumber(t, c, "cat /tmp/seq")
	if err := src.client.MigrateSource(ctx, protocol.MigrationSource{URI: uri, BandwidthBytesPerSecond: -1, BlockMigration: nbdOf(dst)}); err != nil {
		t.Fatal(err)
	}
	handOver(t, src, dst)
	st, err := src.client.Status(ctx)
	if err != nil || st.Exit == nil || st.Exit.Reason != protocol.ExitMigrated || st.Migration == nil || st.Migration.Status != "completed" {
		t.Fatalf("source ended %+v, migration %+v; want migrated/completed", st.Exit, st.Migration)
	}
	if st.Migration.DiskTotalBytes <= 0 || st.Migration.DiskTransferredBytes != st.Migration.DiskTotalBytes {
		t.Errorf("migration %+v: want the disks' copy counted, and complete", st.Migration)
	}
	waitFor(t, 30*time.Second, "the target to run", func() bool {
		s, err := dst.client.Status(ctx)
		return err == nil && s.Phase == protocol.PhaseRunning && s.RunState == "running"
	})

	// The writer goes on on the target, against the target's disk.
	after := guestNumber(t, dc, "cat /tmp/seq")
	waitFor(t, time.Minute, "the writer to go on on the target", func() bool { return guestNumber(t, dc, "cat /tmp/seq") > after+3 })
	dc.Send(t, "kill $W")
	last := guestNumber(t, dc, "sleep 1; cat /tmp/seq")
	if got := read(t, dc, "SCRATCH", 8192); got != "SEQ-"+strconv.Itoa(last) && got != "SEQ-"+strconv.Itoa(last+1) {
		t.Errorf("the emptyDisk's last write reads %q on the target; the guest wrote SEQ-%d last", got, last)
	}
	for _, want := range []struct {
		serial string
		block  int
		data   string
	}{
		{"SCRATCH", 2048, "QVIRT-EMPTY-MARK"},
		{"CDISK", 2048, "QVIRT-CDISK-MARK"},
		{"CDISK", 0, "QVIRT-ORIGINAL-2"},
	} {
		if got := read(t, dc, want.serial, want.block); got != want.data {
			t.Errorf("disk %s block %d reads %q on the target, want %q", want.serial, want.block, got, want.data)
		}
	}
	if strings.Contains(dc.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
	if conn, err := net.Dial("unix", launcher.Dir(dst.runDir).NBDIn()); err == nil {
		_ = conn.Close()
		t.Error("the target's NBD server still accepts connections to the guest's disks")
	}
	t.Logf("writes %d before the migration, %d at the switch, %d in all; disks %d bytes copied; downtime %d ms, total %d ms",
		before, after, last, st.Migration.DiskTransferredBytes, st.Migration.DowntimeMs, st.Migration.TotalTimeMs)
}

// TestBlockMigrationFailureKeepsTheSourceDisks: a source that cannot reach the target's disks
// does not migrate; a target that dies while the guest's memory is on its way fails the
// migration, and the guest goes on on the source with its disks as it wrote them (it keeps
// writing and reading them); a migration without a target for the local disks is refused, naming
// them; and a later migration to a new target carries the disks.
func TestBlockMigrationFailureKeepsTheSourceDisks(t *testing.T) {
	t.Parallel()
	vmi := localDiskVMI(t)
	src, c := bootLocalDiskGuest(t, vmi)
	ctx := context.Background()
	c.Send(t, "put SCRATCH 2048 QVIRT-BEFORE; tick 100000 &")
	c.Expect(t, 0, "tick 2\r\n", time.Minute)

	dst := localDiskTarget(t, src, vmi)
	uri, err := dst.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	// No block migration named: refused, naming the disks.
	err = src.client.MigrateSource(ctx, protocol.MigrationSource{URI: uri})
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || fieldOf(apiErr) != "blockMigration" ||
		!strings.Contains(apiErr.Msg, `"scratch"`) || !strings.Contains(apiErr.Msg, `"cd"`) {
		t.Fatalf("migration without a target for the local disks: %v; want a 400 at blockMigration naming both disks", err)
	}
	// Parallel streams out of bounds: refused, naming the field, on either end.
	for _, bad := range []struct {
		parallel protocol.ParallelStreams
		field    string
	}{
		{protocol.ParallelStreams{Channels: protocol.MaxParallelChannels + 1}, "parallel.channels"},
		{protocol.ParallelStreams{Channels: 2, Compression: "zlib"}, "parallel.compression"},
	} {
		err = src.client.MigrateSource(ctx, protocol.MigrationSource{URI: uri, BlockMigration: nbdOf(dst), Parallel: &bad.parallel})
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || fieldOf(apiErr) != bad.field {
			t.Errorf("migration over parallel streams %+v: %v; want a 400 at %s", bad.parallel, err, bad.field)
		}
		_, err = dst.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0", Parallel: &bad.parallel})
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || fieldOf(apiErr) != bad.field {
			t.Errorf("target for parallel streams %+v: %v; want a 400 at %s", bad.parallel, err, bad.field)
		}
	}
	// A target that exports nothing there: refused at once.
	err = src.client.MigrateSource(ctx, protocol.MigrationSource{URI: uri,
		BlockMigration: &protocol.BlockMigration{URI: "unix:" + launcher.Dir(src.runDir).NBDIn()}})
	if err == nil || !strings.Contains(err.Error(), `disk "cd"`) {
		t.Fatalf("migration to an absent NBD server: %v; want an error naming the disk", err)
	}
	// A link that stops carrying the disks' copy after 1 MiB of the 8 written: the copy makes no
	// progress, and after progressTimeout the launcher reports the migration cancelling, saying
	// why. The node agent then cuts the link (as migproxy's Tunnel.Cut does), and the migration
	// fails with that reason; the guest, whose writes waited for the copy (write-blocking), writes
	// again.
	from := len(c.Text())
	c.Send(t, "dd if=/dev/urandom of=$(dev SCRATCH) bs=1M seek=5 count=8 conv=fsync 2>/dev/null; echo FILLED-$((1+1))")
	c.Expect(t, from, "FILLED-2", time.Minute)
	stuck := localDiskTarget(t, src, vmi)
	stuckURI, err := stuck.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	link := newLink(t, launcher.Dir(stuck.runDir).NBDIn(), 1<<20)
	if err := src.client.MigrateSource(ctx, protocol.MigrationSource{URI: stuckURI, ProgressTimeout: 2 * time.Second,
		BlockMigration: &protocol.BlockMigration{URI: link.URI}}); err != nil {
		t.Fatal(err)
	}
	var stalled protocol.Status
	waitFor(t, 2*time.Minute, "the stalled disk copy to be cancelled", func() bool {
		stalled, err = src.client.Status(ctx)
		return err == nil && stalled.Migration != nil && stalled.Migration.Status != "setup"
	})
	if stalled.Migration.Status != "cancelling" || !strings.Contains(stalled.Migration.Error, "no progress copying the local disks") {
		t.Fatalf("source after its disk copy stalled: migration %+v; want cancelling for no progress", stalled.Migration)
	}
	link.Cut()
	waitFor(t, time.Minute, "the stalled migration to fail", func() bool {
		stalled, err = src.client.Status(ctx)
		return err == nil && stalled.Migration != nil && stalled.Migration.Status != "cancelling"
	})
	if stalled.Migration.Status != "failed" || !strings.Contains(stalled.Migration.Error, "no progress copying the local disks") || stalled.Exit != nil {
		t.Fatalf("source after its stalled copy's link was cut: exit %+v, migration %+v; want failed for no progress, the guest here", stalled.Exit, stalled.Migration)
	}
	t.Logf("stalled copy failed as %q", stalled.Migration.Error)
	c.Send(t, "put SCRATCH 3072 QVIRT-UNSTUCK")
	if got := read(t, c, "SCRATCH", 3072); got != "QVIRT-UNSTUCK" {
		t.Fatalf("the guest wrote %q after the stalled copy, want QVIRT-UNSTUCK", got)
	}

	// The memory at 1 MiB/s takes minutes: the target dies on the way.
	if err := src.client.MigrateSource(ctx, protocol.MigrationSource{URI: uri, BandwidthBytesPerSecond: 1 << 20, BlockMigration: nbdOf(dst)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "the memory migration to be under way", func() bool {
		st, err := src.client.Status(ctx)
		return err == nil && st.Migration != nil && st.Migration.Status == "active" && st.Migration.TransferredBytes > 0
	})
	dstStatus, err := dst.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(dstStatus.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var st protocol.Status
	waitFor(t, time.Minute, "the migration to fail", func() bool {
		st, err = src.client.Status(ctx)
		return err == nil && st.Migration != nil && (st.Migration.Status == "failed" || st.Migration.Status == "completed")
	})
	if st.Migration.Status != "failed" || st.Exit != nil {
		t.Fatalf("source after the target died: exit %+v, migration %+v; want failed, the guest here", st.Exit, st.Migration)
	}
	t.Logf("failed as %q", st.Migration.Error)
	waitFor(t, 30*time.Second, "the guest to run on the source", func() bool {
		st, err = src.client.Status(ctx)
		return err == nil && st.Phase == protocol.PhaseRunning && st.RunState == "running"
	})
	last := c.LastTick()
	waitFor(t, time.Minute, "the counter to go on on the source", func() bool { return c.LastTick() > last+1 })
	c.Send(t, "put SCRATCH 4096 QVIRT-AFTER")
	for block, want := range map[int]string{2048: "QVIRT-BEFORE", 4096: "QVIRT-AFTER"} {
		if got := read(t, c, "SCRATCH", block); got != want {
			t.Errorf("block %d reads %q on the source after the failed migration, want %q", block, got, want)
		}
	}

	// Nothing of the failed attempt is left in the way: the next migration carries the disks.
	next := localDiskTarget(t, src, vmi)
	nc := attach(t, next.runDir)
	beforeSwitch := migrate(t, src, next, c) // handOver checks the source ended as migrated
	waitFor(t, time.Minute, "the counter to go on on the new target", func() bool { return nc.LastTick() > beforeSwitch+1 })
	for block, want := range map[int]string{2048: "QVIRT-BEFORE", 4096: "QVIRT-AFTER"} {
		if got := read(t, nc, "SCRATCH", block); got != want {
			t.Errorf("block %d reads %q on the new target, want %q", block, got, want)
		}
	}
}
