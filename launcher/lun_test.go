package launcher_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// lunGuest is the test guest with a lun disk on a block-mode claim whose device is device.
func lunGuest(t *testing.T, device string) *machine.Machine {
	t.Helper()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "san", LUN: &v1alpha1.LunTarget{}}}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "san", VolumeSource: v1alpha1.VolumeSource{
		PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "san-pvc"}}}}
	m := claimMachine(t, vmi, map[string]translate.Claim{"san-pvc": {Block: true}})
	if d := m.Disks[0]; !d.LUN || d.Bus != machine.BusSCSI {
		t.Fatalf("the lun disk translates to %+v, want a LUN on the scsi bus", d)
	}
	m.Disks[0].Source.Claim.Device = device
	return m
}

// TestLunNeedsSCSIDevice: a lun on a block device that takes no SCSI commands (a loop device, the
// only block devices these machines can make) is refused by the launcher before QEMU starts, with
// the claim and the device named, not with QEMU's "Is this a SCSI device?".
func TestLunNeedsSCSIDevice(t *testing.T) {
	dev := loopDevice(t, 16<<20)
	v := newLauncher(t)
	_, err := v.client.Sync(context.Background(), &protocol.SyncRequest{Machine: *lunGuest(t, dev)})
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) {
		t.Fatalf("sync of a lun on %s: %v, want the launcher's refusal", dev, err)
	}
	for _, want := range []string{"claim san-pvc", "takes no SCSI commands", dev} {
		if !strings.Contains(apiErr.Msg, want) {
			t.Errorf("refusal %q does not say %q", apiErr.Msg, want)
		}
	}
	if !strings.HasSuffix(apiErr.Field, ".device") {
		t.Errorf("refusal at field %q, want the claim's device", apiErr.Field)
	}
	if st, err := v.client.Status(context.Background()); err != nil || st.PID != 0 {
		t.Errorf("after the refusal: %+v, %v; want no QEMU started", st, err)
	}
}

// TestQEMUTakesLun gives the real QEMU the argv of a lun on a loop device, built as the launcher
// builds it: QEMU takes the scsi-block device and its drive and stops only at the device's lack
// of SG_IO. A SCSI LUN to pass through (iSCSI, Fibre Channel, scsi_debug) cannot be made on these
// machines (their kernel has no SCSI modules), so this is as far as a passed-through LUN runs here.
func TestQEMUTakesLun(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatalf("qemu-system-x86_64 is required (apt-get install -y qemu-system-x86): %v", err)
	}
	dev := loopDevice(t, 16<<20)
	// Short: QEMU's sockets are made here, before the devices, and unix socket paths are short.
	runDir, err := os.MkdirTemp("", "qvl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	m := &launcher.Machine{Machine: *lunGuest(t, dev), RunDir: runDir, Images: map[string]launcher.DiskImage{
		"san": {Path: dev, Format: "raw", Device: true}}}
	m.Kernel = nil
	argv, err := launcher.BuildArgv(m)
	if err != nil {
		t.Fatalf("BuildArgv: %v", err)
	}
	if !strings.Contains(strings.Join(argv, " "), "scsi-block,id=disk-san,bus=scsi0.0") {
		t.Fatalf("no scsi-block device in %q", argv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("QEMU ran a lun on loop device %s: %s", dev, out)
	}
	const want = "-device scsi-block,id=disk-san,bus=scsi0.0,channel=0,scsi-id=0,lun=0,drive=drive-san: cannot get SG_IO version number"
	if !strings.Contains(string(out), want) {
		t.Errorf("QEMU said %q (%v), want it to stop at %q", out, err, want)
	}
}
