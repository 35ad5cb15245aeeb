package registry

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The demo images Seed pushes, and where their files are inside them. The kernelBoot image follows
// KubeVirt's examples (kernel and initrd under /boot, named by kernelPath and initrdPath); the
// containerDisk image follows KubeVirt's containerDisk convention (one disk image under /disk,
// owned by uid/gid 107, which the launcher finds when the volume gives no path).
const (
	DemoGuestRepo = "qvirt/demo-guest"
	DemoDiskRepo  = "qvirt/demo-disk"
	KernelPath    = "/boot/vmlinuz"
	InitrdPath    = "/boot/initrd.img"
	DiskPath      = "/disk/demo.qcow2"
	// DemoDiskSize is the virtual size of the demo disk (an empty qcow2).
	DemoDiskSize = "64M"

	// CloudDiskRepo holds the cloud image (test/guest/cloud/build.sh: Debian with cloud-init,
	// bootable under BIOS and UEFI) as a containerDisk, its qcow2 at CloudDiskPath.
	CloudDiskRepo = "qvirt/cloud-debian"
	CloudDiskPath = "/disk/disk.qcow2"
	// containerDiskOwner is the uid and gid of a containerDisk's files, as KubeVirt's
	// documentation builds them (`ADD --chown=107:107 ... /disk/`): QEMU's user in its images.
	containerDiskOwner = 107
)

// Images are the references Seed pushed.
type Images struct {
	// KernelBoot is <registry>/qvirt/demo-guest:latest, for spec.domain.firmware.kernelBoot.container.image.
	KernelBoot string
	// ContainerDisk is <registry>/qvirt/demo-disk:latest, for a containerDisk volume.
	ContainerDisk string
}

// Seed builds the demo images from the test guest in guestDir (test/guest/build.sh's output:
// vmlinuz, initrd.img) and an empty qcow2 made with qemu-img, and pushes them to the registry at
// registryAddr over plain HTTP (it is meant for the local registry). The images are reproducible:
// seeding the same guest again pushes the same digests.
func Seed(ctx context.Context, registryAddr, guestDir string) (Images, error) {
	imgs := Images{
		KernelBoot:    registryAddr + "/" + DemoGuestRepo + ":latest",
		ContainerDisk: registryAddr + "/" + DemoDiskRepo + ":latest",
	}
	guest, err := imageOf(
		tarFile{name: KernelPath, src: filepath.Join(guestDir, "vmlinuz"), mode: 0o644},
		tarFile{name: InitrdPath, src: filepath.Join(guestDir, "initrd.img"), mode: 0o644})
	if err != nil {
		return Images{}, fmt.Errorf("demo guest image from %s: %w", guestDir, err)
	}
	if err := push(ctx, imgs.KernelBoot, guest); err != nil {
		return Images{}, err
	}
	diskFile, cleanup, err := emptyQcow2(ctx)
	if err != nil {
		return Images{}, err
	}
	defer cleanup()
	if err := PushContainerDisk(ctx, imgs.ContainerDisk, diskFile, DiskPath); err != nil {
		return Images{}, fmt.Errorf("demo disk image: %w", err)
	}
	return imgs, nil
}

// PushCloudDisk pushes the cloud image in cloudDir (test/guest/cloud/build.sh's output, holding
// disk.qcow2) as a containerDisk to <registryAddr>/qvirt/cloud-debian:latest over plain HTTP,
// like Seed, and returns that reference. The layer is read from the file as it is pushed (the
// image is a few hundred MiB); pushing the same image again uploads nothing.
func PushCloudDisk(ctx context.Context, registryAddr, cloudDir string) (string, error) {
	ref := registryAddr + "/" + CloudDiskRepo + ":latest"
	if err := PushContainerDisk(ctx, ref, filepath.Join(cloudDir, "disk.qcow2"), CloudDiskPath); err != nil {
		return "", fmt.Errorf("cloud image from %s: %w", cloudDir, err)
	}
	return ref, nil
}

// PushContainerDisk pushes a KubeVirt-layout containerDisk to ref over plain HTTP: a linux/amd64
// image with one layer holding diskFile at path (under /disk/), read-only and owned by uid/gid
// 107 as KubeVirt's documentation builds them. opts add to the push's (credentials for a private
// registry, say).
func PushContainerDisk(ctx context.Context, ref, diskFile, path string, opts ...remote.Option) error {
	if filepath.Dir(path) != "/disk" {
		return fmt.Errorf("containerDisk path %q: want a file directly under /disk/", path)
	}
	img, err := imageOf(tarFile{name: path, src: diskFile, mode: 0o440, owner: containerDiskOwner})
	if err != nil {
		return err
	}
	return push(ctx, ref, img, opts...)
}

// PushKernel pushes a kernelBoot image holding only the kernel file at KernelPath (no initrd) to
// ref, over plain HTTP like Seed.
func PushKernel(ctx context.Context, ref, kernelFile string) error {
	img, err := imageOf(tarFile{name: KernelPath, src: kernelFile, mode: 0o644})
	if err != nil {
		return fmt.Errorf("kernel image from %s: %w", kernelFile, err)
	}
	return push(ctx, ref, img)
}

// tarFile is one file of a single-layer image.
type tarFile struct {
	name  string // absolute path in the image
	src   string // file on the host
	mode  int64
	owner int
}

// imageOf is a linux/amd64 image with one layer holding files (and their parent directories).
func imageOf(files ...tarFile) (v1.Image, error) {
	layer, err := layerOf(files)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	return mutate.ConfigFile(img, cfg)
}

// layerOf is a layer holding files (and their parent directories) with fixed timestamps, so the
// digest depends on the content only. Its tar is written from the files each time the layer is
// read (go-containerregistry reads it to digest it and again to push it): a cloud image is too
// big to hold in memory.
func layerOf(files []tarFile) (v1.Layer, error) {
	for _, f := range files {
		if _, err := os.Stat(f.src); err != nil {
			return nil, err
		}
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTar(pw, files)) }()
		return pr, nil
	})
}

func writeTar(w io.Writer, files []tarFile) error {
	tw := tar.NewWriter(w)
	epoch := time.Unix(0, 0)
	dirs := map[string]bool{}
	for _, f := range files {
		dir := filepath.Dir(f.name)[1:] + "/"
		if !dirs[dir] {
			dirs[dir] = true
			hdr := &tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch, Uid: f.owner, Gid: f.owner}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		}
		if err := addFile(tw, f, epoch); err != nil {
			return err
		}
	}
	return tw.Close()
}

func addFile(tw *tar.Writer, f tarFile, mtime time.Time) error {
	src, err := os.Open(f.src)
	if err != nil {
		return err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return err
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: f.name[1:], Size: st.Size(), Mode: f.mode,
		ModTime: mtime, Uid: f.owner, Gid: f.owner}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.Copy(tw, src)
	return err
}

// emptyQcow2 makes the demo disk in a temporary directory.
func emptyQcow2(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp("", "qvirt-seed-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	path := filepath.Join(dir, filepath.Base(DiskPath))
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", path, DemoDiskSize).CombinedOutput()
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("qemu-img create %s: %w: %s", path, err, out)
	}
	return path, cleanup, nil
}

// push writes img to ref over plain HTTP, with opts besides the context.
func push(ctx context.Context, ref string, img v1.Image, opts ...remote.Option) error {
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	if err := remote.Write(r, img, append([]remote.Option{remote.WithContext(ctx)}, opts...)...); err != nil {
		return fmt.Errorf("push %s: %w", ref, err)
	}
	return nil
}
