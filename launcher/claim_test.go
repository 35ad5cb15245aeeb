package launcher_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// claimGuest is the test guest with two disks on claims: vda on a filesystem-mode claim whose
// volume is dir (ephemeral: under an overlay), vdb on a block-mode claim that is device.
func claimGuest(t *testing.T, dir, device string, ephemeral bool) *protocol.SyncRequest {
	t.Helper()
	vmi := guestVMI(t)
	disk := func(name, serial string) v1alpha1.Disk {
		return v1alpha1.Disk{Name: name, Serial: serial, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}
	}
	data := v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "data-pvc"}}
	if ephemeral {
		data = v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{PersistentVolumeClaim: data.PersistentVolumeClaim}}
	}
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{disk("data", "DATA"), disk("raw", "RAW")}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "data", VolumeSource: data}, {Name: "raw", VolumeSource: v1alpha1.VolumeSource{
		PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "raw-pvc"}}}}
	m := claimMachine(t, vmi, map[string]translate.Claim{"data-pvc": {CapacityBytes: 64 << 20}, "raw-pvc": {Block: true}})
	// The pod's paths, as the launcher pod would have them, are here the test's.
	m.Disks[0].Source.Claim.Dir = dir
	m.Disks[1].Source.Claim.Device = device
	return &protocol.SyncRequest{Machine: *m}
}

// claimMachine translates vmi as the node agent would in a pod that has claims.
func claimMachine(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, claims map[string]translate.Claim) *machine.Machine {
	t.Helper()
	m, err := translate.Machine(vmi, translate.Host{Emulation: true, Pod: &translate.PodVolumes{Claims: claims}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// loopDevice attaches a new file of size bytes as a loop device (with losetup's further args),
// detached when the test ends.
func loopDevice(t *testing.T, size int64, args ...string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "block.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", append(args, "--find", "--show", file)...).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// runClaimGuest boots the claim guest in a new launcher, runs script on its console, kills QEMU
// once the guest synced what it wrote, and returns what the console printed. n tells the runs
// apart in the done marker (the shell computes it, so the echoed command line does not match).
func runClaimGuest(t *testing.T, req *protocol.SyncRequest, script string, n int) string {
	t.Helper()
	ctx := context.Background()
	v := newLauncher(t)
	if _, err := v.client.Sync(ctx, req); err != nil {
		t.Fatalf("sync: %v", err)
	}
	c := attach(t, v.runDir)
	at := c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Send(t, fmt.Sprintf("for i in $(seq 30); do [ -b /dev/vdb ] && break; sleep 1; done; %s; sync; echo DONE-$((%d+1))", script, n))
	end := c.Expect(t, at, fmt.Sprintf("DONE-%d", n+1), time.Minute)
	if err := v.client.Kill(ctx); err != nil {
		t.Fatalf("kill: %v", err)
	}
	waitFor(t, 10*time.Second, "QEMU to exit", func() bool { st, _ := v.client.Status(ctx); return st.Exit != nil })
	return c.Text()[at:end]
}

// TestClaimDisksKeepDataAcrossLaunchers: a filesystem-mode claim's disk.img is created sparse at
// the capacity less the filesystem overhead and keeps what the guest wrote when a new launcher
// starts the VM again on the same volume; a block-mode claim (a loop device) does too; the same
// claim as an ephemeral volume shows the guest what the claim holds, takes its writes in an
// overlay, and the next start finds the claim as it was.
func TestClaimDisksKeepDataAcrossLaunchers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dev := loopDevice(t, 16<<20)
	read := `echo "DATA=$(head -c 12 /dev/vda) RAW=$(head -c 11 /dev/vdb) SIZE=$(cat /sys/block/vda/size)"`

	out := runClaimGuest(t, claimGuest(t, dir, dev, false),
		read+"; printf QVIRT-MARK-1 > /dev/vda; printf QVIRT-RAW-1 > /dev/vdb", 1)
	// 64 MiB less 5.5% is 60.48 MiB, aligned down to 60 MiB: 122880 sectors.
	if !strings.Contains(out, "SIZE=122880") {
		t.Errorf("the guest's vda is not 60 MiB:\n%s", out)
	}
	st, err := os.Stat(filepath.Join(dir, machine.ClaimImage))
	if err != nil || st.Size() != 60<<20 {
		t.Fatalf("disk.img: %v, size %d; want 60 MiB", err, st.Size())
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("disk.img mode %v", st.Mode())
	}
	// Sparse, as KubeVirt creates it: a claim's capacity is not taken on the volume until the
	// guest writes (the guest wrote 12 bytes).
	if used := st.Sys().(*syscall.Stat_t).Blocks * 512; used > st.Size()/16 {
		t.Errorf("disk.img is not sparse: %d bytes allocated for its %d", used, st.Size())
	}

	out = runClaimGuest(t, claimGuest(t, dir, dev, true),
		read+"; printf QVIRT-MARK-2 > /dev/vda; echo \"AFTER=$(head -c 12 /dev/vda)\"", 2)
	for _, want := range []string{"DATA=QVIRT-MARK-1 RAW=QVIRT-RAW-1", "AFTER=QVIRT-MARK-2"} {
		if !strings.Contains(out, want) {
			t.Errorf("second start (data ephemeral): the guest did not print %q:\n%s", want, out)
		}
	}

	out = runClaimGuest(t, claimGuest(t, dir, dev, false), read, 3)
	if !strings.Contains(out, "DATA=QVIRT-MARK-1 RAW=QVIRT-RAW-1") {
		t.Errorf("third start: the claims do not hold the first start's writes (the ephemeral overlay's must be gone):\n%s", out)
	}
}
