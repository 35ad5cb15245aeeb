package imagepull

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entry is one tar entry in a test layer; typ is a tar.Type* flag.
type entry struct {
	typ        byte
	name, link string
	body       string
}

func tarOf(t testing.TB, entries []entry) []byte {
	t.Helper()
	b, err := buildTar(entries)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func buildTar(entries []entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: 0o644}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// sandbox is a directory with the extraction root and a sibling that must stay untouched.
type sandbox struct{ base, root, victim string }

func newSandbox(t testing.TB) sandbox {
	t.Helper()
	base := t.TempDir()
	s := sandbox{base: base, root: filepath.Join(base, "root"), victim: filepath.Join(base, "outside", "victim")}
	if err := os.MkdirAll(s.root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(s.victim), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.victim, []byte("victim"), 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// check fails when anything outside the root changed or a link under the root leads out of it.
func (s sandbox) check(t testing.TB) {
	t.Helper()
	top, _ := os.ReadDir(s.base)
	if len(top) != 2 {
		t.Fatalf("the sandbox holds %d entries beside the root, want only outside/", len(top)-1)
	}
	out, _ := os.ReadDir(filepath.Dir(s.victim))
	if b, err := os.ReadFile(s.victim); err != nil || string(b) != "victim" || len(out) != 1 {
		t.Fatalf("a file outside the root changed: %q %v, %d entries", b, err, len(out))
	}
	_ = filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return nil // dangling or a loop: leads nowhere
		}
		if rel, _ := filepath.Rel(s.root, real); rel == ".." || strings.HasPrefix(rel, "../") {
			t.Fatalf("link %s leads out of the root to %s", p, real)
		}
		return nil
	})
}

func TestUnpackTar(t *testing.T) {
	cases := []struct {
		name    string
		entries []entry
		unsafe  bool
		files   map[string]string // path → content after unpacking
	}{
		{name: "kernelBoot layout", entries: []entry{
			{typ: tar.TypeDir, name: "boot/"},
			{typ: tar.TypeReg, name: "boot/vmlinuz", body: "kernel"},
			{typ: tar.TypeReg, name: "./boot/initrd.img", body: "initrd"},
			{typ: tar.TypeSymlink, name: "vmlinuz", link: "boot/vmlinuz"},
			{typ: tar.TypeLink, name: "boot/kernel", link: "boot/vmlinuz"},
		}, files: map[string]string{"boot/vmlinuz": "kernel", "boot/initrd.img": "initrd", "vmlinuz": "kernel", "boot/kernel": "kernel"}},
		{name: "file without its directory entry", entries: []entry{{typ: tar.TypeReg, name: "disk/a.qcow2", body: "q"}},
			files: map[string]string{"disk/a.qcow2": "q"}},
		{name: "a later entry replaces a file", entries: []entry{
			{typ: tar.TypeReg, name: "f", body: "1"}, {typ: tar.TypeReg, name: "f", body: "2"},
		}, files: map[string]string{"f": "2"}},
		{name: "dot-dot path", entries: []entry{{typ: tar.TypeReg, name: "../outside/victim", body: "x"}}, unsafe: true},
		{name: "dot-dot inside a path", entries: []entry{{typ: tar.TypeReg, name: "boot/../../x", body: "x"}}, unsafe: true},
		{name: "absolute path stays inside", entries: []entry{{typ: tar.TypeReg, name: "/boot/vmlinuz", body: "k"}},
			files: map[string]string{"boot/vmlinuz": "k"}},
		{name: "absolute symlink", entries: []entry{{typ: tar.TypeSymlink, name: "boot/vmlinuz", link: "/etc/shadow"}}, unsafe: true},
		{name: "climbing symlink", entries: []entry{{typ: tar.TypeSymlink, name: "boot", link: "../outside"}}, unsafe: true},
		{name: "write through a symlink", entries: []entry{
			{typ: tar.TypeSymlink, name: "d", link: "e"},
			{typ: tar.TypeDir, name: "e/"},
			{typ: tar.TypeReg, name: "d/f", body: "x"},
		}, unsafe: true},
		{name: "file over a symlink replaces the link", entries: []entry{
			{typ: tar.TypeSymlink, name: "f", link: "g"},
			{typ: tar.TypeReg, name: "f", body: "x"},
		}, files: map[string]string{"f": "x"}},
		{name: "hard link out of the root", entries: []entry{{typ: tar.TypeLink, name: "h", link: "../outside/victim"}}, unsafe: true},
		{name: "hard link to a symlink", entries: []entry{
			{typ: tar.TypeSymlink, name: "s", link: "t"},
			{typ: tar.TypeLink, name: "h", link: "s"},
		}, unsafe: true},
		{name: "file replacing a directory", entries: []entry{
			{typ: tar.TypeDir, name: "d/"}, {typ: tar.TypeReg, name: "d", body: "x"},
		}, unsafe: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newSandbox(t)
			err := unpackTar(bytes.NewReader(tarOf(t, c.entries)), s.root, 1<<20)
			s.check(t)
			var ue *UnsafeImageError
			if c.unsafe != errors.As(err, &ue) {
				t.Fatalf("unpack: %v, want an UnsafeImageError: %v", err, c.unsafe)
			}
			if !c.unsafe && err != nil {
				t.Fatal(err)
			}
			for p, want := range c.files {
				if b, err := os.ReadFile(filepath.Join(s.root, p)); err != nil || string(b) != want {
					t.Errorf("%s: %q %v, want %q", p, b, err, want)
				}
			}
		})
	}
}

// FuzzUnpackTar feeds layers built from fuzzed entry lists ("type name link" per line, type one of
// f d l h) and raw fuzzed tars to unpackTar: whatever it returns, nothing outside the root may
// change and no link under the root may lead out of it.
func FuzzUnpackTar(f *testing.F) {
	f.Add("d boot\nf boot/vmlinuz\nl vmlinuz boot/vmlinuz\nh k boot/vmlinuz", []byte(nil))
	f.Add("l a .\nl a/b ..\nf a/b/c", []byte(nil))
	f.Add("l d ../outside\nf d/victim", []byte(nil))
	f.Add("l x /\nf x/etc/passwd\nh y ../outside/victim", []byte(nil))
	f.Add("d a\nl a/s .\nl a/s/t ../../..\nf a/s/t/outside/victim", []byte(nil))
	f.Add("", tarOf(f, []entry{{typ: tar.TypeSymlink, name: "boot", link: "../outside"}, {typ: tar.TypeReg, name: "boot/victim", body: "x"}}))
	f.Fuzz(func(t *testing.T, spec string, raw []byte) {
		s := newSandbox(t)
		data := raw
		if len(raw) == 0 {
			var err error
			if data, err = buildTar(parseSpec(spec)); err != nil {
				return // not expressible as a tar
			}
		}
		_ = unpackTar(bytes.NewReader(data), s.root, 1<<20)
		s.check(t)
	})
}

// parseSpec turns "type name link" lines into entries; unparsable lines are dropped.
func parseSpec(spec string) []entry {
	var out []entry
	for line := range strings.SplitSeq(spec, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		e := entry{name: f[1], body: "x"}
		if len(f) > 2 {
			e.link = f[2]
		}
		switch f[0] {
		case "f":
			e.typ = tar.TypeReg
		case "d":
			e.typ = tar.TypeDir
		case "l":
			e.typ = tar.TypeSymlink
		case "h":
			e.typ = tar.TypeLink
		default:
			continue
		}
		if e.typ != tar.TypeReg {
			e.body = ""
		}
		out = append(out, e)
	}
	return out
}
