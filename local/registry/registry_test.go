package registry_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/test/testutil"
)

// start runs a registry on a free loopback port for the test's lifetime.
func start(t *testing.T, opts registry.Options) *registry.Server {
	t.Helper()
	opts.Addr = "127.0.0.1:0"
	srv, err := registry.Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registry stopped: %v", err)
		}
	})
	return srv
}

// The seeded images are pullable by any OCI client and hold the guest's files where KubeVirt's
// conventions put them; blobs survive in the state directory and seeding again changes nothing.
func TestSeedPushesKernelBootAndContainerDiskImages(t *testing.T) {
	guest, err := testutil.GuestDir()
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	var requests atomic.Int64
	srv := start(t, registry.Options{StateDir: state, OnRequest: func(*http.Request) { requests.Add(1) }})
	ctx := context.Background()
	imgs, err := registry.Seed(ctx, srv.Addr(), guest)
	if err != nil {
		t.Fatal(err)
	}
	if want := srv.Addr() + "/qvirt/demo-guest:latest"; imgs.KernelBoot != want {
		t.Errorf("kernelBoot image %q, want %q", imgs.KernelBoot, want)
	}
	files := imageFiles(t, imgs.KernelBoot)
	for path, src := range map[string]string{registry.KernelPath: "vmlinuz", registry.InitrdPath: "initrd.img"} {
		want, err := os.ReadFile(filepath.Join(guest, src))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(files[path], want) {
			t.Errorf("%s in %s: %d bytes, want the %d of %s", path, imgs.KernelBoot, len(files[path]), len(want), src)
		}
	}
	disk := imageFiles(t, imgs.ContainerDisk)[registry.DiskPath]
	if !bytes.HasPrefix(disk, []byte("QFI\xfb")) {
		t.Errorf("%s in %s is not a qcow2 image (%d bytes)", registry.DiskPath, imgs.ContainerDisk, len(disk))
	}
	blobs, err := os.ReadDir(filepath.Join(state, "blobs", "sha256"))
	if err != nil || len(blobs) < 4 {
		t.Errorf("blobs on disk: %d (%v), want the layers and configs of both images", len(blobs), err)
	}

	before := digest(t, imgs.KernelBoot)
	if _, err := registry.Seed(ctx, srv.Addr(), guest); err != nil {
		t.Fatal(err)
	}
	if after := digest(t, imgs.KernelBoot); after != before {
		t.Errorf("seeding the same guest again changed the digest: %s then %s", before, after)
	}
	if requests.Load() == 0 {
		t.Error("OnRequest saw no request")
	}
}

func TestSeedFailsWithoutTheGuest(t *testing.T) {
	srv := start(t, registry.Options{})
	_, err := registry.Seed(context.Background(), srv.Addr(), t.TempDir())
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("seed from an empty directory: %v, want a not-exist error naming vmlinuz", err)
	}
}

func digest(t *testing.T, ref string) string {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Head(r)
	if err != nil {
		t.Fatal(err)
	}
	return desc.Digest.String()
}

// imageFiles pulls ref with go-containerregistry and returns its regular files by absolute path.
func imageFiles(t *testing.T, ref string) map[string][]byte {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files["/"+hdr.Name] = b
		}
	}
}

// A containerDisk is what KubeVirt's documentation builds: one layer, the disk under /disk/
// owned by 107 and read-only, for linux/amd64; the file is pushed byte for byte.
func TestPushContainerDiskLaysOutTheDiskAsKubeVirtDoes(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "disk.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", disk, "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	want, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	srv := start(t, registry.Options{})
	ref := srv.Addr() + "/" + registry.CloudDiskRepo + ":latest"
	if err := registry.PushContainerDisk(context.Background(), ref, disk, registry.CloudDiskPath); err != nil {
		t.Fatal(err)
	}

	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r)
	if err != nil {
		t.Fatalf("pull %s: %v", ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("platform %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
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
	tr := tar.NewReader(rc)
	var entries []string
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, fmt.Sprintf("%s %o %d:%d", hdr.Name, hdr.Mode, hdr.Uid, hdr.Gid))
		if hdr.Name == registry.CloudDiskPath[1:] {
			got, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("%s: %d bytes differing from the %d pushed", hdr.Name, len(got), len(want))
			}
		}
	}
	if wantEntries := []string{"disk/ 755 107:107", "disk/disk.qcow2 440 107:107"}; !slices.Equal(entries, wantEntries) {
		t.Errorf("layer holds %q, want %q", entries, wantEntries)
	}
}

func TestPushContainerDiskRefusesAPathOutsideDisk(t *testing.T) {
	err := registry.PushContainerDisk(context.Background(), "127.0.0.1:1/x:latest", "/nonexistent", "/boot/disk.qcow2")
	if err == nil || !strings.Contains(err.Error(), "/disk/") {
		t.Fatalf("push to /boot/disk.qcow2: %v, want a refusal naming /disk/", err)
	}
}
