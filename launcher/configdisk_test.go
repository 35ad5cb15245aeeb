package launcher_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unicode/utf8"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
)

// writeAtomic lays files out in dir as the kubelet's atomic writer does for a Secret, ConfigMap,
// downwardAPI or projected volume: the files in a timestamped directory, ..data linking to it, and
// at the top one link per first path element through ..data.
func writeAtomic(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	ts := filepath.Join(dir, "..2026_12_02_10_00_00.123456789")
	for name, data := range files {
		p := filepath.Join(ts, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(ts)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.Symlink(filepath.Join("..data", e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

func configDisk(name, kind, label string, bus machine.Bus, cdrom bool) machine.Disk {
	return machine.Disk{Name: name, Bus: bus, CDROM: cdrom, ReadOnly: cdrom, Cache: machine.CacheNone, IO: machine.IOThreads,
		Source: machine.Source{Config: &machine.Config{Kind: kind, Label: label}}}
}

// TestConfigVolumeImage: a config volume's image holds the files the pod's volume holds, by the
// names a pod sees (the kubelet's ..data links followed, its own entries left out), subdirectories
// included, under the volume's label; it is read-only but behind a sata hard disk.
func TestConfigVolumeImage(t *testing.T) {
	vols, scratch := t.TempDir(), t.TempDir()
	files := map[string]string{
		"username":         "admin",
		"password":         "s3cr3t\n",
		"labels":           "app=\"web\"\ntier=\"front\"\n",
		"nested/deeper/cm": strings.Repeat("x", 5000),
	}
	if err := os.MkdirAll(filepath.Join(vols, "app-secret"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeAtomic(t, filepath.Join(vols, "app-secret"), files)
	res := launcher.HostResolver{ScratchDir: scratch, ConfigVolumes: vols}
	d := configDisk("app-secret", "secret", "APPSECRET", machine.BusVirtio, false)
	img, ferr := res.ResolveDisk(&d, t.TempDir(), machine.Path("machine.disks").Index(1))
	if ferr != nil {
		t.Fatal(ferr)
	}
	if img.Format != "raw" || !img.ReadOnly || filepath.Dir(img.Path) != scratch {
		t.Errorf("image %+v: want a read-only raw image in the scratch directory %s", img, scratch)
	}
	label, got := readISO(t, img.Path)
	if label != "APPSECRET" {
		t.Errorf("label %q, want APPSECRET", label)
	}
	if strings.Join(names(got), " ") != "labels nested/deeper/cm password username" {
		t.Fatalf("files %v", names(got))
	}
	for n, want := range files {
		if got[n] != want {
			t.Errorf("%s: %q, want %q", n, got[n], want)
		}
	}

	// A sata hard disk cannot be read-only in QEMU: the guest gets the launcher's copy writable.
	d = configDisk("app-secret", "secret", "cfgdata", machine.BusSATA, false)
	if img, ferr := res.ResolveDisk(&d, t.TempDir(), machine.Path("machine.disks").Index(1)); ferr != nil || img.ReadOnly {
		t.Errorf("sata disk: %+v, %v; want a writable image", img, ferr)
	}

	// An optional Secret that does not exist is an empty directory: an empty image, labelled.
	if err := os.MkdirAll(filepath.Join(vols, "absent"), 0o755); err != nil {
		t.Fatal(err)
	}
	d = configDisk("absent", "secret", "cfgdata", machine.BusSATA, true)
	img, ferr = res.ResolveDisk(&d, t.TempDir(), machine.Path("machine.disks").Index(1))
	if ferr != nil {
		t.Fatal(ferr)
	}
	if label, got := readISO(t, img.Path); label != "cfgdata" || len(got) != 0 {
		t.Errorf("empty volume: label %q, files %v", label, names(got))
	}
}

// TestConfigVolumeRefusals: what a tenant can put in its volume (links out of it, special files,
// too many or too large files, deep nesting) is refused naming the disk's source and the file,
// and nothing is left in the scratch directory.
func TestConfigVolumeRefusals(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(outside, []byte("not the tenant's"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		make   func(t *testing.T, dir string)
		label  string
		pod    bool
		field  string
		detail string
	}{
		{"a link out of the volume", func(t *testing.T, dir string) {
			if err := os.Symlink(outside, filepath.Join(dir, "key")); err != nil {
				t.Fatal(err)
			}
		}, "cfgdata", true, "machine.disks[0].source.config", "key"},
		{"a relative link out of the volume", func(t *testing.T, dir string) {
			if err := os.Symlink("../../../../../../../../../etc/passwd", filepath.Join(dir, "key")); err != nil {
				t.Fatal(err)
			}
		}, "cfgdata", true, "machine.disks[0].source.config", "key"},
		{"a named pipe", func(t *testing.T, dir string) {
			if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "cfgdata", true, "machine.disks[0].source.config", "pipe is a named pipe"},
		{"more bytes than a Secret holds", func(t *testing.T, dir string) {
			for _, n := range []string{"a", "b", "c"} {
				if err := os.WriteFile(filepath.Join(dir, n), make([]byte, 900<<10), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}, "cfgdata", true, "machine.disks[0].source.config", "c: the volume's files add up to more than 2097152 bytes"},
		{"too many files", func(t *testing.T, dir string) {
			for i := range 1100 {
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}, "cfgdata", true, "machine.disks[0].source.config", "more than 1024 files"},
		{"a file name longer than the image records", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, strings.Repeat("k", 129)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "cfgdata", true, "machine.disks[0].source.config", "longer than 128 bytes"},
		{"a directory whose name starts with a dot", func(t *testing.T, dir string) {
			if err := os.MkdirAll(filepath.Join(dir, ".config"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, ".config", "app"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "cfgdata", true, "machine.disks[0].source.config", ".config: a directory whose name starts with a dot"},
		{"a directory loop", func(t *testing.T, dir string) {
			if err := os.Symlink(".", filepath.Join(dir, "loop")); err != nil {
				t.Fatal(err)
			}
		}, "cfgdata", true, "machine.disks[0].source.config", "loop/loop/loop"},
		{"outside a launcher pod", func(*testing.T, string) {}, "cfgdata", false, "machine.disks[0].source.config", "needs a launcher pod"},
		{"a label longer than ISO 9660's", func(*testing.T, string) {}, strings.Repeat("L", 33), true, "machine.disks[0].source.config.label", "1 to 32"},
		{"a label with a control character", func(*testing.T, string) {}, "cfg\ndata", true, "machine.disks[0].source.config.label", "printable ASCII"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vols, scratch := t.TempDir(), t.TempDir()
			dir := filepath.Join(vols, "cfg")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			tc.make(t, dir)
			res := launcher.HostResolver{ScratchDir: scratch}
			if tc.pod {
				res.ConfigVolumes = vols
			}
			d := configDisk("cfg", "configMap", tc.label, machine.BusVirtio, false)
			_, ferr := res.ResolveDisk(&d, scratch, machine.Path("machine.disks").Index(0))
			var fe *machine.FieldError
			if !errors.As(error(ferr), &fe) || fe.Field != tc.field || !strings.Contains(fe.Error(), tc.detail) {
				t.Fatalf("want an error at %s saying %q, got %v", tc.field, tc.detail, ferr)
			}
			if ents, _ := os.ReadDir(scratch); len(ents) > 0 {
				t.Errorf("left behind in the scratch directory: %v", ents)
			}
		})
	}
}

// FuzzConfigVolume: whatever file names and contents a tenant's volume holds (any name the host's
// filesystem accepts), the image either holds each file under its name with its bytes, or the
// launcher refuses it with an error; it never panics nor loses or renames a file.
func FuzzConfigVolume(f *testing.F) {
	f.Add("username", []byte("admin"), "sub/dir/key", []byte{0, 1, 2})
	f.Add(".dockerconfigjson", []byte("{}"), "ca.crt", []byte("-----BEGIN CERTIFICATE-----\n"))
	f.Add(strings.Repeat("long-name-", 25), []byte("x"), "UPPER_lower.MiXeD", []byte(nil))
	f.Add("é ü 名前", []byte("unicode"), "a;1", []byte("version"))
	f.Fuzz(func(t *testing.T, name1 string, data1 []byte, name2 string, data2 []byte) {
		vols := t.TempDir()
		dir := filepath.Join(vols, "cfg")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// go-diskfs's reader (not the image, nor Linux) drops a file name's leading and trailing
		// dot and a ";1" suffix (an ISO 9660 version): compare with that applied.
		readerName := func(n string) string {
			dir, base := path.Split(n)
			return dir + strings.TrimPrefix(strings.TrimSuffix(strings.TrimSuffix(base, ";1"), "."), ".")
		}
		want := map[string]string{}
		for _, f := range []struct {
			name string
			data []byte
		}{{name1, data1}, {name2, data2}} {
			// Names a Kubernetes volume could hold: relative, clean, not the kubelet's own.
			if f.name == "" || !filepath.IsLocal(f.name) || filepath.Clean(f.name) != f.name || strings.HasPrefix(f.name, "..") ||
				strings.Contains(f.name, "/..") || !utf8.ValidString(f.name) {
				continue
			}
			// A name the reader reads as empty (";1", ".;1") cannot be looked up to be checked;
			// this kernel has no ISO 9660 to check it with Linux either.
			if _, base := path.Split(readerName(f.name)); base == "" {
				continue
			}
			p := filepath.Join(dir, f.name)
			if os.MkdirAll(filepath.Dir(p), 0o755) != nil || os.WriteFile(p, f.data, 0o644) != nil {
				continue
			}
			want[f.name] = string(f.data)
		}
		files, err := launcher.ConfigFiles(dir)
		if err != nil {
			return // refused, with an error: allowed (a name too long, a file where a directory is)
		}
		out := filepath.Join(t.TempDir(), "cfg.iso")
		if err := launcher.WriteISO(out, "cfgdata", files, filepath.Dir(out)); err != nil {
			return
		}
		_, got := readISO(t, out)
		recorded := rockRidgeNames(t, out)
		// The reader cannot tell apart names it reads alike ("0" and "0."): the image's own Rock
		// Ridge records are checked for those, the reader for the rest.
		readAs := map[string]int{}
		for n := range files {
			if !strings.Contains(n, `\`) {
				readAs[readerName(n)]++
			}
		}
		if len(got) != len(readAs) {
			t.Fatalf("image holds %v, the volume %d files", names(got), len(files))
		}
		for n, data := range files {
			if string(data) != want[n] {
				t.Fatalf("%q read as %q, written %q", n, data, want[n])
			}
			if recorded[path.Base(n)] == 0 {
				t.Fatalf("%q: no Rock Ridge name %q in the image", n, path.Base(n))
			}
			if readAs[readerName(n)] != 1 {
				continue
			}
			if g, ok := got[readerName(n)]; !ok || g != string(data) {
				t.Fatalf("%q: image holds %q (found %v), want %q; files %v", n, g, ok, data, names(got))
			}
		}
	})
}

// TestConfigVolumeKeepsNamesThatDifferByADot: "0" and "0." are two files in the image, each with
// its own bytes, though go-diskfs's reader reads both as "0".
func TestConfigVolumeKeepsNamesThatDifferByADot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "cfg.iso")
	files := map[string][]byte{"0": []byte("first"), "0.": []byte("second")}
	if err := launcher.WriteISO(out, "cfgdata", files, filepath.Dir(out)); err != nil {
		t.Fatal(err)
	}
	recorded := rockRidgeNames(t, out)
	if recorded["0"] != 1 || recorded["0."] != 1 {
		t.Fatalf("Rock Ridge names in the image: %v, want 0 and 0. once each", recorded)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range files {
		if !bytes.Contains(raw, data) {
			t.Fatalf("the image lost the file holding %q", data)
		}
	}
}

// rockRidgeNames counts the Rock Ridge alternate names (SUSP "NM" entries, version 1, no
// continuation) the image at p records. A plain scan: the test images are small and hold no
// other bytes that look like one.
func rockRidgeNames(t testing.TB, p string) map[string]int {
	t.Helper()
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for i := 0; i+5 <= len(raw); i++ {
		if raw[i] != 'N' || raw[i+1] != 'M' || raw[i+3] != 1 || raw[i+4] != 0 {
			continue
		}
		n := int(raw[i+2])
		if n < 5 || i+n > len(raw) {
			continue
		}
		out[string(raw[i+5:i+n])]++
	}
	return out
}
