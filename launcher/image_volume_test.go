package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/machine"
)

// In a launcher pod the images are the pod's read-only image volumes: the resolver finds each file
// inside its own volume's mount, never pulls, and refuses a path (or a link in the image) that
// leads outside the mount.
func TestPodResolverReadsImageVolumes(t *testing.T) {
	dir := t.TempDir()
	mounts := ImageMounts{KernelBoot: filepath.Join(dir, "kernel-boot"), ContainerDisks: filepath.Join(dir, "container-disks")}
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(mounts.KernelBoot, "boot/vmlinuz"), "kernel")
	write(filepath.Join(mounts.ContainerDisks, "root/disk/root.qcow2"), "disk")
	write(filepath.Join(mounts.ContainerDisks, "data/images/data.img"), "data")
	write(filepath.Join(dir, "secret.img"), "another tenant's")
	if err := os.Symlink("../../../secret.img", filepath.Join(mounts.ContainerDisks, "data/images/escape.img")); err != nil {
		t.Fatal(err)
	}
	h := HostResolver{Images: &mounts}
	// A registry reference nobody can pull: the resolver must not try.
	img := machine.ImageRef{Ref: "unreachable.invalid/image:1", PullSecret: "creds"}
	desc := &machine.Machine{UID: "u",
		Kernel: &machine.KernelBoot{Image: img, KernelPath: "/boot/vmlinuz"},
		Disks: []machine.Disk{
			{Name: "root", Source: machine.Source{Container: &machine.Container{Image: img}}},
			{Name: "data", Source: machine.Source{Container: &machine.Container{Image: img, Path: "images/data.img"}}},
		}}
	m, err := h.Resolve(desc, dir)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if want := filepath.Join(mounts.KernelBoot, "boot/vmlinuz"); m.KernelFile != want {
		t.Errorf("kernel = %s, want %s", m.KernelFile, want)
	}
	if got, want := m.Images["root"], filepath.Join(mounts.ContainerDisks, "root/disk/root.qcow2"); got.Path != want || got.Format != "qcow2" || !got.ReadOnly {
		t.Errorf("root = %+v, want %s read-only qcow2", got, want)
	}
	if got, want := m.Images["data"], filepath.Join(mounts.ContainerDisks, "data/images/data.img"); got.Path != want {
		t.Errorf("data = %+v, want %s", got, want)
	}

	for _, path := range []string{"images/escape.img", "../root/disk/root.qcow2", "/images/../../root/disk/root.qcow2"} {
		desc.Disks[1].Source.Container.Path = path
		_, err := h.Resolve(desc, dir)
		if err == nil || !strings.Contains(err.Error(), "outside") {
			t.Errorf("path %s: err = %v, want a refusal of a path outside the image", path, err)
		}
	}
	desc.Disks[1].Source.Container.Path = "images/data.img"
	desc.Disks[1].Source.Container.Image.Ref = "file://" + dir
	if _, err := h.Resolve(desc, dir); err == nil || !strings.Contains(err.Error(), "file://") {
		t.Errorf("file:// image in a launcher pod: err = %v, want a refusal", err)
	}
}
