package images

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/test/testutil"
)

// chrootHelperEnv makes the test binary a tiny container runtime (runInImage): in the new mount
// namespace it was started in, it mounts /dev and /proc into a root, chroots there, drops to a
// uid and execs a command.
const chrootHelperEnv = "QVIRT_IMAGES_CHROOT_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(chrootHelperEnv) != "" {
		os.Exit(chrootHelper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

var (
	buildOnce  sync.Once
	builtDir   string
	builtFirst []Built
	buildErr   error
	buildTime  time.Duration
)

// moduleDir is the repository root.
func moduleDir(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func testLock(t testing.TB) *Lock {
	l, err := ReadLock(filepath.Join(moduleDir(t), "hack", "images", "debs.lock"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testFetcher(t testing.TB) *Fetcher {
	dir, err := DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return &Fetcher{CacheDir: dir}
}

// buildImages builds every image once per test binary, into a directory kept until it exits.
func buildImages(t *testing.T) (string, []Built) {
	t.Helper()
	buildOnce.Do(func() {
		builtDir, buildErr = os.MkdirTemp("", "qvirt-images-test-")
		if buildErr != nil {
			return
		}
		start := time.Now()
		builtFirst, buildErr = Build(context.Background(), Options{ModuleDir: moduleDir(t), Lock: testLock(t), Fetcher: testFetcher(t),
			OutDir: filepath.Join(builtDir, "a"), Epoch: time.Unix(0, 0).UTC()})
		buildTime = time.Since(start)
	})
	if buildErr != nil {
		t.Fatalf("build the images: %v", buildErr)
	}
	return filepath.Join(builtDir, "a"), builtFirst
}

// The same sources and lock give the same digests, and every image's user and layers are as
// the deployments expect.
func TestImagesAreReproducible(t *testing.T) {
	_, first := buildImages(t)
	t.Logf("first build took %s", buildTime.Round(100*time.Millisecond))
	second, err := Build(context.Background(), Options{ModuleDir: moduleDir(t), Lock: testLock(t), Fetcher: testFetcher(t),
		OutDir: filepath.Join(t.TempDir(), "b"), Epoch: time.Unix(0, 0).UTC()})
	if err != nil {
		t.Fatalf("second build: %v", err)
	}
	if len(first) != len(Images) || len(second) != len(Images) {
		t.Fatalf("built %d and %d images, want %d", len(first), len(second), len(Images))
	}
	for i := range first {
		a, b := first[i], second[i]
		t.Logf("%-16s %s compressed %s uncompressed %s", a.Name, a.Digest, HumanSize(a.Compressed), HumanSize(a.Uncompressed))
		if a.Digest != b.Digest {
			t.Errorf("image %s: digest %s, then %s from the same sources", a.Name, a.Digest, b.Digest)
		}
	}
}

// The images' configs: users, entrypoints, no time but the epoch; the QEMU layer is shared by
// the launcher and the node agent.
func TestImageConfigs(t *testing.T) {
	dir, built := buildImages(t)
	want := map[string]string{"qvirt-controller": "65532:65532", "qvirt-api": "65532:65532", "qvirt-handler": "0:0", "qvirt-launcher": "107:107"}
	layers := map[string][]v1.Hash{}
	for _, b := range built {
		img := layoutImage(t, dir, b.Digest)
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.Config.User != want[b.Name] {
			t.Errorf("image %s: user %q, want %q", b.Name, cf.Config.User, want[b.Name])
		}
		if ep := strings.Join(cf.Config.Entrypoint, " "); ep != "/usr/bin/"+b.Binary {
			t.Errorf("image %s: entrypoint %q", b.Name, ep)
		}
		if !cf.Created.Time.Equal(time.Unix(0, 0)) {
			t.Errorf("image %s: created %s, want the epoch", b.Name, cf.Created.Time)
		}
		ls, err := img.Layers()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			d, _ := l.Digest()
			layers[b.Name] = append(layers[b.Name], d)
		}
	}
	if h, l := layers["qvirt-handler"], layers["qvirt-launcher"]; len(h) != 3 || len(l) != 3 || h[1] != l[1] {
		t.Errorf("handler layers %v and launcher layers %v: want base, the same QEMU layer, binary", h, l)
	}
}

func layoutImage(t *testing.T, dir string, d v1.Hash) v1.Image {
	t.Helper()
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Image(d)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// The launcher image's own files run a VM: its qvirt-launcher (as QEMU's user 107, chrooted
// into the image's filesystem) boots the test guest to its banner with the image's QEMU,
// libraries and firmware, with a VGA and VNC display, and the guest powers off cleanly. Nothing
// from the host's QEMU installation is visible.
func TestLauncherImageBootsTheTestGuest(t *testing.T) {
	guest, err := testutil.GuestDir()
	if err != nil {
		t.Fatal(err)
	}
	dir, built := buildImages(t)
	var launcherImg v1.Image
	for _, b := range built {
		if b.Name == "qvirt-launcher" {
			launcherImg = layoutImage(t, dir, b.Digest)
		}
	}
	root := t.TempDir()
	extract(t, launcherImg, root)
	for _, d := range []string{"dev", "proc", "guest"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		copyFile(t, filepath.Join(guest, f), filepath.Join(root, "guest", f))
	}

	out, err := runInImage(t, root, nil, "/usr/bin/qemu-system-x86_64", "-version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "QEMU emulator version 7.2") {
		t.Fatalf("qemu-system-x86_64 -version in the image: %v\n%s", err, out)
	}
	// Debian builds some devices as modules QEMU loads from its module directory: the image
	// must carry those the launcher gives a machine (virtio video, USB redirection).
	out, err = runInImage(t, root, nil, "/usr/bin/qemu-system-x86_64", "-machine", "none", "-device", "help").CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-system-x86_64 -device help in the image: %v\n%s", err, out)
	}
	for _, dev := range []string{"virtio-vga", "virtio-gpu-pci", "usb-redir", "qemu-xhci", "usb-tablet", "bochs-display"} {
		if !strings.Contains(string(out), `name "`+dev+`"`) {
			t.Errorf("the image's QEMU has no device %s", dev)
		}
	}
	out, err = runInImage(t, root, nil, "/usr/bin/qemu-img", "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "qemu-img version 7.2") {
		t.Fatalf("qemu-img --version in the image: %v\n%s", err, out)
	}
	// swtpm finds its own library through its run path (/usr/lib/x86_64-linux-gnu/swtpm).
	out, err = runInImage(t, root, nil, launcher.DefaultSWTPM, "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "TPM emulator version") {
		t.Fatalf("swtpm --version in the image: %v\n%s", err, out)
	}

	// The test guest as test/guest/vmi.yaml describes it, from the image's view of the files,
	// with a VGA and its VNC server (the default graphics device) to need the VGA BIOS.
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := yaml.Unmarshal([]byte(imageGuestVMI), vmi); err != nil {
		t.Fatal(err)
	}
	m, err := translate.Machine(vmi, translate.Host{Emulation: true})
	if err != nil {
		t.Fatalf("machine description: %v", err)
	}
	desc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "machine.json"), desc, 0o644); err != nil {
		t.Fatal(err)
	}

	cmd := runInImage(t, root, []string{"HOME=/tmp"}, "/usr/bin/qvirt-launcher", "run", "--image-cache=", "-f", "/machine.json")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var console testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &console, &console
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	var gone atomic.Bool // the launcher exited: no banner will come
	go func() { err := cmd.Wait(); gone.Store(true); exited <- err }()
	t.Cleanup(func() {
		if !gone.Load() {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	testutil.Eventually(t, 2*time.Minute, "the guest's banner on the console", func() bool {
		if gone.Load() && !strings.Contains(console.String(), "QVIRT-GUEST-READY") {
			t.Fatalf("the launcher exited before the guest's banner\n%s", testutil.Tail(console.String(), 3000))
		}
		return strings.Contains(console.String(), "QVIRT-GUEST-READY")
	}, func() string { return testutil.Tail(console.String(), 3000) })
	fmt.Fprintln(stdin, "poweroff")
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the launcher from the image exited with %v after poweroff\n%s", err, testutil.Tail(console.String(), 3000))
		}
	case <-time.After(time.Minute):
		t.Fatalf("the guest did not power off within a minute\n%s", testutil.Tail(console.String(), 3000))
	}
}

const imageGuestVMI = `
apiVersion: qvirt.io/v1alpha1
kind: VirtualMachineInstance
metadata: {name: imageguest, namespace: default, uid: 5d1c1f0e-8b51-4c43-9d4a-2f1e7e0c0a01}
spec:
  domain:
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0 quiet panic=-1 qvirt.hostname=imageguest
        container: {image: "file:///guest", kernelPath: /vmlinuz, initrdPath: /initrd.img}
    devices:
      autoattachPodInterface: false
`

// runInImage is a command run as QEMU's user inside root, in a mount namespace of its own
// (started here, so its mounts vanish with it) where /dev and /proc are the host's, as a
// container runtime provides them.
func runInImage(t *testing.T, root string, env []string, argv ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, append([]string{root}, argv...)...)
	cmd.Env = append([]string{chrootHelperEnv + "=1", "PATH=/usr/bin:/bin"}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	return cmd
}

// chrootHelper is the test binary as runInImage's helper: args are the root and the command.
func chrootHelper(args []string) int {
	fail := func(what string, err error) int {
		fmt.Fprintf(os.Stderr, "chroot helper: %s: %v\n", what, err)
		return 111
	}
	root, argv := args[0], args[1:]
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fail("make mounts private", err)
	}
	if err := syscall.Mount("/dev", filepath.Join(root, "dev"), "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
		return fail("bind /dev", err)
	}
	if err := syscall.Mount("proc", filepath.Join(root, "proc"), "proc", 0, ""); err != nil {
		return fail("mount /proc", err)
	}
	if err := syscall.Chroot(root); err != nil {
		return fail("chroot", err)
	}
	if err := os.Chdir("/"); err != nil {
		return fail("chdir", err)
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fail("setgroups", err)
	}
	if err := syscall.Setgid(107); err != nil {
		return fail("setgid", err)
	}
	if err := syscall.Setuid(107); err != nil {
		return fail("setuid", err)
	}
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, chrootHelperEnv+"=") {
			env = append(env, e)
		}
	}
	return fail("exec "+argv[0], syscall.Exec(argv[0], argv, env))
}

