package launcher_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// matchVolume is a hard disk on bus whose block sizes come from its volume.
func matchVolume(name string, bus v1alpha1.DiskBus) v1alpha1.Disk {
	return v1alpha1.Disk{Name: name, Disk: &v1alpha1.DiskTarget{Bus: bus},
		BlockSize: &v1alpha1.BlockSize{MatchVolume: &v1alpha1.FeatureState{}}}
}

// hostSizes runs a host command that prints block sizes, as the test's independent reading.
func hostSizes(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return strings.Join(strings.Fields(string(out)), "/")
}

// TestGuestMatchVolumeBlockSize: disks with blockSize.matchVolume show the guest the block sizes
// of their storage, as the host's own tools read them: a filesystem-mode claim its filesystem's
// block size, a block-mode claim (a loop device with 4096-byte sectors) its sector sizes, a
// hot-plugged emptyDisk its scratch directory's filesystem's. A disk given sizes already (a
// migration target gets the source's) keeps them. The launcher reports every disk's sizes for
// the node agent to record.
func TestGuestMatchVolumeBlockSize(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dev := loopDevice(t, 16<<20, "--sector-size", "4096")
	fsSize := hostSizes(t, "stat", "--file-system", "--format=%S", dir)
	devSizes := hostSizes(t, "blockdev", "--getss", "--getpbsz", dev)
	if devSizes != "4096/4096" {
		t.Fatalf("the loop device has sector sizes %s, want 4096/4096", devSizes)
	}
	if fsSize == "512" {
		t.Fatalf("the test directory's filesystem has 512-byte blocks, QEMU's default: the test could not tell")
	}

	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{matchVolume("data", v1alpha1.DiskBusVirtio),
		matchVolume("raw", v1alpha1.DiskBusVirtio), matchVolume("pinned", v1alpha1.DiskBusVirtio)}
	claim := func(name string) v1alpha1.VolumeSource {
		return v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: name}}
	}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "data", VolumeSource: claim("data-pvc")}, {Name: "raw", VolumeSource: claim("raw-pvc")},
		{Name: "pinned", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}}}}
	m := claimMachine(t, vmi, map[string]translate.Claim{"data-pvc": {CapacityBytes: 32 << 20}, "raw-pvc": {Block: true}})
	m.Disks[0].Source.Claim.Dir = dir
	m.Disks[1].Source.Claim.Device = dev
	for i, d := range m.Disks {
		if !d.MatchVolumeBlockSize || d.BlockSize != nil {
			t.Fatalf("disk %d translates to %+v, want sizes from its volume", i, d)
		}
	}
	// As the node agent describes a migration target's disk: the source's sizes.
	m.Disks[2].BlockSize = &machine.BlockSize{Logical: 1024, Physical: 2048}

	ctx := context.Background()
	v := newLauncher(t)
	if _, err := v.client.Sync(ctx, &protocol.SyncRequest{Machine: *m}); err != nil {
		t.Fatalf("sync: %v", err)
	}
	c := attach(t, v.runDir)
	at := c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

	hot := v1alpha1.Disk{Name: "hot", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio},
		BlockSize: &v1alpha1.BlockSize{MatchVolume: &v1alpha1.FeatureState{}}}
	hotVol := v1alpha1.Volume{Name: "hot", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}}}
	hd, err := translate.HotplugDisk(&v1alpha1.DomainSpec{}, &hot, &hotVol, nil, field.NewPath("spec", "domain", "devices", "disks").Index(3))
	if err != nil {
		t.Fatal(err)
	}
	attached, err := v.client.HotplugDisk(ctx, hd)
	if err != nil {
		t.Fatalf("hotplug: %v", err)
	}
	scratchSize := hostSizes(t, "stat", "--file-system", "--format=%S", v.runDir)
	if bs := attached.BlockSize; bs == nil || fmt.Sprint(bs.Logical) != scratchSize || fmt.Sprint(bs.Physical) != scratchSize {
		t.Errorf("hot-plugged disk attached with block sizes %+v, want %s from its filesystem", bs, scratchSize)
	}

	c.Send(t, `for i in $(seq 30); do [ -b /dev/vdd ] && break; sleep 1; done; for d in vda vdb vdc vdd; do q=/sys/block/$d/queue; echo "BS-$d-[$(cat $q/logical_block_size)/$(cat $q/physical_block_size)]"; done`)
	c.Expect(t, at, "BS-vdd-[", time.Minute)
	want := map[string]string{"vda": fsSize + "/" + fsSize, "vdb": devSizes, "vdc": "1024/2048", "vdd": scratchSize + "/" + scratchSize}
	for disk, sizes := range want {
		line := fmt.Sprintf("BS-%s-[%s]", disk, sizes)
		c.Expect(t, at, line, 10*time.Second)
	}

	st, err := v.client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, d := range st.Disks {
		if d.BlockSize != nil {
			got[d.Name] = fmt.Sprintf("%d/%d/%d", d.BlockSize.Logical, d.BlockSize.Physical, d.BlockSize.DiscardGranularity)
		}
	}
	devGran := hostSizes(t, "lsblk", "--nodeps", "--noheadings", "--bytes", "--output", "DISC-GRAN", dev)
	wantStatus := map[string]string{"data": fsSize + "/" + fsSize + "/" + fsSize, "raw": devSizes + "/" + devGran,
		"pinned": "1024/2048/0", "hot": scratchSize + "/" + scratchSize + "/" + scratchSize}
	for name, w := range wantStatus {
		if got[name] != w {
			t.Errorf("status reports disk %s with block sizes %q, want %q (all: %v)", name, got[name], w, got)
		}
	}
}

// TestMatchVolumeRefusesWhatQEMURefuses: a sata disk takes 512-byte logical blocks only, so one
// whose volume's storage has larger blocks is refused before QEMU starts, naming the field, the
// storage and the way out.
func TestMatchVolumeRefusesWhatQEMURefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if size := hostSizes(t, "stat", "--file-system", "--format=%S", dir); size == "512" {
		t.Fatalf("the test directory's filesystem has 512-byte blocks: the test could not tell")
	}
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{matchVolume("data", v1alpha1.DiskBusSATA)}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "data", VolumeSource: v1alpha1.VolumeSource{
		PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "data-pvc"}}}}
	m := claimMachine(t, vmi, map[string]translate.Claim{"data-pvc": {CapacityBytes: 32 << 20}})
	m.Disks[0].Source.Claim.Dir = dir
	v := newLauncher(t)
	_, err := v.client.Sync(context.Background(), &protocol.SyncRequest{Machine: *m})
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("sync: %v, want the launcher's refusal", err)
	}
	if apiErr.Field != "machine.disks[0].blockSize.logical" {
		t.Errorf("refused at %q, want machine.disks[0].blockSize.logical", apiErr.Field)
	}
	for _, want := range []string{"the volume's storage (" + dir, "a sata disk has 512-byte logical blocks", "set blockSize.custom instead of matchVolume"} {
		if !strings.Contains(apiErr.Msg, want) {
			t.Errorf("refusal %q does not say %q", apiErr.Msg, want)
		}
	}
}
