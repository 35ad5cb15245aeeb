package launcher_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests boot the test guest and small disks through both firmwares with the real QEMU and
// OVMF (Debian's ovmf package), and read what the guest and the firmware print on the serial
// console.

// efiVMI is the test guest booted through OVMF, which loads the kernel through fw_cfg as SeaBIOS
// does. Secure Boot comes with SMM, as the API requires.
func efiVMI(t *testing.T, secureBoot bool) *v1alpha1.VirtualMachineInstance {
	vmi := guestVMI(t)
	vmi.Spec.Domain.Firmware.Bootloader = &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr(secureBoot)}}
	if secureBoot {
		vmi.Spec.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{}}
	}
	return vmi
}

// bootVMI starts vmi in a new launcher and waits for the test guest's shell.
func bootVMI(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) (*vm, *console) {
	t.Helper()
	return bootRequest(t, testutil.SyncRequest(t, vmi, nil))
}

// bootRequest starts req's machine in a new launcher and waits for the test guest's shell.
func bootRequest(t *testing.T, req *protocol.SyncRequest) (*vm, *console) {
	t.Helper()
	v := newLauncher(t)
	if st, err := v.client.Sync(context.Background(), req); err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	return v, c
}

// Shell lines whose answers cannot be matched in their own echo: the marker's parts are split by
// an empty "" that the shell drops.
const (
	// bootModeCmd prints FW-EFI when the guest booted through UEFI, else FW-BIOS.
	bootModeCmd = `echo "FW-$([ -d /sys/firmware/efi ] && echo E""FI || echo BI""OS)"`
	// testVar is an EFI variable of the tests' GUID (testutil.WriteEFIVar).
	testVar     = "QvirtTest"
	testVarData = "QVIRT-NVRAM-OK"
	// secureBootStateCmd prints SB-<SecureBoot>-SM-<SetupMode>, the two variables' values:
	// SB-1-SM-0 is Secure Boot enforced with its keys enrolled.
	secureBootStateCmd = `echo "SB-$(tail -c 1 ` + "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c" +
		` | od -An -tu1 | tr -d ' ')-SM-$(tail -c 1 ` + "/sys/firmware/efi/efivars/SetupMode-8be4df61-93ca-11d2-aa0d-00e098032b8c" +
		` | od -An -tu1 | tr -d ' ')"`
)

// fileSum is the SHA-256 of a file's content.
func contains(t *testing.T, path, want string) bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Contains(data, []byte(want))
}

