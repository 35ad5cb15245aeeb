package launcher_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests pull the test guest over the registry protocol from a real registry (local/registry)
// on 127.0.0.1, through the real puller binary (cmd/qvirt-pull), and boot it with a real launcher.

var (
	pullerOnce sync.Once
	pullerBin  string
	pullerErr  error
)

// puller builds cmd/qvirt-pull once per test binary.
func puller(t testing.TB) string {
	t.Helper()
	pullerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "qvirt-pull-")
		if err != nil {
			pullerErr = err
			return
		}
		pullerBin = filepath.Join(dir, launcher.PullerName)
		if out, err := exec.Command("go", "build", "-trimpath", "-o", pullerBin, "../cmd/qvirt-pull").CombinedOutput(); err != nil {
			pullerErr = errors.New("go build ../cmd/qvirt-pull: " + err.Error() + ": " + string(out))
		}
	})
	if pullerErr != nil {
		t.Fatal(pullerErr)
	}
	return pullerBin
}

// testRegistry is a seeded registry that counts what clients fetch.
type testRegistry struct {
	addr      string
	images    registry.Images
	blobGets  atomic.Int64
	manifests atomic.Int64
	allOfThem atomic.Int64
}

func (r *testRegistry) count(req *http.Request) {
	r.allOfThem.Add(1)
	switch {
	case req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/blobs/"):
		r.blobGets.Add(1)
	case strings.Contains(req.URL.Path, "/manifests/"):
		r.manifests.Add(1)
	}
}

func (r *testRegistry) reset() { r.blobGets.Store(0); r.manifests.Store(0); r.allOfThem.Store(0) }

func startRegistry(t *testing.T) *testRegistry {
	t.Helper()
	r := &testRegistry{}
	srv, err := registry.Listen(registry.Options{Addr: "127.0.0.1:0", StateDir: t.TempDir(), OnRequest: r.count})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r.addr = srv.Addr()
	if r.images, err = registry.Seed(ctx, r.addr, guestDir); err != nil {
		t.Fatal(err)
	}
	r.reset()
	return r
}

// imageResolver pulls into cache, trusting the test registry with plain HTTP.
func imageResolver(t *testing.T, r *testRegistry, cache string) launcher.HostResolver {
	return launcher.HostResolver{SpareRootPorts: 2, ImageCache: cache, InsecureRegistries: []string{r.addr}, Puller: puller(t)}
}

// registryVMI boots the demo guest image with the demo containerDisk as its only disk.
func registryVMI(t *testing.T, imgs registry.Images) *v1alpha1.VirtualMachineInstance {
	vmi := guestVMI(t)
	c := vmi.Spec.Domain.Firmware.KernelBoot.Container
	c.Image, c.KernelPath, c.InitrdPath = imgs.KernelBoot, registry.KernelPath, registry.InitrdPath
	vmi.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "demo", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}
	vmi.Spec.Volumes = []v1alpha1.Volume{{Name: "demo", VolumeSource: v1alpha1.VolumeSource{
		ContainerDisk: &v1alpha1.ContainerDiskSource{Image: imgs.ContainerDisk}}}}
	return vmi
}

func registrySpec(t *testing.T, imgs registry.Images) *protocol.SyncRequest {
	return testutil.SyncRequest(t, registryVMI(t, imgs), nil)
}

