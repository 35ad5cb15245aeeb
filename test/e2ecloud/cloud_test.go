package e2ecloud

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// The user the cloud-config of every guest here creates, and the password it gets for the
// serial console (SSH takes the key only).
const (
	guestUser     = "qvirt"
	guestPassword = "console-only-4711"
)

// userData is the cloud-config of the guests: it names the host and creates the user with the
// SSH key and a console password.
func userData(hostname, authorizedKey string) string {
	return fmt.Sprintf(`#cloud-config
hostname: %s
users:
  - name: %s
    shell: /bin/bash
    lock_passwd: false
    plain_text_passwd: %s
    sudo: ALL=(ALL) NOPASSWD:ALL
    ssh_authorized_keys:
      - %s
`, hostname, guestUser, guestPassword, authorizedKey)
}

// bootReport is what the guest tells about itself over SSH: host name, firmware, secure boot as
// mokutil and the SecureBoot EFI variable say (the last byte of the global variable's efivarfs
// file, after the 4 attribute bytes; GUID EFI_GLOBAL_VARIABLE), and the cloud-init data source it
// used.
const bootReport = `echo "host=$(hostname)"; ` +
	`if [ -d /sys/firmware/efi ]; then echo fw=efi; else echo fw=bios; fi; ` +
	`echo "mokutil=$(mokutil --sb-state 2>&1 | head -n1)"; ` +
	`v=/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c; ` +
	`if [ -e $v ]; then echo "sbvar=$(od -An -tu1 $v | awk '{print $NF}')"; else echo sbvar=none; fi; ` +
	`echo "datasource=$(grep -o 'DataSource[A-Za-z]*' /run/cloud-init/status.json | head -n1)"`

// fallbackDataSource is what cloud-init prints on the console when it found no data source: the
// guest will never let the user in, so waiting longer is pointless.
const fallbackDataSource = "Used fallback datasource"

// guest is one cloud VM of the test as a user drives it.
type guest struct {
	ns, name string
	key      ssh.Signer
	vmi      *v1alpha1.VirtualMachineInstance
	con      *userConsole
	hostKey  ssh.PublicKey
}

// startGuest creates vm and waits until its guest lets the user in over SSH at the launcher pod's
// address, port 22 (the masquerade binding); the console records the boot.
func startGuest(t *testing.T, vm *v1alpha1.VirtualMachine, key ssh.Signer) *guest {
	t.Helper()
	g := &guest{ns: vm.Namespace, name: vm.Name, key: key}
	created := time.Now()
	apply(t, vm)
	// An idle guest still costs CPU under emulation: the others boot faster without it.
	t.Cleanup(func() { _, _ = ec.RunErr(nil, kubectl, "delete", "vm", g.name, "-n", g.ns, "--wait=false") })
	g.waitUp(t, "", created)
	return g
}

// waitUp waits for a running instance other than the one with UID not, opens its console and
// waits until SSH lets the user in.
func (g *guest) waitUp(t *testing.T, not string, since time.Time) {
	t.Helper()
	g.vmi = waitVMI(t, g.ns, g.name, bootTimeout, "created", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && string(v.UID) != not && v.DeletionTimestamp == nil
	})
	g.con = openConsole(t, g.ns, g.name)
	g.vmi = waitVMI(t, g.ns, g.name, bootTimeout, "Running with its pod address", running(""), g.con.tail)
	if ip := podIP(t, g.vmi); g.vmi.Status.Interfaces[0].IP != ip {
		t.Errorf("VMI %s reports address %s, its launcher pod has %s", g.name, g.vmi.Status.Interfaces[0].IP, ip)
	}
	var lastErr error
	testutil.Eventually(t, bootTimeout-time.Since(since), fmt.Sprintf("SSH login as %s to VM %s at %s:22", guestUser, g.name, g.addr()), func() bool {
		if strings.Contains(g.con.text(), fallbackDataSource) {
			t.Fatalf("VM %s: cloud-init found no data source (its disk is not visible to the guest?):\n%s", g.name, g.con.tail())
		}
		_, hk, err := sshRun(g.addr(), guestUser, g.key, "true")
		lastErr, g.hostKey = err, hk
		if err != nil {
			time.Sleep(2 * time.Second)
		}
		return err == nil
	}, func() string { return fmt.Sprintf("last SSH error: %v\n%s", lastErr, g.con.tail()) })
	t.Logf("VM %s: SSH login %s after it was created or restarted", g.name, time.Since(since).Round(time.Second))
}

