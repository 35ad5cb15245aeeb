package launcher

import (
	"errors"
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
	write(filepath.Join(mounts.ContainerDisks, "root/disk/root.qcow2"), "")
	qemuImg(t, "create", "-q", "-f", "qcow2", filepath.Join(mounts.ContainerDisks, "root/disk/root.qcow2"), "1M")
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
			{Name: "data", ReadOnly: true, Source: machine.Source{Container: &machine.Container{Image: img, Path: "images/data.img"}}},
		}}
	m, err := h.Resolve(desc, dir)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if want := filepath.Join(mounts.KernelBoot, "boot/vmlinuz"); m.KernelFile != want {
		t.Errorf("kernel = %s, want %s", m.KernelFile, want)
	}
	// The writable disk is an overlay in the launcher's own directory over the image, read-only.
	got, want := m.Images["root"], filepath.Join(mounts.ContainerDisks, "root/disk/root.qcow2")
	if got.Path != filepath.Join(dir, "overlay-root.qcow2") || got.Format != "qcow2" || got.ReadOnly || !got.Ephemeral ||
		got.Backing == nil || got.Backing.Path != want || got.Backing.Format != "qcow2" || !got.Backing.ReadOnly {
		t.Errorf("root = %+v (backing %+v), want a writable overlay in %s over %s read-only qcow2", got, got.Backing, dir, want)
	}
	if got, want := m.Images["data"], filepath.Join(mounts.ContainerDisks, "data/images/data.img"); got.Path != want || !got.ReadOnly || got.Backing != nil {
		t.Errorf("data = %+v, want %s itself, read-only", got, want)
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

// A containerDisk image without a path must hold exactly one file under /disk/ (KubeVirt's
// layout); anything else is refused at the volume's path field, saying what was found and what
// was expected.
func TestContainerDiskImageWithoutOneDiskFile(t *testing.T) {
	cases := []struct {
		name  string
		files []string
		want  string
	}{
		{"no /disk directory", []string{"boot/vmlinuz"}, "the image has no /disk directory: a containerDisk image holds one disk image file under /disk/"},
		{"an empty /disk", []string{"disk/"}, "/disk directory is empty"},
		{"two files", []string{"disk/a.qcow2", "disk/b.img"}, "holds 2 entries (a.qcow2, b.img), so which is the disk is not clear: set containerDisk.path"},
		{"a directory", []string{"disk/sub/"}, "/disk/sub in the image is a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			mounts := ImageMounts{ContainerDisks: filepath.Join(dir, "container-disks")}
			root := filepath.Join(mounts.ContainerDisks, "root")
			if err := os.MkdirAll(root, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range c.files {
				p := filepath.Join(root, f)
				if strings.HasSuffix(f, "/") {
					if err := os.MkdirAll(p, 0o755); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			h := HostResolver{Images: &mounts}
			desc := &machine.Machine{UID: "u", Disks: []machine.Disk{
				{Name: "root", Source: machine.Source{Container: &machine.Container{Image: machine.ImageRef{Ref: "registry.example/disk:1"}}}}}}
			_, err := h.Resolve(desc, dir)
			var fes machine.FieldErrors
			if !errors.As(err, &fes) || len(fes) != 1 || fes[0].Field != "machine.disks[0].source.container.path" || !strings.Contains(fes[0].Detail, c.want) {
				t.Fatalf("err = %v, want one at machine.disks[0].source.container.path saying %q", err, c.want)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "overlay-*")); len(left) != 0 {
				t.Errorf("a refused disk left an overlay: %v", left)
			}
		})
	}
}
