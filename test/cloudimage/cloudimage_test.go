// Package cloudimage checks the cloud image test/guest/cloud/build.sh makes: it boots under
// SeaBIOS, OVMF and OVMF with secure boot, with bare QEMU under TCG, and does what the image
// promises (cloud-init from a NoCloud volume, the guest agent, SSH with host keys made at first
// boot); and it is pushed to a registry as a KubeVirt-layout containerDisk.
package cloudimage

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/test/testutil"
)

var cloudDir string

// Debian's ovmf package.
const ovmfDir = "/usr/share/OVMF"

func TestMain(m *testing.M) {
	flag.Parse()
	testutil.CloudGuestsAtOnce()
	dir, err := testutil.CloudImageDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, f := range []string{"OVMF_CODE_4M.fd", "OVMF_VARS_4M.fd", "OVMF_CODE_4M.secboot.fd", "OVMF_VARS_4M.ms.fd"} {
		if _, err := os.Stat(filepath.Join(ovmfDir, f)); err != nil {
			fmt.Fprintf(os.Stderr, "%v: install Debian's ovmf package (make deps)\n", err)
			os.Exit(1)
		}
	}
	cloudDir = dir
	os.Exit(m.Run())
}

// firmware is one way to boot the image and what the guest then says about it.
type firmware struct {
	name string
	// args are the QEMU arguments selecting the machine and firmware; vars is a per-boot copy
	// of the firmware's variable store template, when it has one.
	args func(vars string) []string
	vars string
	// kernel are lines of the kernel's log under this firmware: on the console as the kernel
	// prints them, and again from dmesg at the end of the boot (QVIRT-DMESG lines), since under
	// load the serial console has missed an early line now and then.
	kernel []string
	// bootMode is what the guest's userspace reports: /sys/firmware/efi present, and mokutil's
	// answer (EFI variables do not exist under BIOS).
	bootMode string
}

var firmwares = []firmware{{
	name:     "bios",
	args:     func(string) []string { return []string{"-machine", "q35,accel=tcg"} }, // SeaBIOS, QEMU's default
	kernel:   []string{"DMI: QEMU Standard PC (Q35 + ICH9, 2009), BIOS 1."},
	bootMode: "mode=bios EFI_variables_are_not_supported_on_this_system",
}, {
	name: "uefi",
	args: func(vars string) []string {
		return []string{"-machine", "q35,accel=tcg",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + filepath.Join(ovmfDir, "OVMF_CODE_4M.fd"),
			"-drive", "if=pflash,format=raw,unit=1,file=" + vars}
	},
	vars:     "OVMF_VARS_4M.fd",
	kernel:   []string{"efi: EFI v2", "secureboot: Secure boot disabled"},
	bootMode: "mode=efi SecureBoot_disabled",
}, {
	// Secure boot: OVMF's SMM build, with Microsoft's keys enrolled and secure boot on in the
	// variables template; shim (signed by Microsoft) checks Debian's GRUB, which checks Debian's
	// kernel, which then locks itself down.
	name: "uefi-secureboot",
	args: func(vars string) []string {
		return []string{"-machine", "q35,smm=on,accel=tcg",
			"-global", "driver=cfi.pflash01,property=secure,value=on",
			"-global", "ICH9-LPC.disable_s3=1",
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file=" + filepath.Join(ovmfDir, "OVMF_CODE_4M.secboot.fd"),
			"-drive", "if=pflash,format=raw,unit=1,file=" + vars}
	},
	vars:     "OVMF_VARS_4M.ms.fd",
	kernel:   []string{"efi: EFI v2", "secureboot: Secure boot enabled", "Kernel is locked down from EFI Secure Boot"},
	bootMode: "mode=efi SecureBoot_enabled",
}}

// Under TCG on two shared cores a systemd boot with cloud-init takes one to five minutes.
const bootTimeout = 10 * time.Minute

