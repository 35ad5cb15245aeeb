package launcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestPanic: with KubeVirt's panicDevices (the default isa model and pvpanic), the guest's
// kernel finds both pvpanic devices, and a kernel panic ends QEMU with the exit reason the node
// agent turns into a Failed instance (GuestPanicked), instead of the reboot the guest's panic=-1
// asks for.
func TestGuestPanic(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.PanicDevices = []v1alpha1.PanicDevice{{}, {Model: ptr(v1alpha1.PanicPvpanic)}}
	v, c := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
	ctx := context.Background()

	// The ISA device is ACPI's QEMU0001 under pvpanic-mmio; the PCI one is 1b36:0011.
	from := len(c.Text())
	c.Send(t, `modprobe pvpanic_mmio; modprobe pvpanic_pci; `+
		`echo "PANIC-[$(ls /sys/bus/platform/drivers/pvpanic-mmio | grep -c QEMU0001)]-[$(ls /sys/bus/pci/drivers/pvpanic-pci | grep -c 0000:)]"`)
	c.Expect(t, from, "PANIC-[1]-[1]", time.Minute)

	c.Send(t, `echo c > /proc/sysrq-trigger`)
	waitFor(t, time.Minute, "QEMU to exit", func() bool {
		st, err := v.client.Status(ctx)
		return err == nil && st.Exit != nil
	})
	st, _ := v.client.Status(ctx)
	if st.Exit.Reason != protocol.ExitGuestPanicked || st.Phase != protocol.PhaseFailed {
		t.Fatalf("exit reason %q (%s), phase %s, want %q and %s; console ends with %q", st.Exit.Reason, st.Exit.Detail, st.Phase,
			protocol.ExitGuestPanicked, protocol.PhaseFailed, testutil.Tail(c.Text(), 600))
	}
}
