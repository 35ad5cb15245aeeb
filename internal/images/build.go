// Package images builds qvirt's container images without a container engine: the Go binaries
// (static, -trimpath), and for the launcher and the node agent QEMU with the firmware it loads,
// taken from Debian packages pinned in a lock file, unpacked by this package and cut down to the
// files QEMU needs (its ELF dependencies found through DT_NEEDED). The images are reproducible:
// the same sources and the same lock give the same digests.
package images

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// RootPackages are the packages whose files the QEMU layer carries; the lock adds the libraries
// they need (Lock.Update finds them).
var RootPackages = []string{"qemu-system-x86", "qemu-system-common", "qemu-system-data", "qemu-utils", "seabios", "ovmf", "swtpm", "passt"}

// qemuFiles are the files of the QEMU layer besides their shared libraries: the emulator,
// qemu-img, the TCG accelerator and the device modules the launcher's machines use (modules in
// Debian's build), and the
// firmware and option ROMs a machine of the launcher's loads (QEMU's firmware path in Debian is
// /usr/share/qemu, /usr/share/seabios, /usr/lib/ipxe/qemu). NICs get no option ROM
// (romfile=""), so iPXE's are left out. The VNC server loads QEMU's default keymap, en-us, at
// start even though clients send raw key codes (QEMU exits without it). QEMU's virtiofsd serves
// the filesystems, swtpm the TPM.
func qemuFiles() []string {
	files := []string{
		"/usr/bin/qemu-system-x86_64",
		"/usr/bin/qemu-img",
		"/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so",
		// Devices Debian builds as modules: the virtio GPU and VGA (video type virtio) and USB
		// redirection (clientPassthrough).
		"/usr/lib/x86_64-linux-gnu/qemu/hw-display-virtio-gpu.so",
		"/usr/lib/x86_64-linux-gnu/qemu/hw-display-virtio-gpu-pci.so",
		"/usr/lib/x86_64-linux-gnu/qemu/hw-display-virtio-vga.so",
		"/usr/lib/x86_64-linux-gnu/qemu/hw-usb-redirect.so",
		// SeaBIOS (the default firmware of pc and q35) and the VGA BIOS of the launcher's VGA.
		"/usr/share/seabios/bios-256k.bin",
		"/usr/share/seabios/vgabios-stdvga.bin",
		// The VGA BIOSes of the other video models (launcher/graphics.go).
		"/usr/share/seabios/vgabios-virtio.bin",
		"/usr/share/seabios/vgabios-bochs-display.bin",
		"/usr/share/seabios/vgabios-cirrus.bin",
		"/usr/share/seabios/vgabios-ramfb.bin",
		// Direct kernel boot, multiboot and PVH loaders; the TPR patching ROM KVM uses.
		"/usr/share/qemu/linuxboot.bin",
		"/usr/share/qemu/linuxboot_dma.bin",
		"/usr/share/qemu/multiboot.bin",
		"/usr/share/qemu/multiboot_dma.bin",
		"/usr/share/qemu/pvh.bin",
		"/usr/share/qemu/kvmvapic.bin",
		"/usr/share/qemu/keymaps/en-us",
		// The daemon behind virtiofs filesystems (launcher/filesystem.go).
		launcher.DefaultVirtiofsd,
		// The TPM emulator (launcher/tpm.go).
		launcher.DefaultSWTPM,
		// The passt binding's user-mode network (launcher/passt.go), and the AVX2 build it
		// executes instead where the CPU has AVX2.
		launcher.DefaultPasst,
		launcher.DefaultPasst + ".avx2",
	}
	for _, sb := range []bool{false, true} {
		code, vars := launcher.OVMFFiles(sb)
		files = append(files, path.Join(launcher.DefaultOVMFDir, code), path.Join(launcher.DefaultOVMFDir, vars))
	}
	return files
}

// Image describes one of the images.
type Image struct {
	// Name is the repository below the registry: qvirt/<Name>.
	Name string
	// Binary is the command under cmd/ the image runs, installed as /usr/bin/<Binary>.
	Binary string
	// User is the image's default user ("uid:gid").
	User string
	// QEMU tells whether the image carries the QEMU layer.
	QEMU bool
}

// Images are qvirt's images. The controller and qvirt-api run as a non-root user (their
// Deployments also say runAsNonRoot). The launcher runs as QEMU's user 107 (podlayout), as
// KubeVirt's does. The node agent runs as root and privileged (its DaemonSet): it makes network
// devices in pods' namespaces, and it probes the node's QEMU and KVM with the same QEMU layer as
// the launcher's, which a node then pulls once.
var Images = []Image{
	{Name: "qvirt-controller", Binary: "qvirt-controller", User: "65532:65532"},
	{Name: "qvirt-api", Binary: "qvirt-api", User: "65532:65532"},
	{Name: "qvirt-handler", Binary: "qvirt-handler", User: "0:0", QEMU: true},
	{Name: "qvirt-launcher", Binary: path.Base(podlayout.LauncherBinary), User: fmt.Sprintf("%d:%d", podlayout.LauncherUID, podlayout.LauncherUID), QEMU: true},
}

