package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/qvirt/qvirt/machine"
)

// TestResolveClaimAndHostFileRefusals: what the launcher refuses of a claim or a confined host
// disk names the field and says why; nothing is created where it must not be.
func TestResolveClaimAndHostFileRefusals(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "ns-a")
	other := filepath.Join(dir, "ns-b")
	for _, d := range []string{root, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(other, "secret.img"), []byte("b's"), 0o600); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("../ns-b/secret.img", filepath.Join(root, "link.img")))
	must(os.Symlink("../ns-b", filepath.Join(root, "dirlink")))
	must(os.Symlink("/nonexistent/x.img", filepath.Join(root, "dangling.img")))
	readOnlyClaim := t.TempDir()
	notBlock := filepath.Join(dir, "file")
	must(os.WriteFile(notBlock, nil, 0o600))

	disk := func(src machine.Source) *machine.Disk {
		return &machine.Disk{Name: "d", Bus: machine.BusVirtio, Cache: machine.CacheNone, IO: machine.IOThreads, Source: src}
	}
	host := func(path string, create int64) *machine.Disk {
		return disk(machine.Source{HostFile: &machine.HostFile{Path: path, Format: "raw", CreateBytes: create, Root: root}})
	}
	for name, tc := range map[string]struct {
		d    *machine.Disk
		want string
	}{
		"a link to another namespace's image": {host(filepath.Join(root, "link.img"), 0), "source.hostFile.path: invalid value \"" + root + "/link.img\": " + root + "/link.img leads outside " + root},
		"a file through a linked directory":   {host(filepath.Join(root, "dirlink", "new.img"), 1<<20), "leads outside"},
		"a dangling link created through":     {host(filepath.Join(root, "dangling.img"), 1<<20), "is a link to nothing"},
		"a path outside the root":             {host(filepath.Join(other, "secret.img"), 0), "is not under " + root},
		"a claim too small for its disk.img": {disk(machine.Source{Claim: &machine.Claim{Name: "tiny", Dir: t.TempDir(), ImageBytes: 1 << 50}}),
			"source.claim.imageBytes: invalid value \"1125899906842624\": claim tiny is too small"},
		"a read-only claim without disk.img": {func() *machine.Disk {
			d := disk(machine.Source{Claim: &machine.Claim{Name: "ro", Dir: readOnlyClaim, ImageBytes: 1 << 20}})
			d.ReadOnly = true
			return d
		}(), "claim ro has no disk.img, and a read-only claim cannot get one"},
		"a block claim that is a file":         {disk(machine.Source{Claim: &machine.Claim{Name: "blk", Device: notBlock}}), "source.claim.device: invalid value \"" + notBlock + "\": claim blk: not a block device"},
		"a claim with both a dir and a device": {disk(machine.Source{Claim: &machine.Claim{Name: "x", Dir: dir, Device: notBlock}}), "exactly one of dir and device"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := HostResolver{}.ResolveDisk(tc.d, t.TempDir(), machinePath.Child("disks").Index(0))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error with %q, got %v", tc.want, err)
			}
		})
	}
	for _, p := range []string{filepath.Join(other, "new.img"), "/nonexistent/x.img", filepath.Join(readOnlyClaim, machine.ClaimImage)} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s was created", p)
		}
	}

	img, err := HostResolver{}.ResolveDisk(host(filepath.Join(root, "new.img"), 1<<20), t.TempDir(), machinePath)
	if err != nil || img.Path != filepath.Join(root, "new.img") {
		t.Fatalf("a new image inside the root: %+v, %v", img, err)
	}
}

// FuzzWithinRoot: whatever path is asked for under a root holding links in and out, a path
// withinRoot accepts resolves inside the root.
func FuzzWithinRoot(f *testing.F) {
	dir := f.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{root, filepath.Join(root, "sub"), filepath.Join(dir, "out")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	for link, to := range map[string]string{"up": "..", "out": "../out", "abs": "/", "in": "sub", "self": "."} {
		if err := os.Symlink(to, filepath.Join(root, link)); err != nil {
			f.Fatal(err)
		}
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"sub/a.img", "up/out/a.img", "in/a.img", "abs/etc/passwd", "../out/a.img", "self/self/x", "sub/../../x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		got, err := withinRoot(root, root+"/"+rel)
		if err != nil {
			return
		}
		if got != realRoot && !strings.HasPrefix(got, realRoot+"/") {
			t.Fatalf("withinRoot(%q) = %q, outside %s", rel, got, realRoot)
		}
		if resolved, err := filepath.EvalSymlinks(filepath.Dir(got)); got != realRoot && err == nil && resolved != realRoot && !strings.HasPrefix(resolved, realRoot+"/") {
			t.Fatalf("withinRoot(%q) = %q, whose directory resolves to %s", rel, got, resolved)
		}
	})
}

// TestBlockDeviceNodes: a block claim's device is opened with QEMU's host_device driver (its file
// driver refuses a block device), an image file with the file driver.
func TestBlockDeviceNodes(t *testing.T) {
	d := machine.Disk{Name: "raw", Bus: machine.BusVirtio, Cache: machine.CacheNone, IO: machine.IOThreads}
	for _, tc := range []struct {
		img  DiskImage
		want string
	}{
		{DiskImage{Path: "/dev/qvirt-claims/raw", Format: "raw", Device: true}, `{"driver":"host_device","node-name":"file-raw","filename":"/dev/qvirt-claims/raw"`},
		{DiskImage{Path: "/var/run/qvirt/claims/raw/disk.img", Format: "raw"}, `{"driver":"file","node-name":"file-raw","filename":"/var/run/qvirt/claims/raw/disk.img"`},
	} {
		chain, errs := diskChain(machinePath, d.Name, &tc.img)
		if len(errs) > 0 {
			t.Fatal(errs)
		}
		got := jsonArg(blockNodes(&d, chain)[0])
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("file node %s, want it to start %s", got, tc.want)
		}
	}
}
