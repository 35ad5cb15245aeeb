package launcher_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestDiskBusesSeenByTheGuest boots the guest with a disk on each bus and a cdrom from a
// containerDisk, and lists what the guest's kernel found: a virtio disk (vda), a SATA disk (the
// ATA vendor), a SCSI disk on virtio-scsi (QEMU's vendor), each at its size, and the cdrom,
// readable.
func TestDiskBusesSeenByTheGuest(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	vmi := guestVMI(t)
	disk := func(name string, bus v1alpha1.DiskBus) v1alpha1.Disk {
		return v1alpha1.Disk{Name: name, Disk: &v1alpha1.DiskTarget{Bus: bus}}
	}
	empty := func(name, size string) v1alpha1.Volume {
		return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{
			EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse(size)}}}
	}
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{
		disk("onvirtio", v1alpha1.DiskBusVirtio), disk("onsata", v1alpha1.DiskBusSATA), disk("onscsi", v1alpha1.DiskBusSCSI),
		{Name: "cd", CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSATA}},
	}
	vmi.Spec.Volumes = []v1alpha1.Volume{empty("onvirtio", "16Mi"), empty("onsata", "24Mi"), empty("onscsi", "32Mi"),
		{Name: "cd", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: reg.images.ContainerDisk}}}}

	v := newLauncherWith(t, imageResolver(t, reg, t.TempDir()))
	if _, err := v.client.Sync(context.Background(), testutil.SyncRequest(t, vmi, nil)); err != nil {
		t.Fatalf("sync: %v", err)
	}
	con := attach(t, v.runDir)
	at := con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	con.Send(t, `for i in $(seq 30); do [ -b /dev/sr0 ] && [ -b /dev/sdb ] && break; sleep 1; done; `+
		`for d in /sys/block/vd* /sys/block/sd* /sys/block/sr*; do echo "BLK-${d##*/}-$(cat $d/size)-$(cat $d/device/vendor 2>/dev/null | tr -d ' ')"; done; `+
		`echo "CDREAD-$(dd if=/dev/sr0 bs=2048 count=16 2>/dev/null | wc -c)"; echo LISTED-$((20+3))`)
	con.Expect(t, at, "LISTED-23", 60*time.Second)
	out := con.Text()[at:]
	// Sizes are in 512-byte sectors. Which of the two sd disks comes first depends on probe order.
	for _, want := range []string{"BLK-vda-32768-", "-49152-ATA", "-65536-QEMU", "BLK-sr0-131072-", "CDREAD-32768"} {
		if !strings.Contains(out, want) {
			t.Errorf("the guest's block devices lack %q:\n%s", want, out)
		}
	}
	t.Logf("the guest lists:\n%s", out)
}