// One boot per firmware, all at once (testutil.CloudGuestsAtOnce). Each
// shows the firmware's kernel messages, the boot mode as the guest's userspace sees it, the
// hostname cloud-init took from the NoCloud volume, a login prompt on the serial console, the
// guest agent answering and sshd greeting; across boots the SSH host keys differ, so they are
// made at first boot, not shipped in the image.
func TestCloudImageBootsUnderBIOSAndUEFI(t *testing.T) {
	hostKeys := map[string]string{}
	var mu sync.Mutex
	t.Run("boot", func(t *testing.T) {
		for _, fw := range firmwares {
			t.Run(fw.name, func(t *testing.T) {
				t.Parallel()
				key := bootAndCheck(t, fw)
				mu.Lock()
				defer mu.Unlock()
				hostKeys[fw.name] = key
			})
		}
	})
	seen := map[string]string{}
	for fw, key := range hostKeys {
		if other, ok := seen[key]; ok {
			t.Errorf("the %s and %s boots have the same ED25519 host key %s: the image ships host keys", other, fw, key)
		}
		seen[key] = fw
	}
}

var hostKeyRE = regexp.MustCompile(`SHA256:(\S+) root@\S+ \(ED25519\)`)

// bootAndCheck boots the image under fw and returns the fingerprint of the ED25519 host key the
// guest made.
func bootAndCheck(t *testing.T, fw firmware) string {
	dir := t.TempDir()
	hostname := "qvirt-" + fw.name
	disk := filepath.Join(dir, "disk.qcow2")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-b", filepath.Join(cloudDir, "disk.qcow2"), "-F", "qcow2", disk)
	seed := noCloudSeed(t, dir, hostname)
	vars := ""
	if fw.vars != "" {
		vars = filepath.Join(dir, "vars.fd")
		copyFile(t, filepath.Join(ovmfDir, fw.vars), vars)
	}
	serial, qga := filepath.Join(dir, "serial.sock"), filepath.Join(dir, "qga.sock")
	sshPort := testutil.FreePort(t)

	args := append(fw.args(vars),
		"-m", "1024", "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none",
		// wait=on: QEMU starts the guest once the test reads the console, so nothing is lost.
		"-chardev", "socket,id=ser0,path="+serial+",server=on,wait=on", "-serial", "chardev:ser0",
		"-drive", "file="+disk+",format=qcow2,if=virtio",
		"-drive", "file="+seed+",format=raw,if=virtio,readonly=on",
		"-netdev", fmt.Sprintf("user,id=n0,hostfwd=tcp:127.0.0.1:%d-:22", sshPort),
		"-device", "virtio-net-pci,netdev=n0",
		"-chardev", "socket,id=qga0,path="+qga+",server=on,wait=off",
		"-device", "virtio-serial-pci",
		"-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0")
	var qemuOut testutil.SyncBuffer
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = &qemuOut, &qemuOut
	if err := cmd.Start(); err != nil {
		t.Fatalf("start QEMU: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("QEMU output: %s", qemuOut.String())
		}
	})
	start := time.Now()
	console := testutil.AttachConsole(t, serial)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("serial console, last 3000 bytes:\n%s", testutil.Tail(strings.ReplaceAll(console.Text(), "\r", ""), 3000))
		}
	})

	for _, line := range fw.kernel {
		console.Expect(t, 0, line, bootTimeout)
	}
	if fw.name == "bios" && strings.Contains(console.Text(), "efi: EFI v") {
		t.Error("the kernel found UEFI under SeaBIOS")
	}
	console.Expect(t, 0, "Debian GNU/Linux 12 (bookworm)", bootTimeout) // systemd's welcome
	console.Expect(t, 0, hostname+" login:", bootTimeout)
	t.Logf("%s: login prompt %s after QEMU started", fw.name, time.Since(start).Round(time.Second))
	console.Expect(t, 0, "QVIRT-BOOT "+fw.bootMode+"\r\n", bootTimeout)
	console.Expect(t, 0, "Datasource DataSourceNoCloud [seed=/dev/vdb]", bootTimeout)
	t.Logf("%s: cloud-init finished %s after QEMU started", fw.name, time.Since(start).Round(time.Second))

	var osInfo map[string]any
	testutil.Eventually(t, 2*time.Minute, "the guest agent's guest-get-osinfo", func() bool {
		var err error
		osInfo, err = guestOSInfo(qga)
		return err == nil
	})
	if osInfo["id"] != "debian" || osInfo["version-id"] != "12" || !strings.HasSuffix(fmt.Sprint(osInfo["kernel-release"]), "-cloud-amd64") {
		t.Errorf("guest agent reports %v, want Debian 12 with the cloud kernel", osInfo)
	}
	var banner string
	testutil.Eventually(t, 2*time.Minute, "sshd's greeting through the forwarded port", func() bool {
		banner = sshBanner(sshPort)
		return strings.HasPrefix(banner, "SSH-2.0-OpenSSH_")
	}, func() string { return fmt.Sprintf("last greeting %q", banner) })

	m := hostKeyRE.FindStringSubmatch(console.Text())
	if m == nil {
		t.Fatal("cloud-init printed no ED25519 host key fingerprint")
	}
	return m[1]
}

