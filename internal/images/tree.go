package images

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
)

// entryType is what a path in a tree or a layer is.
type entryType byte

const (
	typeDir entryType = iota + 1
	typeFile
	typeSymlink
)

// entry is one path of a file tree: the unpacked packages, or a layer's content.
type entry struct {
	Type entryType
	// Mode is the permission bits only: setuid, setgid and sticky bits of packaged files are
	// dropped (the images run nothing that needs them); /tmp gets its sticky bit from layerTar.
	Mode int64
	Link string // symlink target, as packaged
	Data []byte
	Pkg  string // the package it came from, for messages
}

// tree is the union of the unpacked packages' files, by absolute clean path.
type tree map[string]*entry

// maxUnpacked bounds one package's unpacked size (the largest the images use is about 40 MB).
const maxUnpacked = 1 << 30

// addDeb unpacks a package's data.tar into t. Device nodes, fifos and the like are skipped; a
// hard link becomes a copy of the file it names. The first package to bring a file keeps it.
func (t tree) addDeb(pkg string, p debParts) error {
	r, err := decompress(p.dataName, p.data)
	if err != nil {
		return fmt.Errorf("package %s: %w", pkg, err)
	}
	tr := tar.NewReader(r)
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("package %s: read %s: %w", pkg, p.dataName, err)
		}
		name := path.Join("/", h.Name)
		e := &entry{Mode: h.Mode & 0o777, Pkg: pkg}
		switch h.Typeflag {
		case tar.TypeDir:
			e.Type = typeDir
		case tar.TypeSymlink:
			e.Type, e.Link = typeSymlink, h.Linkname
		case tar.TypeReg:
			total += h.Size
			if total > maxUnpacked {
				return fmt.Errorf("package %s: more than %d bytes unpacked", pkg, maxUnpacked)
			}
			e.Type = typeFile
			if e.Data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("package %s: read %s: %w", pkg, name, err)
			}
		case tar.TypeLink:
			target, ok := t[path.Join("/", h.Linkname)]
			if !ok || target.Type != typeFile {
				return fmt.Errorf("package %s: hard link %s to %s, which is no file before it", pkg, name, h.Linkname)
			}
			e.Type, e.Data = typeFile, target.Data
		default:
			continue
		}
		if _, exists := t[name]; !exists {
			t[name] = e
		}
	}
}

// maxLinks bounds symlink hops in one lookup, as the kernel's ELOOP does.
const maxLinks = 40

// resolve follows symlinks in every component of p and returns the final path with the symlinks
// it went through (each of which an image must carry for p to work).
func (t tree) resolve(p string) (string, []string, error) {
	var links []string
	for hops := 0; ; {
		p = path.Clean(p)
		comps := strings.Split(strings.TrimPrefix(p, "/"), "/")
		cur, redirected := "/", false
		for i, c := range comps {
			next := path.Join(cur, c)
			e, ok := t[next]
			if !ok {
				return "", nil, fmt.Errorf("%s: %s does not exist", p, next)
			}
			if e.Type != typeSymlink {
				cur = next
				continue
			}
			if hops++; hops > maxLinks {
				return "", nil, fmt.Errorf("%s: too many levels of symbolic links", p)
			}
			links = append(links, next)
			target := e.Link
			if !path.IsAbs(target) {
				target = path.Join(cur, target)
			}
			p = path.Join(append([]string{target}, comps[i+1:]...)...)
			redirected = true
			break
		}
		if !redirected {
			return p, links, nil
		}
	}
}

// libDirs are where the dynamic loader looks for a library without a path (Debian's multiarch
// directories first, then the traditional ones).
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// MissingLibraryError is a shared library that a selected ELF file needs and no unpacked
// package provides.
type MissingLibraryError struct {
	Soname, NeededBy, Package string
	// RunPath is where the needing file asks the loader to look first (runPath).
	RunPath []string
}

func (e *MissingLibraryError) Error() string {
	return fmt.Sprintf("library %s, needed by %s (package %s), is in none of the locked packages", e.Soname, e.NeededBy, e.Package)
}