// TestEFIGuest boots the test guest through OVMF: the guest sees EFI, a variable it writes is in
// the instance's own variable store (a copy of the template, which stays untouched), survives a
// guest reboot, and goes with the guest on a live migration.
func TestEFIGuest(t *testing.T) {
	t.Parallel()
	_, tmplName := launcher.OVMFFiles(false)
	tmpl := filepath.Join(launcher.DefaultOVMFDir, tmplName)
	tmplSum := fileSum(t, tmpl)
	src, c := bootVMI(t, efiVMI(t, false))
	ctx := context.Background()
	vars := filepath.Join(src.runDir, launcher.EFIVarsFile)

	t.Run("the guest sees EFI", func(t *testing.T) {
		c.Run(t, bootModeCmd, "FW-EFI", time.Minute)
		testutil.MountEFIVars(t, c)
	})

	t.Run("a variable the guest writes is in the instance's variable store", func(t *testing.T) {
		if fileSum(t, vars) == tmplSum {
			t.Fatal("the variable store is still the template: OVMF wrote nothing to it")
		}
		// Attributes (non-volatile, boot service and runtime access) and the data, in one write.
		testutil.WriteEFIVar(t, c, testVar, testVarData)
		if !contains(t, vars, testVarData) {
			t.Fatalf("%s does not hold the variable the guest wrote", vars)
		}
		if fileSum(t, tmpl) != tmplSum {
			t.Fatalf("the template %s was written", tmpl)
		}
	})

	t.Run("the variables survive a guest reboot", func(t *testing.T) {
		from := len(c.Text())
		c.Send(t, "reboot -f")
		c.Expect(t, from, "QVIRT-GUEST-READY", bootTimeout)
		c.Run(t, bootModeCmd, "FW-EFI", time.Minute)
		testutil.MountEFIVars(t, c)
		testutil.ExpectEFIVar(t, c, testVar, testVarData)
		if st, err := src.client.Status(ctx); err != nil || st.Phase != protocol.PhaseRunning {
			t.Fatalf("after the guest's reboot: %v, phase %s; want the same QEMU running", err, st.Phase)
		}
	})

	t.Run("the variables go with the guest on a live migration", func(t *testing.T) {
		srcStatus, err := src.client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		dst := newLauncher(t)
		req := testutil.SyncRequest(t, efiVMI(t, false), nil)
		req.Machine.UID, req.Incoming = srcStatus.UID, true
		if st, err := dst.client.Sync(ctx, req); err != nil || st.Phase != protocol.PhaseIncoming {
			t.Fatalf("sync target: %v (phase %s)", err, st.Phase)
		}
		dstVars := filepath.Join(dst.runDir, launcher.EFIVarsFile)
		if dstVars == vars || fileSum(t, dstVars) != tmplSum {
			t.Fatalf("the target's variable store %s is not its own fresh copy of the template", dstVars)
		}
		dc := attach(t, dst.runDir)
		migrate(t, src, dst, c)
		waitFor(t, 2*time.Minute, "the source to exit as migrated", func() bool {
			st, err := src.client.Status(ctx)
			return err == nil && st.Exit != nil
		})
		if st, _ := src.client.Status(ctx); st.Exit.Reason != protocol.ExitMigrated {
			t.Fatalf("source ended %+v, want migrated", st.Exit)
		}
		waitFor(t, 30*time.Second, "the target to run", func() bool {
			st, err := dst.client.Status(ctx)
			return err == nil && st.Phase == protocol.PhaseRunning && st.RunState == "running"
		})
		testutil.ExpectEFIVar(t, dc, testVar, testVarData)
		// QEMU writes the flash it received to the target's store once the guest runs there.
		waitFor(t, 30*time.Second, "the target's variable store to hold the guest's variable", func() bool {
			return contains(t, dstVars, testVarData)
		})
		if strings.Contains(dc.Text(), "QVIRT-GUEST-READY") {
			t.Fatalf("the guest rebooted on the target:\n%s", dc.Text())
		}
		if fileSum(t, tmpl) != tmplSum {
			t.Fatalf("the template %s was written", tmpl)
		}
	})
}

// TestSecureBoot starts OVMF's Secure Boot build with SMM. The test guest's kernel, loaded through
// fw_cfg, runs (OVMF falls back to its legacy loader for a kernel that fails verification) and
// sees Secure Boot on with Microsoft's keys enrolled; a bootloader on a disk that Microsoft's keys
// do not sign (the same Debian kernel, which Debian's own key signs) is refused, while OVMF
// without Secure Boot starts it.
func TestSecureBoot(t *testing.T) {
	t.Parallel()
	t.Run("the guest sees Secure Boot on", func(t *testing.T) {
		_, c := bootVMI(t, efiVMI(t, true))
		c.Run(t, bootModeCmd, "FW-EFI", time.Minute)
		testutil.MountEFIVars(t, c)
		c.Run(t, secureBootStateCmd, "SB-1-SM-0", time.Minute)
	})

	esp := espImage(t, filepath.Join(guestDir, "vmlinuz"))
	const espPath = `PciRoot\(0x0\)/Pci\(0x2,0x0\)/Pci\(0x0,0x0\)` // the one virtio disk's (launcher/argv.go)
	for _, tc := range []struct {
		secureBoot bool
		want       *regexp.Regexp
	}{
		{true, regexp.MustCompile(`BdsDxe: failed to load Boot0001 "[^"]*" from ` + espPath + `: Access Denied`)},
		{false, regexp.MustCompile(`BdsDxe: starting Boot0001 "[^"]*" from ` + espPath)},
	} {
		name := "secure boot refuses a bootloader Microsoft's keys do not sign"
		if !tc.secureBoot {
			name = "without secure boot OVMF starts it"
		}
		t.Run(name, func(t *testing.T) {
			vmi := espVMI(t, esp)
			vmi.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr(tc.secureBoot)}}}
			if tc.secureBoot {
				vmi.Spec.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{}}
			}
			c := startVMI(t, vmi)
			testutil.Eventually(t, bootTimeout, fmt.Sprintf("%q on the console", tc.want), func() bool { return tc.want.MatchString(c.Text()) },
				func() string { return "console ends with " + strconv.Quote(testutil.Tail(c.Text(), 600)) })
		})
	}
}

