package launcher_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/test/testutil"
)

// containerDiskImage writes an unpacked containerDisk image (KubeVirt's layout: one file under
// /disk/) whose disk starts with marker: raw, or qcow2 converted from it. It returns the image's
// directory and the disk file.
func containerDiskImage(t *testing.T, marker, format string) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "disk"), 0o755); err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(dir, "disk", "disk.img")
	if err := os.WriteFile(raw, append([]byte(marker), make([]byte, 4<<20-len(marker))...), 0o644); err != nil {
		t.Fatal(err)
	}
	if format == "raw" {
		return dir, raw
	}
	file = filepath.Join(dir, "disk", "disk.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", raw, file).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	if err := os.Remove(raw); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// A containerDisk is writable as in KubeVirt and ephemeral: the guest writes to it through a qcow2
// overlay in the launcher's own directory (over a raw image and over a qcow2 image), reads its
// writes back, and leaves the image files as they were; the overlay goes when QEMU does, and the
// next start of the same VM (with the same scratch directory) sees the image as pulled. A
// containerDisk the spec marks readonly stays read-only, without an overlay.
func TestContainerDiskWritesGoToAnEphemeralOverlay(t *testing.T) {
	t.Parallel()
	rawDir, rawFile := containerDiskImage(t, "QVIRT-ORIGINAL-1", "raw")
	qcowDir, qcowFile := containerDiskImage(t, "QVIRT-ORIGINAL-2", "qcow2")
	roDir, roFile := containerDiskImage(t, "QVIRT-ORIGINAL-3", "raw")
	sums := map[string][32]byte{}
	for _, f := range []string{rawFile, qcowFile, roFile} {
		sums[f] = fileSum(t, f)
	}

	vmi := guestVMI(t)
	disk := func(name, serial string, readOnly bool) v1alpha1.Disk {
		return v1alpha1.Disk{Name: name, Serial: serial, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio, ReadOnly: readOnly}}
	}
	containerDisk := func(name, dir string) v1alpha1.Volume {
		return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "file://" + dir}}}
	}
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{disk("cdraw", "CDRAW", false), disk("cdqcow", "CDQCOW", false), disk("cdro", "CDRO", true)}
	vmi.Spec.Volumes = []v1alpha1.Volume{containerDisk("cdraw", rawDir), containerDisk("cdqcow", qcowDir), containerDisk("cdro", roDir)}
	scratch := t.TempDir()
	overlays := []string{filepath.Join(scratch, "overlay-cdraw.qcow2"), filepath.Join(scratch, "overlay-cdqcow.qcow2")}

	// dev prints the device of a disk by its serial; read prints the start of each disk from the
	// disk itself (the page cache dropped) between markers the typed line does not contain.
	const setup = `dev() { for d in /sys/block/vd*; do [ "$(cat $d/serial)" = "$1" ] && echo /dev/${d##*/}; done; }; ` +
		`rd() { sync; echo 3 > /proc/sys/vm/drop_caches; for s in CDRAW CDQCOW CDRO; do echo "$s=$(head -c 16 $(dev $s))"; done; echo READ-$((40+2)); }`
	start := func(t *testing.T) (*vm, *console) {
		t.Helper()
		v := newLauncherWith(t, launcher.HostResolver{SpareRootPorts: 1, ScratchDir: scratch})
		if _, err := v.client.Sync(context.Background(), testutil.SyncRequest(t, vmi, nil)); err != nil {
			t.Fatalf("sync: %v", err)
		}
		c := attach(t, v.runDir)
		c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
		c.Send(t, setup)
		return v, c
	}
	read := func(t *testing.T, c *console) string {
		t.Helper()
		from := len(c.Text())
		c.Send(t, "rd")
		end := c.Expect(t, from, "READ-42", time.Minute)
		return c.Text()[from:end]
	}
	stop := func(t *testing.T, v *vm) {
		t.Helper()
		grace := int64(30)
		if _, err := v.client.Shutdown(context.Background(), &grace); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	}

	t.Run("the guest writes the writable disks and reads its writes back", func(t *testing.T) {
		v, c := start(t)
		for _, o := range overlays {
			if _, err := os.Stat(o); err != nil {
				t.Errorf("no overlay in the launcher's scratch directory: %v", err)
			}
		}
		from := len(c.Text())
		c.Send(t, `for s in CDRAW CDQCOW; do printf "QVIRT-WRITTEN-$s" | dd of=$(dev $s) conv=notrunc 2>/dev/null || echo "WRITE-FAILED-$s"; done; `+
			`printf X | dd of=$(dev CDRO) conv=notrunc 2>/dev/null; echo "RO-WRITE-EXIT-$?"; sync; echo WROTE-$((2+3))`)
		end := c.Expect(t, from, "WROTE-5", time.Minute)
		if out := c.Text()[from:end]; strings.Contains(out, "WRITE-FAILED-CD") || !strings.Contains(out, "RO-WRITE-EXIT-1") {
			t.Errorf("writes: %q; want the writable disks written and the readonly one refused", out)
		}
		got := read(t, c)
		for _, want := range []string{"CDRAW=QVIRT-WRITTEN-CD", "CDQCOW=QVIRT-WRITTEN-CD", "CDRO=QVIRT-ORIGINAL-3"} {
			if !strings.Contains(got, want) {
				t.Errorf("guest read %q; want %q", got, want)
			}
		}
		for f, sum := range sums {
			if fileSum(t, f) != sum {
				t.Errorf("the image file %s changed under the guest's writes", f)
			}
		}
		if b, err := os.ReadFile(overlays[0]); err != nil || !bytes.Contains(b, []byte("QVIRT-WRITTEN-CDRAW")) {
			t.Errorf("the raw image's overlay does not hold the guest's write (%v)", err)
		}
		stop(t, v)
		waitFor(t, 10*time.Second, "the overlays to go once QEMU exited", func() bool {
			for _, o := range overlays {
				if _, err := os.Stat(o); !os.IsNotExist(err) {
					return false
				}
			}
			return true
		})
	})

	t.Run("the next start sees the images as pulled", func(t *testing.T) {
		v, c := start(t)
		got := read(t, c)
		for _, want := range []string{"CDRAW=QVIRT-ORIGINAL-1", "CDQCOW=QVIRT-ORIGINAL-2", "CDRO=QVIRT-ORIGINAL-3"} {
			if !strings.Contains(got, want) {
				t.Errorf("guest read %q after a restart; want %q (the write must be gone)", got, want)
			}
		}
		stop(t, v)
	})
}