// selection is a set of paths of a tree that an image carries, closed under symlinks, parent
// directories and the shared libraries (plus dynamic loader) its ELF files need.
type selection struct {
	t       tree
	paths   map[string]bool
	missing []*MissingLibraryError
}

func newSelection(t tree) *selection { return &selection{t: t, paths: map[string]bool{}} }

// add selects p (with what it needs); a path that does not exist is an error.
func (s *selection) add(p string) error {
	final, links, err := s.t.resolve(p)
	if err != nil {
		return err
	}
	for _, l := range links {
		s.paths[l] = true
	}
	if s.paths[final] {
		return nil
	}
	s.paths[final] = true
	e := s.t[final]
	if e.Type != typeFile {
		return nil
	}
	return s.addNeeded(final, e)
}

// addNeeded selects the program interpreter and the DT_NEEDED libraries of an ELF file.
func (s *selection) addNeeded(p string, e *entry) error {
	if !bytes.HasPrefix(e.Data, []byte(elf.ELFMAG)) {
		return nil
	}
	f, err := elf.NewFile(bytes.NewReader(e.Data))
	if err != nil {
		return fmt.Errorf("%s (package %s): %w", p, e.Pkg, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(prog.Open())
		if err != nil {
			return fmt.Errorf("%s: read its interpreter: %w", p, err)
		}
		interp := string(bytes.TrimRight(b, "\x00"))
		if !s.t.exists(interp) {
			s.missing = append(s.missing, &MissingLibraryError{Soname: interp, NeededBy: p, Package: e.Pkg})
			continue
		}
		if err := s.add(interp); err != nil {
			return fmt.Errorf("%s: interpreter: %w", p, err)
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return fmt.Errorf("%s: read DT_NEEDED: %w", p, err)
	}
	dirs := runPath(f, p)
	for _, so := range needed {
		lib, ok := s.findLib(so, dirs)
		if !ok {
			s.missing = append(s.missing, &MissingLibraryError{Soname: so, NeededBy: p, Package: e.Pkg, RunPath: dirs})
			continue
		}
		if err := s.add(lib); err != nil {
			return err
		}
	}
	return nil
}

// runPath is the directories an ELF file at p names for its libraries (DT_RUNPATH, else
// DT_RPATH, $ORIGIN expanded), which the loader searches before libDirs: swtpm finds its own
// library in /usr/lib/x86_64-linux-gnu/swtpm that way.
func runPath(f *elf.File, p string) []string {
	paths, _ := f.DynString(elf.DT_RUNPATH)
	if len(paths) == 0 {
		paths, _ = f.DynString(elf.DT_RPATH)
	}
	var dirs []string
	for _, list := range paths {
		for _, d := range strings.Split(list, ":") {
			d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", path.Dir(p)), "$ORIGIN", path.Dir(p))
			if path.IsAbs(d) {
				dirs = append(dirs, path.Clean(d))
			}
		}
	}
	return dirs
}

// findLib is where the loader finds soname: in dirs (the needing file's run path), then libDirs.
func (s *selection) findLib(soname string, dirs []string) (string, bool) {
	if strings.Contains(soname, "/") {
		return soname, s.t.exists(soname)
	}
	for _, d := range append(dirs, libDirs...) {
		if p := path.Join(d, soname); s.t.exists(p) {
			return p, true
		}
	}
	return "", false
}

// exists tells whether p resolves to a regular file.
func (t tree) exists(p string) bool {
	final, _, err := t.resolve(p)
	return err == nil && t[final].Type == typeFile
}

// entries are the selected paths' entries, sorted by path.
func (s *selection) entries() map[string]*entry {
	out := make(map[string]*entry, len(s.paths))
	for p := range s.paths {
		out[p] = s.t[p]
	}
	return out
}

// missingErr is the first missing library, in a stable order, or nil.
func (s *selection) missingErr() error {
	if len(s.missing) == 0 {
		return nil
	}
	slices.SortFunc(s.missing, func(a, b *MissingLibraryError) int {
		return strings.Compare(a.Soname+a.NeededBy, b.Soname+b.NeededBy)
	})
	return s.missing[0]
}