// A guest boots from kernelBoot and containerDisk images pulled over the registry protocol; a second
// launcher on the node uses the cache: it resolves the :latest tag but fetches no blob, and with
// IfNotPresent it does not contact the registry at all.
func TestBootFromRegistryImagesAndCache(t *testing.T) {
	t.Parallel()
	reg := startRegistry(t)
	cache := t.TempDir()
	ctx := context.Background()

	v := newLauncherWith(t, imageResolver(t, reg, cache))
	start := time.Now()
	if _, err := v.client.Sync(ctx, registrySpec(t, reg.images)); err != nil {
		t.Fatalf("sync: %v", err)
	}
	t.Logf("first start (pull, unpack, exec QEMU): %s, %d blob GETs", time.Since(start), reg.blobGets.Load())
	if reg.blobGets.Load() == 0 {
		t.Fatal("the first start fetched no blob from the registry")
	}
	con := attach(t, v.runDir)
	at := con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	con.Send(t, "echo VDA-$(cat /sys/block/vda/size)")
	con.Expect(t, at, "VDA-131072", 30*time.Second) // 64 MiB containerDisk, in 512-byte sectors

	reg.reset()
	again := newLauncherWith(t, imageResolver(t, reg, cache))
	start = time.Now()
	if _, err := again.client.Sync(ctx, registrySpec(t, reg.images)); err != nil {
		t.Fatalf("second sync: %v", err)
	}
	t.Logf("second start, :latest (manifest check, cache hit): %s, %d requests", time.Since(start), reg.allOfThem.Load())
	if n := reg.blobGets.Load(); n != 0 {
		t.Errorf("the second start fetched %d blobs, want 0 (cache)", n)
	}

	reg.reset()
	third := newLauncherWith(t, imageResolver(t, reg, cache))
	vmi := registryVMI(t, reg.images)
	vmi.Spec.Domain.Firmware.KernelBoot.Container.ImagePullPolicy = corev1.PullIfNotPresent
	vmi.Spec.Volumes[0].ContainerDisk.ImagePullPolicy = corev1.PullIfNotPresent
	req := testutil.SyncRequest(t, vmi, nil)
	start = time.Now()
	if _, err := third.client.Sync(ctx, req); err != nil {
		t.Fatalf("third sync: %v", err)
	}
	t.Logf("third start, IfNotPresent (cache only): %s, %d requests", time.Since(start), reg.allOfThem.Load())
	if n := reg.allOfThem.Load(); n != 0 {
		t.Errorf("IfNotPresent with the image cached made %d registry requests, want 0", n)
	}
}

// Images that cannot be had are refused with a 400 naming the image field, and nothing starts.
func TestRegistryImageErrors(t *testing.T) {
	reg := startRegistry(t)
	evil := pushEvilImages(t, reg.addr)
	const field = "machine.kernel.image.ref"
	cases := []struct {
		name, image string
		insecure    bool
		want        string
	}{
		{name: "missing tag", image: reg.addr + "/qvirt/demo-guest:nope", insecure: true, want: "MANIFEST_UNKNOWN"},
		{name: "missing repository", image: reg.addr + "/qvirt/nothing:latest", insecure: true, want: "pull " + reg.addr + "/qvirt/nothing:latest"},
		{name: "plain HTTP not allowed", image: reg.images.KernelBoot, want: "--insecure-registry " + reg.addr},
		{name: "bad reference", image: "UPPER/case::x", insecure: true, want: "not an image reference"},
		{name: "absolute symlink in a layer", image: evil["abs-link"], insecure: true, want: "absolute symbolic link"},
		{name: "dot-dot path in a layer", image: evil["dotdot"], insecure: true, want: "unsafe tar path"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cache := t.TempDir()
			res := imageResolver(t, reg, cache)
			if !c.insecure {
				res.InsecureRegistries = nil
			}
			v := newLauncherWith(t, res)
			req := registrySpec(t, reg.images)
			req.Machine.Kernel.Image.Ref = c.image
			_, err := v.client.Sync(context.Background(), req)
			var apiErr *launcher.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || apiErr.Field != field || !strings.Contains(apiErr.Msg, c.want) {
				t.Fatalf("sync: %v, want a 400 on %s saying %q", err, field, c.want)
			}
			if st, _ := v.client.Status(context.Background()); st.PID != 0 {
				t.Errorf("QEMU started (pid %d) despite the refused image", st.PID)
			}
			if tmp, _ := filepath.Glob(filepath.Join(cache, "tmp-*")); len(tmp) != 0 {
				t.Errorf("unpacking left %v behind", tmp)
			}
		})
	}
}

// pushEvilImages pushes images whose layers try to escape the root they are unpacked into.
func pushEvilImages(t *testing.T, addr string) map[string]string {
	t.Helper()
	layers := map[string][]*tar.Header{
		"abs-link": {{Typeflag: tar.TypeDir, Name: "boot/", Mode: 0o755},
			{Typeflag: tar.TypeSymlink, Name: "boot/vmlinuz", Linkname: "/etc/passwd"}},
		"dotdot": {{Typeflag: tar.TypeReg, Name: "../../../tmp/qvirt-evil", Mode: 0o644}},
	}
	refs := map[string]string{}
	for tag, hdrs := range layers {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hdrs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		data := buf.Bytes()
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			t.Fatal(err)
		}
		img, err := mutate.AppendLayers(empty.Image, layer)
		if err != nil {
			t.Fatal(err)
		}
		refs[tag] = addr + "/qvirt/evil:" + tag
		ref, err := name.ParseReference(refs[tag], name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img); err != nil {
			t.Fatal(err)
		}
	}
	return refs
}