// extract writes an image's flattened filesystem under root: regular files, directories and
// symlinks only (all the builder makes); a name leaving root fails the test.
func extract(t *testing.T, img v1.Image, root string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	r, err := os.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		switch h.Typeflag {
		case tar.TypeDir:
			if err := r.MkdirAll(name, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := r.Chmod(name, os.FileMode(h.Mode&0o777)|modeBits(h.Mode)); err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			if err := r.Symlink(h.Linkname, name); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			f, err := r.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode&0o777))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		default:
			t.Fatalf("image entry %s has type %c, which the builder never writes", h.Name, h.Typeflag)
		}
	}
}

func modeBits(m int64) os.FileMode {
	if m&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A lock that no longer matches what the images need or what apt can fetch fails with an error
// naming the package.
func TestLockProblemsNameThePackage(t *testing.T) {
	lock := testLock(t)
	f := testFetcher(t)
	f.NoUpdate = true // a version apt's index lacks stays missing; no apt-get update here
	without := func(pkg string) *Lock {
		l := &Lock{}
		for _, e := range lock.Entries {
			if e.Package != pkg {
				l.Entries = append(l.Entries, e)
			}
		}
		return l
	}
	changed := func(pkg string, change func(*LockEntry)) *Lock {
		l := &Lock{Entries: append([]LockEntry(nil), lock.Entries...)}
		for i := range l.Entries {
			if l.Entries[i].Package == pkg {
				change(&l.Entries[i])
			}
		}
		return l
	}
	ctx := context.Background()
	layer := func(l *Lock) error {
		_, err := qemuLayer(ctx, Options{Lock: l, Fetcher: f, Epoch: time.Unix(0, 0)})
		return err
	}

	err := layer(without("seabios"))
	if err == nil || !strings.Contains(err.Error(), "package seabios is not in the lock") {
		t.Errorf("lock without seabios: %v", err)
	}

	err = layer(without("libzstd1"))
	var missing *MissingLibraryError
	if !errors.As(err, &missing) || missing.Soname != "libzstd.so.1" {
		t.Errorf("lock without libzstd1: %v, want the missing libzstd.so.1 named", err)
	}

	err = layer(changed("seabios", func(e *LockEntry) { e.SHA256 = strings.Repeat("0", 64) }))
	var nf *NotFetchableError
	if !errors.As(err, &nf) || nf.Package != "seabios" || !strings.Contains(err.Error(), "the lock names 0000") {
		t.Errorf("lock with a wrong sha256 for seabios: %v", err)
	}

	err = layer(changed("seabios", func(e *LockEntry) { e.Version = "0.0.1-1" }))
	if !errors.As(err, &nf) || nf.Package != "seabios" || nf.Version != "0.0.1-1" {
		t.Errorf("lock with a version of seabios apt does not have: %v", err)
	}

	err = CheckLock(ctx, f, changed("libc6", func(e *LockEntry) { e.Version = "2.0-1" }))
	if !errors.As(err, &nf) || nf.Package != "libc6" {
		t.Errorf("check of a lock with a libc6 version apt does not have: %v", err)
	}
	if err := CheckLock(ctx, f, lock); err != nil {
		t.Errorf("check of the committed lock: %v", err)
	}
}

func TestParseLockErrors(t *testing.T) {
	sum := strings.Repeat("a", 64)
	for _, tc := range []struct{ in, want string }{
		{"seabios 1.16.2-1 all", "line 1: want 4 fields"},
		{"# c\nSeabios 1.16.2-1 all " + sum, `line 2: package "Seabios"`},
		{"seabios -1 all " + sum, `package seabios: version "-1"`},
		{"seabios 1.0 i386 " + sum, `architecture "i386"`},
		{"seabios 1.0 all abc", `sha256 "abc"`},
		{"seabios 1.0 all " + sum + "\nseabios 1.0 all " + sum, "line 2: package seabios is locked already on line 1"},
	} {
		_, err := ParseLock([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseLock(%q) = %v, want an error with %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseLock(f *testing.F) {
	f.Add([]byte("# x\nseabios 1.16.2-1 all " + strings.Repeat("a", 64) + "\nlibc6 2.36-9+deb12u14 amd64 " + strings.Repeat("b", 64) + "\n"))
	f.Add([]byte("a b c d\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ParseLock(data)
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if _, err := l.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := ParseLock(buf.Bytes())
		if err != nil {
			t.Fatalf("a written lock does not parse: %v\n%s", err, buf.Bytes())
		}
		if fmt.Sprint(again.Entries) != fmt.Sprint(l.Entries) {
			t.Fatalf("round trip changed the lock: %v, then %v", l.Entries, again.Entries)
		}
	})
}

// FuzzReadDeb feeds the .deb reader (ar members, control.tar, control fields) arbitrary bytes:
// it must return an error or parts, never panic or loop.
func FuzzReadDeb(f *testing.F) {
	f.Add(testDeb(f, "Package: x\nVersion: 1.0\nArchitecture: all\nDepends: a (>= 1), b | c, d:any\n"))
	f.Add([]byte("!<arch>\n"))
	f.Add([]byte("!<arch>\ndebian-binary   0           0     0     100644  4         `\n2.0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		parts, err := splitDeb(data)
		if err != nil {
			return
		}
		_, _ = readControl(parts)
		_ = tree{}.addDeb("fuzz", parts)
	})
}

// A small .deb built here: the reader against dpkg's layout without a real package.
func TestReadDeb(t *testing.T) {
	parts, err := splitDeb(testDeb(t, "Package: x\nVersion: 1:1.0-1\nArchitecture: amd64\nPre-Depends: libc6 (>= 2.34)\nDepends: a (>= 1), b | c,\n d:any, e [amd64]\nDescription: x\n y\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := readControl(parts)
	if err != nil {
		t.Fatal(err)
	}
	if c.Package != "x" || c.Version != "1:1.0-1" || c.Arch != "amd64" || strings.Join(c.Depends, ",") != "libc6,a,b,d,e" {
		t.Errorf("control %+v", c)
	}
	tr := tree{}
	if err := tr.addDeb("x", parts); err != nil {
		t.Fatal(err)
	}
	if e := tr["/usr/bin/x"]; e == nil || string(e.Data) != "#!x" || e.Mode != 0o755 {
		t.Errorf("/usr/bin/x = %+v (setuid bit must be gone)", e)
	}
	final, links, err := tr.resolve("/usr/bin/y")
	if err != nil || final != "/usr/bin/x" || len(links) != 1 {
		t.Errorf("resolve /usr/bin/y = %q %v %v", final, links, err)
	}
}

// testDeb makes an uncompressed .deb with the control file and /usr/bin/x plus symlink y.
func testDeb(t testing.TB, control string) []byte {
	tarOf := func(files ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range files {
			body := h.Linkname
			if h.Typeflag == tar.TypeSymlink {
				body = ""
			} else {
				h.Size = int64(len(body))
				h.Linkname = ""
			}
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
		}
		tw.Close()
		return b.Bytes()
	}
	ctl := tarOf(&tar.Header{Name: "./control", Mode: 0o644, Typeflag: tar.TypeReg, Linkname: control})
	data := tarOf(
		&tar.Header{Name: "./usr/", Mode: 0o755, Typeflag: tar.TypeDir},
		&tar.Header{Name: "./usr/bin/", Mode: 0o755, Typeflag: tar.TypeDir},
		&tar.Header{Name: "./usr/bin/x", Mode: 0o4755, Typeflag: tar.TypeReg, Linkname: "#!x"},
		&tar.Header{Name: "./usr/bin/y", Mode: 0o777, Typeflag: tar.TypeSymlink, Linkname: "x"},
	)
	var b bytes.Buffer
	b.WriteString(arMagic)
	for _, m := range []arMember{{"debian-binary", []byte("2.0\n")}, {"control.tar", ctl}, {"data.tar", data}} {
		fmt.Fprintf(&b, "%-16s%-12s%-6s%-6s%-8s%-10d`\n", m.Name, "0", "0", "0", "100644", len(m.Data))
		b.Write(m.Data)
		if len(m.Data)%2 == 1 {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}
