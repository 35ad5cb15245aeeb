package launcher_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestMemoryHotplug boots the test guest with 1Gi of memory and room up to 2Gi
// (memory.maxGuest, KubeVirt's memory hotplug), raises it to 1536Mi while it runs: the guest's
// virtio_mem driver plugs the blocks, the launcher reports them plugged, and the guest's MemTotal
// grows by the 512 MiB. Less memory, more than the room, or part of a block is refused naming the
// field; a live migration under TCG is refused naming maxMemoryMiB.
func TestGuestMemoryHotplug(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	vmi := guestVMI(t)
	one, two := resource.MustParse("1Gi"), resource.MustParse("2Gi")
	vmi.Spec.Domain.Memory.Guest, vmi.Spec.Domain.Memory.MaxGuest = &one, &two
	v, con := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
	st, err := v.client.Status(ctx)
	if err != nil || st.Memory == nil || *st.Memory != (protocol.MemoryStatus{BootMiB: 1024, RequestedMiB: 1024, PluggedMiB: 1024}) {
		t.Fatalf("status at boot: memory %+v, %v; want 1024 MiB booted, requested and plugged", st.Memory, err)
	}
	// The guest has no udev: it onlines hot-added memory blocks by the kernel's default instead.
	before := con.Number(t, `echo online > /sys/devices/system/memory/auto_online_blocks; modprobe virtio_mem; `+
		`echo "BEFORE-$(awk '/^MemTotal/ {print $2}' /proc/meminfo)-E""ND"`, "BEFORE")

	if err := v.client.SetGuestMemory(ctx, 1536); err != nil {
		t.Fatalf("plug memory: %v", err)
	}
	waitFor(t, 2*time.Minute, "the guest to plug 512 MiB", func() bool {
		st, err := v.client.Status(ctx)
		return err == nil && st.Memory != nil && st.Memory.PluggedMiB == 1536 && st.Memory.RequestedMiB == 1536
	})
	after := con.Number(t, `echo "AFTER-$(awk '/^MemTotal/ {print $2}' /proc/meminfo)-E""ND"`, "AFTER")
	if after-before != 512<<10 {
		t.Errorf("the guest's MemTotal went from %d to %d KiB, want 512 MiB more", before, after)
	}
	if err := v.client.SetGuestMemory(ctx, 1536); err != nil {
		t.Errorf("asking again for the memory the guest has: %v", err)
	}
	for _, mib := range []int64{1024, 3072, 1537} {
		err := v.client.SetGuestMemory(ctx, mib)
		var apiErr *launcher.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != "machine.memoryMiB" {
			t.Errorf("set %d MiB: %v (field %q), want a 400 naming machine.memoryMiB", mib, err, fieldOf(apiErr))
		}
	}
	err = v.client.MigrateSource(ctx, protocol.MigrationSource{URI: "tcp:127.0.0.1:9"})
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) || apiErr.Field != "machine.maxMemoryMiB" || !strings.Contains(apiErr.Msg, "under emulation") {
		t.Errorf("migrate: %v (field %q), want a refusal at machine.maxMemoryMiB", err, fieldOf(apiErr))
	}
}