// espVMI boots the ESP disk image esp.
func espVMI(t *testing.T, esp string) *v1alpha1.VirtualMachineInstance {
	return diskVMI(t, []v1alpha1.Disk{{Name: "esp", BootOrder: ptr[uint32](1)}}, map[string]string{"esp": esp})
}

// TestSecureBootStartsSignedBootloader: OVMF verifies signatures rather than refusing everything.
// Microsoft's keys sign no test bootloader, so this test gives the launcher an OVMF directory
// whose Secure Boot variables template enrols Debian's test key instead ("snakeoil", whose private
// key Debian's ovmf package ships, password "snakeoil"), and boots the test guest's kernel signed
// with it (sbsigntool) as the disk's bootloader: OVMF starts it and its EFI stub reports Secure
// Boot on. The unsigned one is refused in TestSecureBoot.
func TestSecureBootStartsSignedBootloader(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	code, tmpl := launcher.OVMFFiles(true)
	for link, target := range map[string]string{code: code, tmpl: "OVMF_VARS_4M.snakeoil.fd"} {
		if err := os.Symlink(filepath.Join(launcher.DefaultOVMFDir, target), filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
	key, cert := filepath.Join(dir, "snakeoil.key"), "/usr/share/ovmf/PkKek-1-snakeoil.pem"
	signed := filepath.Join(dir, "bootx64.efi")
	for _, args := range [][]string{
		{"openssl", "rsa", "-in", "/usr/share/ovmf/PkKek-1-snakeoil.key", "-passin", "pass:snakeoil", "-out", key},
		{"sbsign", "--key", key, "--cert", cert, "--output", signed, filepath.Join(guestDir, "vmlinuz")},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%q: %v: %s (install ovmf, openssl and sbsigntool)", args, err, out)
		}
	}
	vmi := espVMI(t, espImage(t, signed))
	vmi.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
	vmi.Spec.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{}}
	c := startVMIWith(t, launcher.HostResolver{SpareRootPorts: 2, OVMFDir: dir}, vmi)
	c.Expect(t, `BdsDxe: starting Boot0001 `, bootTimeout)
	c.Expect(t, `EFI stub: UEFI Secure Boot is enabled.`, time.Minute)
}