func (g *guest) addr() string { return g.vmi.Status.Interfaces[0].IP }

// ssh runs cmd in the guest over SSH and returns its output.
func (g *guest) ssh(t *testing.T, cmd string) string {
	t.Helper()
	out, _, err := sshRun(g.addr(), guestUser, g.key, cmd)
	if err != nil {
		t.Fatalf("VM %s: %v\n%s", g.name, err, g.con.tail())
	}
	return out
}

// report is bootReport's answer as key=value pairs.
func (g *guest) report(t *testing.T) map[string]string {
	t.Helper()
	out := g.ssh(t, bootReport)
	r := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		r[k] = v
	}
	return r
}

// checkReport compares the guest's report with want (the keys want names).
func (g *guest) checkReport(t *testing.T, want map[string]string) {
	t.Helper()
	got := g.report(t)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("VM %s reports %s=%q, want %q (whole report %v)", g.name, k, got[k], v, got)
		}
	}
}

// restart restarts the VM with qvirtctl and waits until its new instance lets the user in.
func (g *guest) restart(t *testing.T) {
	t.Helper()
	old := g.vmi.UID
	g.con.close()
	started := time.Now()
	qvirtctl(t, "restart", g.name, "-n", g.ns)
	g.waitUp(t, string(old), started)
}

// consoleLogin logs in on the serial console through qvirtctl console with the password and
// runs a command there, checking its answer: the guest's host name.
func (g *guest) consoleLogin(t *testing.T, hostname string) {
	t.Helper()
	from := len(g.con.text())
	g.con.typeLine(t, "") // a fresh login prompt
	from = g.con.expect(t, from, hostname+" login:", 2*time.Minute)
	g.con.typeLine(t, guestUser)
	from = g.con.expect(t, from, "Password:", time.Minute)
	g.con.typeLine(t, guestPassword)
	from = g.con.expect(t, from, guestUser+"@"+hostname, 2*time.Minute) // bash's prompt
	g.con.typeLine(t, `echo "on-console-$((6*7)) $(hostname) $(tty)"`)
	g.con.expect(t, from, "on-console-42 "+hostname+" /dev/ttyS0", time.Minute)
	g.con.typeLine(t, "exit")
}

// TestCloudGuests boots the cloud image the ways a KubeVirt user does and logs in to it:
//
//   - from a containerDisk with cloud-init NoCloud whose user data is a Secret, under BIOS: the
//     guest takes the host name and the user with the SSH key from the Secret; SSH through the
//     masquerade binding at the launcher pod's address and a password login on the serial console
//     through qvirtctl; a file written is gone after `qvirtctl restart` (the containerDisk is
//     ephemeral; the SSH host key is new too);
//   - from a filesystem-mode claim with cloud-init ConfigDrive under UEFI with secure boot, and
//     from a block-mode claim with NoCloud under UEFI without secure boot: the guest reports its
//     firmware and secure boot state, and a file written survives `qvirtctl restart` (so does the
//     host key). The image gets onto the claims the way a user does it without an importer: a
//     helper VM (the small test guest) with the image and the claims as disks copies it with dd.
//
// The three guests boot at the same time (testutil.CloudGuestsAtOnce): each boot is mostly the guest waiting
// on emulated devices and timers, so they share two cores well.
func TestCloudGuests(t *testing.T) {
	ns := namespace(t)
	key, authorized := userKey(t)
	t.Run("containerDisk-NoCloud-secret-BIOS", func(t *testing.T) {
		t.Parallel()
		containerDiskGuest(t, ns, key, authorized)
	})
	t.Run("claims", func(t *testing.T) {
		t.Parallel()
		claimGuests(t, ns, key, authorized)
	})
}

