package launcher_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestCPUHotplug boots the test guest with one socket and room for two (maxSockets), plugs
// the second while it runs (KubeVirt's CPU hotplug): the guest finds the new vCPU, onlines it and
// counts two processors. Unplugging, or more sockets than the room, is refused naming the field.
// The guest then live-migrates to a target started with both sockets and keeps its two vCPUs.
func TestGuestCPUHotplug(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	vmi := guestVMI(t)
	vmi.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 1, Threads: 1, MaxSockets: 2}
	src, con := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
	from := len(con.Text())
	con.Send(t, `echo "CPUS-$(ls -d /sys/devices/system/cpu/cpu[0-9]* | wc -l)-$(grep -c ^processor /proc/cpuinfo)-END"`)
	con.Expect(t, from, "CPUS-1-1-END", time.Minute)

	if err := src.client.SetSockets(ctx, 2); err != nil {
		t.Fatalf("plug a socket: %v", err)
	}
	if st, err := src.client.Status(ctx); err != nil || st.Sockets != 2 {
		t.Fatalf("status after the plug: sockets %d, %v; want 2", st.Sockets, err)
	}
	from = len(con.Text())
	con.Send(t, `for i in $(seq 30); do [ -e /sys/devices/system/cpu/cpu1/online ] && break; sleep 1; done; `+
		`echo 1 > /sys/devices/system/cpu/cpu1/online; echo "PLUGGED-$(grep -c ^processor /proc/cpuinfo)-END"`)
	con.Expect(t, from, "PLUGGED-2-END", time.Minute)
	if err := src.client.SetSockets(ctx, 2); err != nil {
		t.Errorf("asking again for the sockets the guest has: %v", err)
	}
	for _, sockets := range []uint32{1, 3} {
		err := src.client.SetSockets(ctx, sockets)
		var apiErr *launcher.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != "machine.cpu.sockets" {
			t.Errorf("set %d sockets: %v (field %q), want a 400 naming machine.cpu.sockets", sockets, err, fieldOf(apiErr))
		}
	}

	con.Send(t, "tick 100000 &")
	con.Expect(t, 0, "tick 3", time.Minute)
	dst := newLauncher(t)
	st, err := src.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The target starts with the sockets the instance's spec has now.
	vmi.Spec.Domain.CPU.Sockets = 2
	target := testutil.SyncRequest(t, vmi, nil)
	target.Machine.UID, target.Incoming = st.UID, true
	if st, err := dst.client.Sync(ctx, target); err != nil || st.Phase != protocol.PhaseIncoming {
		t.Fatalf("sync target: %v (phase %s)", err, st.Phase)
	}
	dstCon := attach(t, dst.runDir)
	before := migrate(t, src, dst, con)
	waitFor(t, 2*time.Minute, "the target to run", func() bool {
		st, err := dst.client.Status(ctx)
		return err == nil && st.Phase == protocol.PhaseRunning && st.RunState == "running"
	})
	waitFor(t, time.Minute, "the counter to go on on the target", func() bool { return dstCon.LastTick() > before+1 })
	from = len(dstCon.Text())
	dstCon.Send(t, `echo "MIGRATED-$(grep -c ^processor /proc/cpuinfo)-END"`)
	dstCon.Expect(t, from, "MIGRATED-2-END", time.Minute)
	if st, _ := dst.client.Status(ctx); st.Sockets != 2 {
		t.Errorf("the target reports %d sockets, want 2", st.Sockets)
	}
}