// noCloudSeed writes a NoCloud volume (a FAT file system labelled CIDATA, which cloud-init
// accepts as well as an ISO) whose meta-data names the host and whose user data prints the
// kernel's firmware lines (from dmesg) and the boot mode on the console.
func noCloudSeed(t *testing.T, dir, hostname string) string {
	t.Helper()
	files := map[string]string{
		"meta-data": "instance-id: iid-" + hostname + "\nlocal-hostname: " + hostname + "\n",
		"user-data": `#cloud-config
runcmd:
  - [sh, -c, 'dmesg | grep -E "DMI: |efi: EFI v|secureboot: |locked down" | sed "s/^/QVIRT-DMESG /" >/dev/console']
  - [sh, -c, 'if [ -d /sys/firmware/efi ]; then m=efi; else m=bios; fi; echo "QVIRT-BOOT mode=$m $(mokutil --sb-state 2>&1 | head -n1 | tr " " _)" >/dev/console']
`,
	}
	seed := filepath.Join(dir, "seed.img")
	run(t, "mkfs.fat", "-C", "-n", "CIDATA", seed, "1024")
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, "mcopy", "-i", seed, path, "::"+name)
	}
	return seed
}

// guestOSInfo asks the guest agent on the chardev socket at path for guest-get-osinfo. A
// guest-sync first discards whatever an earlier, abandoned exchange left in the channel.
func guestOSInfo(path string) (map[string]any, error) {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	id := time.Now().UnixNano() % 1e9
	if _, err := fmt.Fprintf(conn, `{"execute":"guest-sync","arguments":{"id":%d}}`+"\n", id); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(conn)
	for {
		var r struct{ Return any }
		if err := dec.Decode(&r); err != nil {
			return nil, err
		}
		if n, ok := r.Return.(float64); ok && int64(n) == id {
			break
		}
	}
	if _, err := fmt.Fprintln(conn, `{"execute":"guest-get-osinfo"}`); err != nil {
		return nil, err
	}
	var r struct {
		Return map[string]any
		Error  any
	}
	if err := dec.Decode(&r); err != nil {
		return nil, err
	}
	if r.Return == nil {
		return nil, fmt.Errorf("guest-get-osinfo: %v", r.Error)
	}
	return r.Return, nil
}

// sshBanner is the first line a server sends on 127.0.0.1:port, or "" (QEMU's port forward
// accepts and closes connections while nothing listens in the guest).
func sshBanner(port int) string {
	conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line)
}

// The cloud image pushed as a containerDisk is the qcow2 at /disk/disk.qcow2, byte for byte.
func TestCloudImagePushedAsContainerDisk(t *testing.T) {
	srv, err := registry.Listen(registry.Options{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	ref, err := registry.PushCloudDisk(ctx, srv.Addr(), cloudDir)
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.Addr() + "/qvirt/cloud-debian:latest"; ref != want {
		t.Errorf("pushed to %q, want %q", ref, want)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, tr); err != nil {
			t.Fatal(err)
		}
		got["/"+hdr.Name] = fmt.Sprintf("%x", h.Sum(nil))
	}
	want := fileSHA256(t, filepath.Join(cloudDir, "disk.qcow2"))
	if got["/disk/disk.qcow2"] != want || len(got) != 2 {
		t.Errorf("image holds %v, want /disk/ and /disk/disk.qcow2 with sha256 %s", got, want)
	}
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