// TestBootOrderUnderBothFirmwares: three bootable disks, a sata one without bootOrder and two
// virtio ones with bootOrder 2 and 1. SeaBIOS boots the one with bootOrder 1 (left to itself it
// boots the sata disk: it probes AHCI first); OVMF, which cannot boot a BIOS boot sector, tries
// bootOrder 1, then 2, and never the disk without one.
func TestBootOrderUnderBothFirmwares(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	images := map[string]string{}
	for _, name := range []string{"unordered", "second", "first"} {
		images[name] = rawImage(t, dir, name+".img", bootSector("QVIRT-BOOTED-"+strings.ToUpper(name)))
	}
	disks := []v1alpha1.Disk{
		{Name: "unordered", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSATA}},
		{Name: "second", BootOrder: ptr[uint32](2)},
		{Name: "first", BootOrder: ptr[uint32](1)},
	}

	t.Run("BIOS", func(t *testing.T) {
		c := startVMI(t, diskVMI(t, disks, images))
		c.Expect(t, "QVIRT-BOOTED-", bootTimeout)
		time.Sleep(time.Second) // the rest of the line
		if text := c.Text(); !strings.Contains(text, "QVIRT-BOOTED-FIRST") || strings.Count(text, "QVIRT-BOOTED-") != 1 {
			t.Fatalf("want SeaBIOS to boot the disk of bootOrder 1 and nothing else, got:\n%s", text)
		}
	})

	t.Run("EFI", func(t *testing.T) {
		vmi := diskVMI(t, disks, images)
		vmi.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr(false)}}}
		c := startVMI(t, vmi)
		// None of the disks holds an EFI bootloader: OVMF goes through the boot order, then to
		// its shell. The PCI layout is fixed (launcher/argv.go): the virtio disks sit on the root
		// ports at 00:02.0 (second) and 00:02.1 (first), the sata disk on the AHCI controller.
		c.Expect(t, "UEFI Interactive Shell", bootTimeout)
		text := c.Text()
		var tried []string
		for _, line := range strings.Split(text, "\n") {
			if m := bdsTried.FindStringSubmatch(line); m != nil {
				tried = append(tried, m[1]+" "+m[2])
			}
		}
		want := []string{"Boot0001 PciRoot(0x0)/Pci(0x2,0x1)/Pci(0x0,0x0)", "Boot0002 PciRoot(0x0)/Pci(0x2,0x0)/Pci(0x0,0x0)"}
		if !slices.Equal(tried, want) {
			t.Errorf("OVMF tried %q, want the disk of bootOrder 1, then that of bootOrder 2, and not the sata disk without one:\n%s", tried, text)
		}
	})
}

// bdsTried matches OVMF's report of a boot option it could not boot: its number and device path.
var bdsTried = regexp.MustCompile(`BdsDxe: failed to load (Boot[0-9A-F]{4}) "[^"]*" from (\S+): Not Found`)

// TestMissingOVMFIsRefused: a node without the OVMF build an instance needs refuses it before QEMU
// starts, naming the machine's field (the node agent maps it to the VMI's) and the file.
func TestMissingOVMFIsRefused(t *testing.T) {
	empty := t.TempDir()
	for _, secureBoot := range []bool{false, true} {
		v := newLauncherWith(t, launcher.HostResolver{SpareRootPorts: 2, OVMFDir: empty})
		_, err := v.client.Sync(context.Background(), testutil.SyncRequest(t, efiVMI(t, secureBoot), nil))
		code, _ := launcher.OVMFFiles(secureBoot)
		field := "machine.firmware.efi"
		if secureBoot {
			field += ".secureBoot"
		}
		var apiErr *launcher.APIError
		if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != field || !strings.Contains(apiErr.Msg, filepath.Join(empty, code)) ||
			!strings.Contains(apiErr.Msg, "ovmf package") {
			t.Fatalf("secure boot %v: want a 400 at %s naming %s, got %v", secureBoot, field, filepath.Join(empty, code), err)
		}
		if _, err := os.Stat(filepath.Join(v.runDir, "qmp.sock")); err == nil {
			t.Fatal("QEMU was started for a refused machine")
		}
	}
}

// diskVMI is an instance without a kernel, booting its firmware from disks whose images are host
// files (by disk name).
func diskVMI(t *testing.T, disks []v1alpha1.Disk, images map[string]string) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	vmi := &v1alpha1.VirtualMachineInstance{}
	vmi.Name, vmi.Namespace, vmi.UID = "firmware", "default", "3d3c8f4e-7a5b-4c2d-9e1f-0a1b2c3d4e5f"
	vmi.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr(resource.MustParse("256Mi"))} // the kernel's EFI stub faults in 128 MiB
	vmi.Spec.Domain.Devices.AutoattachGraphicsDevice = ptr(false)
	vmi.Spec.Domain.Devices.Disks = disks
	for _, d := range disks {
		vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: d.Name, VolumeSource: v1alpha1.VolumeSource{
			HostDisk: &v1alpha1.HostDisk{Path: images[d.Name], Type: v1alpha1.HostDiskExists}}})
	}
	return vmi
}