func containerDiskGuest(t *testing.T, ns string, key ssh.Signer, authorized string) {
	const name, secret, hostname = "nocloud", "nocloud-userdata", "from-the-secret"
	vm := sample(t, "vm-cloud.yaml", ns, name)
	volume(t, vm, "rootdisk").ContainerDisk.Image = cloudImage
	volume(t, vm, "cloudinitdisk").CloudInitNoCloud = &v1alpha1.CloudInitNoCloudSource{
		UserDataSecretRef: &corev1.LocalObjectReference{Name: secret}}
	apply(t, &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secret},
		StringData: map[string]string{"userdata": userData(hostname, authorized)}})
	g := startGuest(t, vm, key)

	g.checkReport(t, map[string]string{"host": hostname, "fw": "bios", "mokutil": "EFI variables are not supported on this system",
		"sbvar": "none", "datasource": "DataSourceNoCloud"})
	g.consoleLogin(t, hostname)
	g.ssh(t, "echo written-before-the-restart > ~/marker && sync")
	before := g.hostKey

	g.restart(t)
	if out := g.ssh(t, "cat ~/marker 2>/dev/null || echo no-marker"); strings.TrimSpace(out) != "no-marker" {
		t.Errorf("after a restart the containerDisk guest still has the file it wrote: %q", out)
	}
	if ssh.FingerprintSHA256(g.hostKey) == ssh.FingerprintSHA256(before) {
		t.Errorf("the SSH host key %s survived the restart of an ephemeral containerDisk", ssh.FingerprintSHA256(before))
	}
	g.checkReport(t, map[string]string{"host": hostname, "fw": "bios"})
}

// Claim sizes: the filesystem claim holds disk.img at the capacity less 5.5%, which must hold
// the image's 2 GiB; the block claim is the image's size.
const (
	imageBytes = 2 << 30
	fsClaim    = "3Gi"
	blockClaim = "2Gi"
)

func claimGuests(t *testing.T, ns string, key ssh.Signer, authorized string) {
	block := corev1.PersistentVolumeBlock
	claim := func(name, size string, mode *corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				VolumeMode: mode,
				Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
	}
	apply(t, claim("cloud-fs", fsClaim, nil), claim("cloud-block", blockClaim, &block))
	importImage(t, ns, map[string]string{"fs": "cloud-fs", "block": "cloud-block"})

	t.Run("filesystem-claim-ConfigDrive-UEFI-secureboot", func(t *testing.T) {
		t.Parallel()
		const name = "fs-configdrive-sb"
		vm := claimVM(t, ns, name, "cloud-fs")
		volume(t, vm, "cloudinitdisk").VolumeSource = v1alpha1.VolumeSource{CloudInitConfigDrive: &v1alpha1.CloudInitConfigDriveSource{
			UserData: userData(name, authorized)}}
		// SCSI: Debian's cloud kernel has no AHCI driver, so a sata cdrom (q35's AHCI) is invisible
		// to this guest; virtio-scsi and sr_mod it has.
		disk(t, vm, "cloudinitdisk").Disk, disk(t, vm, "cloudinitdisk").CDRom = nil, &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSCSI}
		spec := &vm.Spec.Template.Spec
		spec.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{}}
		spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(true)}}}
		g := startGuest(t, vm, key)
		g.checkReport(t, map[string]string{"host": name, "fw": "efi", "mokutil": "SecureBoot enabled", "sbvar": "1",
			"datasource": "DataSourceConfigDrive"})
		persists(t, g)
	})
	t.Run("block-claim-NoCloud-UEFI", func(t *testing.T) {
		t.Parallel()
		const name = "block-nocloud-efi"
		vm := claimVM(t, ns, name, "cloud-block")
		volume(t, vm, "cloudinitdisk").CloudInitNoCloud.UserData = userData(name, authorized)
		vm.Spec.Template.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false)}}}
		g := startGuest(t, vm, key)
		g.checkReport(t, map[string]string{"host": name, "fw": "efi", "mokutil": "SecureBoot disabled", "sbvar": "0",
			"datasource": "DataSourceNoCloud"})
		persists(t, g)
	})
}

