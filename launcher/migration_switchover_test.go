package launcher_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher/protocol"
)

// TestTargetKilledAtSwitchoverKeepsTheGuestOnTheSource kills the target QEMU right at switch-over:
// it has received the guest's whole state and holds it, but the source has not heard so yet (a
// proxy on the migration connection holds back what the target sends to the source). The source
// must not have given up its guest: the migration fails, and the guest keeps running on the
// source with its state (its counter goes on; it does not boot again). A kill after the source
// heard is TestTargetKilledDuringHandoverKeepsTheGuestOnTheSource.
func TestTargetKilledAtSwitchoverKeepsTheGuestOnTheSource(t *testing.T) {
	t.Parallel()
	src, srcConsole := boot(t)
	ctx := context.Background()
	dst := countingTarget(t, src, srcConsole)
	uri, err := dst.client.PrepareMigrationTarget(ctx, protocol.MigrationTarget{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	proxy := holdReturnPath(t, strings.TrimPrefix(uri, "tcp:"))
	booted := strings.Count(srcConsole.Text(), "QVIRT-GUEST-READY")
	if err := src.client.MigrateSource(ctx, protocol.MigrationSource{URI: "tcp:" + proxy, BandwidthBytesPerSecond: -1, BlockMigration: nbdOf(dst)}); err != nil {
		t.Fatal(err)
	}
	var dstStatus protocol.Status
	waitFor(t, 2*time.Minute, "the target to have loaded the guest", func() bool {
		dstStatus, err = dst.client.Status(ctx)
		return err == nil && dstStatus.Migration != nil && dstStatus.Migration.Status == "completed"
	})
	if err := syscall.Kill(dstStatus.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	var st protocol.Status
	waitFor(t, time.Minute, "the source's migration to end", func() bool {
		st, err = src.client.Status(ctx)
		return err == nil && (st.Exit != nil || st.Migration != nil && (st.Migration.Status == "failed" || st.Migration.Status == "completed"))
	})
	if st.Exit != nil || st.Migration.Status != "failed" {
		t.Fatalf("the source gave up its guest before the target was known good: exit %+v, migration %+v", st.Exit, st.Migration)
	}
	waitFor(t, 30*time.Second, "the guest to run on the source", func() bool {
		st, err = src.client.Status(ctx)
		return err == nil && st.Phase == protocol.PhaseRunning && st.RunState == "running"
	})
	last := srcConsole.LastTick()
	waitFor(t, time.Minute, "the counter to go on on the source", func() bool { return srcConsole.LastTick() > last+1 })
	if n := strings.Count(srcConsole.Text(), "QVIRT-GUEST-READY"); n != booted {
		t.Fatalf("the guest booted again on the source:\n%s", srcConsole.Text())
	}
}

// holdReturnPath listens on loopback and relays one connection to target: what the source sends
// goes through, what the target answers is read and dropped, so a source that waits for the
// target's acknowledgement waits until the target goes away (then the source's connection closes).
// It returns the proxy's address.
func holdReturnPath(t *testing.T, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		track(in)
		defer in.Close()
		out, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		track(out)
		defer out.Close()
		go func() { _, _ = io.Copy(out, in) }()
		_, _ = io.Copy(io.Discard, out) // until the target goes away
	}()
	return ln.Addr().String()
}