// RefName is the reference an image is stored under in the layout (annotation
// org.opencontainers.image.ref.name) and pushed as below a registry.
func RefName(img Image) string { return "qvirt/" + img.Name + ":latest" }

// Options configure Build.
type Options struct {
	// ModuleDir is the qvirt module's root (where go.mod is).
	ModuleDir string
	// Lock is the parsed lock file.
	Lock *Lock
	// Fetcher gets the locked packages.
	Fetcher *Fetcher
	// OutDir receives the OCI image layout; it is replaced.
	OutDir string
	// Epoch is every time stamp in the images (SOURCE_DATE_EPOCH; the Unix epoch by default).
	Epoch time.Time
}

// Built is one image that Build wrote.
type Built struct {
	Image
	Digest v1.Hash
	// Compressed is the manifest, config and compressed layers: what a pull transfers.
	Compressed int64
	// Uncompressed is the layers' tar size: what a node stores unpacked.
	Uncompressed int64
}

// Build builds every image into an OCI layout at opts.OutDir.
func Build(ctx context.Context, opts Options) ([]Built, error) {
	bins, err := os.MkdirTemp("", "qvirt-images-bin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(bins)
	if err := buildBinaries(ctx, opts.ModuleDir, bins); err != nil {
		return nil, err
	}
	qemu, bin, err := compressLayers(ctx, opts, bins)
	if err != nil {
		return nil, err
	}
	base, err := baseLayer(opts.Epoch)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(opts.OutDir); err != nil {
		return nil, err
	}
	lp, err := layout.Write(opts.OutDir, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("write image layout %s: %w", opts.OutDir, err)
	}
	var out []Built
	for _, spec := range Images {
		layers := []named{{"base: /etc/passwd, /etc/group, /tmp", base}}
		if spec.QEMU {
			layers = append(layers, named{"qemu: QEMU, qemu-img and firmware from the locked Debian packages", qemu})
		}
		layers = append(layers, named{"/usr/bin/" + spec.Binary, bin[spec.Binary]})
		img, err := assemble(spec, layers, opts.Epoch)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", spec.Name, err)
		}
		if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": RefName(spec)})); err != nil {
			return nil, fmt.Errorf("image %s: write: %w", spec.Name, err)
		}
		b, err := describe(spec, img)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", spec.Name, err)
		}
		out = append(out, b)
	}
	return out, nil
}

