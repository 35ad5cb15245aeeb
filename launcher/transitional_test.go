package launcher_test

import (
	"testing"
	"time"

	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestVirtioTransitional: with useVirtioTransitional, a guest whose virtio driver speaks only
// the legacy (pre-1.0) interface, as RHEL 6's does (here the test guest's own driver made to by
// virtio_pci.force_legacy), boots and reads its virtio disk, which is QEMU's transitional
// virtio-blk (1af4:1001) on conventional PCI.
func TestGuestVirtioTransitional(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.UseVirtioTransitional = ptr(true)
	kb := vmi.Spec.Domain.Firmware.KernelBoot
	kb.KernelArgs += " virtio_pci.force_legacy=1"
	_, c := bootGuest(t, testutil.SyncRequest(t, vmi, nil))
	run := func(line, want string) {
		t.Helper()
		from := len(c.Text())
		c.Send(t, line)
		c.Expect(t, from, want, time.Minute)
	}
	run(`echo "LEGACY-[$(cat /sys/module/virtio_pci/parameters/force_legacy)]"`, "LEGACY-[Y]")
	run(`d=$(readlink -f /sys/block/vda/device/..); echo "VDA-[$(cat $d/vendor):$(cat $d/device)]"`, "VDA-[0x1af4:0x1001]")
	run(`echo "READ-[$(dd if=/dev/vda bs=4096 count=4 2>/dev/null | wc -c)]"`, "READ-[16384]")
}