// startVMI starts vmi in a new launcher with its serial console attached from the first byte the
// firmware writes: the console drops what is written while no one is attached, so the guest
// starts paused and runs once the console is there.
func startVMI(t *testing.T, vmi *v1alpha1.VirtualMachineInstance) *firmwareConsole {
	t.Helper()
	return startVMIWith(t, launcher.HostResolver{SpareRootPorts: 2}, vmi)
}

// startVMIWith is startVMI with a resolver of the test's choosing.
func startVMIWith(t *testing.T, res launcher.HostResolver, vmi *v1alpha1.VirtualMachineInstance) *firmwareConsole {
	t.Helper()
	v := newLauncherWith(t, res)
	vmi.Spec.StartStrategy = ptr(v1alpha1.StartStrategyPaused)
	ctx := context.Background()
	if _, err := v.client.Sync(ctx, testutil.SyncRequest(t, vmi, nil)); err != nil {
		t.Fatalf("sync: %v", err)
	}
	c := attach(t, v.runDir)
	if err := v.client.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	return &firmwareConsole{c}
}

// firmwareConsole reads a console on which the firmware draws: its lines are matched with the
// terminal's escape sequences (colours, cursor moves) taken out.
type firmwareConsole struct{ c *console }

var escapeSeq = regexp.MustCompile(`\x1b(\[[0-9;=?]*[A-Za-z]|c)`)

// Text is the console's text without escape sequences.
func (f *firmwareConsole) Text() string { return escapeSeq.ReplaceAllString(f.c.Text(), "") }

// Expect waits until the console shows want.
func (f *firmwareConsole) Expect(t *testing.T, want string, d time.Duration) {
	t.Helper()
	testutil.Eventually(t, d, fmt.Sprintf("%q on the console", want), func() bool { return strings.Contains(f.Text(), want) },
		func() string { return "console ends with " + strconv.Quote(testutil.Tail(f.Text(), 600)) })
}

// rawImage writes a 1 MiB raw disk image starting with head.
func rawImage(t *testing.T, dir, name string, head []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	img := make([]byte, 1<<20)
	copy(img, head)
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// bootSector is a BIOS boot sector (no partition table) that writes msg to the first serial port
// and halts.
func bootSector(msg string) []byte {
	code := []byte{
		0xfa,       // cli
		0x31, 0xc0, // xor ax, ax
		0x8e, 0xd8, // mov ds, ax
		0xfc,             // cld
		0xbe, 0x1a, 0x7c, // mov si, 0x7c1a: the message, after this code
		0xba, 0xf8, 0x03, // mov dx, 0x3f8: COM1's data port
		0xac,       // next: lodsb
		0x84, 0xc0, // test al, al
		0x74, 0x03, // jz done
		0xee,       // out dx, al
		0xeb, 0xf8, // jmp next
		0xf4,       // done: hlt
		0xeb, 0xfd, // jmp done
		0x90, 0x90, 0x90, // up to 0x1a
	}
	b := make([]byte, 512)
	copy(b, code)
	copy(b[0x1a:], "\r\n"+msg+"\r\n")
	b[510], b[511] = 0x55, 0xaa
	return b
}

// espImage is a 32 MiB FAT disk image (no partition table, which UEFI reads as one file system)
// holding efi as the removable-media bootloader \EFI\BOOT\BOOTX64.EFI, made with mtools.
func espImage(t *testing.T, efi string) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "esp.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 32<<20); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"mformat", "-i", img, "-T", "65536", "-h", "64", "-s", "32", "::"},
		{"mmd", "-i", img, "::/EFI", "::/EFI/BOOT"},
		{"mcopy", "-i", img, efi, "::/EFI/BOOT/BOOTX64.EFI"},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%q: %v: %s (install mtools)", args, err, out)
		}
	}
	return img
}