// compressLayers makes the QEMU layer and each image's binary layer side by side: compressing
// them (gzip at its best) is most of a build's time, one core a layer. The bytes do not depend on
// the order.
func compressLayers(ctx context.Context, opts Options, bins string) (v1.Layer, map[string]v1.Layer, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(runtime.NumCPU())
	var qemu v1.Layer
	g.Go(func() (err error) {
		qemu, err = qemuLayer(gctx, opts)
		return err
	})
	var mu sync.Mutex
	bin := map[string]v1.Layer{}
	for _, spec := range Images {
		g.Go(func() error {
			l, err := binaryLayer(filepath.Join(bins, spec.Binary), spec.Binary, opts.Epoch)
			if err != nil {
				return fmt.Errorf("image %s: %w", spec.Name, err)
			}
			mu.Lock()
			defer mu.Unlock()
			bin[spec.Binary] = l
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return qemu, bin, nil
}

// buildBinaries builds the images' commands: static (no cgo: the images have no libc for them),
// -trimpath, stripped of symbol tables; the Go build ID and the VCS stamp depend only on the
// sources, so the same tree gives the same bytes.
func buildBinaries(ctx context.Context, moduleDir, out string) error {
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", out + "/"}
	for _, img := range Images {
		args = append(args, "./cmd/"+img.Binary)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = moduleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build of the images' binaries: %w\n%s", err, b)
	}
	return nil
}

type named struct {
	what  string
	layer v1.Layer
}

// assemble makes an OCI image of layers with a config that holds no time but epoch.
func assemble(spec Image, layers []named, epoch time.Time) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		var err error
		img, err = mutate.Append(img, mutate.Addendum{Layer: l.layer, MediaType: types.OCILayer,
			History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "qvirt-images: " + l.what}})
		if err != nil {
			return nil, err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Created = v1.Time{Time: epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{"/usr/bin/" + spec.Binary},
		Env:        []string{"PATH=/usr/bin:/bin"},
		User:       spec.User,
		WorkingDir: "/",
		Labels:     map[string]string{"org.opencontainers.image.title": spec.Name},
	}
	return mutate.ConfigFile(img, cf)
}

func describe(spec Image, img v1.Image) (Built, error) {
	b := Built{Image: spec}
	var err error
	if b.Digest, err = img.Digest(); err != nil {
		return b, err
	}
	m, err := img.Manifest()
	if err != nil {
		return b, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return b, err
	}
	b.Compressed = int64(len(raw)) + m.Config.Size
	layers, err := img.Layers()
	if err != nil {
		return b, err
	}
	for _, l := range layers {
		n, err := l.Size()
		if err != nil {
			return b, err
		}
		b.Compressed += n
		rc, err := l.Uncompressed()
		if err != nil {
			return b, err
		}
		u, err := countBytes(rc)
		if err != nil {
			return b, err
		}
		b.Uncompressed += u
	}
	return b, nil
}

// passwd and group name the images' users: root, QEMU's (the launcher's) and the non-root
// user of the control-plane images, so that tools reading them find names.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\nqemu:x:107:107:QEMU:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n"
	group  = "root:x:0:\nkvm:x:36:qemu\nqemu:x:107:\nnonroot:x:65532:\n"
)

func baseLayer(epoch time.Time) (v1.Layer, error) {
	t, err := layerTar(map[string]*entry{
		"/etc/passwd": {Type: typeFile, Mode: 0o644, Data: []byte(passwd)},
		"/etc/group":  {Type: typeFile, Mode: 0o644, Data: []byte(group)},
		"/tmp":        {Type: typeDir, Mode: 0o1777},
	}, epoch)
	if err != nil {
		return nil, err
	}
	return gzipLayer(t)
}

func binaryLayer(file, name string, epoch time.Time) (v1.Layer, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	t, err := layerTar(map[string]*entry{"/usr/bin/" + name: {Type: typeFile, Mode: 0o755, Data: data}}, epoch)
	if err != nil {
		return nil, err
	}
	return gzipLayer(t)
}

// qemuLayer unpacks the locked packages and selects qemuFiles with their libraries.
func qemuLayer(ctx context.Context, opts Options) (v1.Layer, error) {
	for _, p := range RootPackages {
		if _, ok := opts.Lock.Get(p); !ok {
			return nil, fmt.Errorf("package %s is not in the lock: run 'make images-lock'", p)
		}
	}
	t, err := unpackLocked(ctx, opts.Fetcher, opts.Lock)
	if err != nil {
		return nil, err
	}
	sel := newSelection(t)
	for _, f := range qemuFiles() {
		if err := sel.add(f); err != nil {
			return nil, fmt.Errorf("QEMU layer: %w", err)
		}
	}
	if err := sel.missingErr(); err != nil {
		return nil, fmt.Errorf("QEMU layer: %w: run 'make images-lock'", err)
	}
	data, err := layerTar(sel.entries(), opts.Epoch)
	if err != nil {
		return nil, err
	}
	return gzipLayer(data)
}

// unpackLocked fetches every locked package, then unpacks them (two at a time: xz is the slow
// part) and merges their files in the lock's order, so the first package to bring a path keeps
// it whatever order the unpacking finished in. It checks that each file is the package and
// version the lock names.
func unpackLocked(ctx context.Context, f *Fetcher, l *Lock) (tree, error) {
	files, err := f.FetchAll(ctx, l.Entries)
	if err != nil {
		return nil, err
	}
	trees := make([]tree, len(l.Entries))
	errs := make([]error, len(l.Entries))
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for i, e := range l.Entries {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			trees[i] = tree{}
			_, errs[i] = unpackFile(files[i], e, trees[i])
		}()
	}
	wg.Wait()
	t := tree{}
	for i := range l.Entries {
		if errs[i] != nil {
			return nil, errs[i]
		}
		for p, e := range trees[i] {
			if _, ok := t[p]; !ok {
				t[p] = e
			}
		}
	}
	return t, nil
}

func unpackEntry(ctx context.Context, f *Fetcher, e LockEntry, t tree) (Control, error) {
	file, err := f.Fetch(ctx, e)
	if err != nil {
		return Control{}, err
	}
	return unpackFile(file, e, t)
}

// unpackFile unpacks the .deb file of e into t.
func unpackFile(file string, e LockEntry, t tree) (Control, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Control{}, err
	}
	parts, err := splitDeb(data)
	if err != nil {
		return Control{}, fmt.Errorf("package %s: %s: %w", e.Package, file, err)
	}
	c, err := readControl(parts)
	if err != nil {
		return Control{}, fmt.Errorf("package %s: %w", e.Package, err)
	}
	if c.Package != e.Package || c.Version != e.Version || c.Arch != e.Arch {
		return Control{}, fmt.Errorf("package %s: %s holds %s %s %s, the lock names %s %s", e.Package, file, c.Package, c.Version, c.Arch, e.Version, e.Arch)
	}
	return c, t.addDeb(e.Package, parts)
}

func countBytes(rc io.ReadCloser) (int64, error) {
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}

// HumanSize formats a byte count in MiB with one decimal.
func HumanSize(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// DefaultCacheDir is where fetched packages are kept: $QVIRT_CACHE_DIR/debs, else
// $XDG_CACHE_HOME/qvirt/debs or ~/.cache/qvirt/debs (as test/guest/build.sh keeps its own).
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("QVIRT_CACHE_DIR"); d != "" {
		return filepath.Join(d, "debs"), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for packages: %w", err)
	}
	return filepath.Join(d, "qvirt", "debs"), nil
}

// EpochFromEnv is SOURCE_DATE_EPOCH (reproducible-builds.org's variable) as a time, the Unix
// epoch when it is unset.
func EpochFromEnv() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970 (a non-negative integer)", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// ReadLock reads and parses a lock file.
func ReadLock(file string) (*Lock, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	l, err := ParseLock(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return l, nil
}