// claimVM is the cloud sample booting from the claim instead of the containerDisk.
func claimVM(t *testing.T, ns, name, claim string) *v1alpha1.VirtualMachine {
	vm := sample(t, "vm-cloud.yaml", ns, name)
	volume(t, vm, "rootdisk").VolumeSource = v1alpha1.VolumeSource{
		PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}
	// The guest's clean power-off writes its journal and unmounts; give it time under emulation.
	vm.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](180)
	return vm
}

// persists writes a file in a guest on a claim, restarts the VM and finds the file again, under
// the same SSH host key: the claim kept the disk.
func persists(t *testing.T, g *guest) {
	t.Helper()
	g.ssh(t, "echo written-before-the-restart > ~/marker && sync")
	before := g.hostKey
	g.restart(t)
	if out := g.ssh(t, "cat ~/marker 2>/dev/null || echo no-marker"); strings.TrimSpace(out) != "written-before-the-restart" {
		t.Errorf("after a restart the guest on a claim has lost the file it wrote: %q", out)
	}
	if ssh.FingerprintSHA256(g.hostKey) != ssh.FingerprintSHA256(before) {
		t.Errorf("the SSH host key changed across the restart (%s, now %s): the claim did not keep the disk",
			ssh.FingerprintSHA256(before), ssh.FingerprintSHA256(g.hostKey))
	}
}

// importImage puts the cloud image on claims (serial → claim name) the way a user can without a
// CDI importer: a helper VM, the small test guest, gets the containerDisk read-only and the claims
// as disks, and on its console (qvirtctl console) dd copies the image onto each. The helper is
// deleted afterwards so the claims are free for the guests.
func importImage(t *testing.T, ns string, claims map[string]string) {
	t.Helper()
	const name = "importer"
	started := time.Now()
	vm := sample(t, "vm-demo.yaml", ns, name)
	spec := &vm.Spec.Template.Spec
	spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks,
		v1alpha1.Disk{Name: "image", Serial: "image", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio, ReadOnly: true}})
	spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: "image", VolumeSource: v1alpha1.VolumeSource{
		ContainerDisk: &v1alpha1.ContainerDiskSource{Image: cloudImage}}})
	var copies []string
	for serial, claim := range claims {
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks,
			v1alpha1.Disk{Name: serial, Serial: serial, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
		spec.Volumes = append(spec.Volumes, v1alpha1.Volume{Name: serial, VolumeSource: v1alpha1.VolumeSource{
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
		copies = append(copies, fmt.Sprintf("dd if=$(dev image) of=$(dev %s) bs=1M conv=fsync 2>&1 | tail -n1", serial))
	}
	apply(t, vm)
	vmi := waitVMI(t, ns, name, 5*time.Minute, "created", func(v *v1alpha1.VirtualMachineInstance) bool { return v != nil })
	con := openConsole(t, ns, name)
	con.expect(t, 0, "QVIRT-GUEST-READY", 5*time.Minute)
	// dev SERIAL is the guest's virtio disk with that serial number.
	from := len(con.text())
	con.typeLine(t, `dev() { for d in /sys/block/vd*; do [ "$(cat $d/serial)" = "$1" ] && echo /dev/${d##*/}; done; }`)
	con.typeLine(t, strings.Join(copies, " && ")+` && echo "imported-$((1+1))"`)
	end := con.expect(t, from, "imported-2", 10*time.Minute)
	// Each dd reports what it copied: the whole image, in MiB records.
	records := fmt.Sprintf("%d+0 records out", imageBytes>>20)
	if n := strings.Count(con.text()[from:end], records); n != len(claims) {
		t.Fatalf("dd reported %q %d times, want %d (once per claim):\n%s", records, n, len(claims), con.tail())
	}
	con.close()
	run(t, nil, kubectl, "delete", "vm", name, "-n", ns, "--wait=true")
	waitVMI(t, ns, name, 3*time.Minute, "gone", gone)
	// The claims are free once the helper's launcher pod is gone (its QEMU closed them).
	testutil.Eventually(t, 3*time.Minute, "the helper VM's launcher pod gone", func() bool {
		var pods corev1.PodList
		err := cl.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.VMIUIDLabel: string(vmi.UID)})
		return err == nil && len(pods.Items) == 0
	})
	t.Logf("image copied onto %d claims by the helper VM in %s", len(claims), time.Since(started).Round(time.Second))
}
