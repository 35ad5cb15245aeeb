package imagepull

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// Limits on what one image may unpack to. Layer tars are untrusted input: a registry (or whoever
// pushed to it) chooses every byte.
const (
	maxUnpackBytes   = 32 << 30 // 32 GiB of file content: room for a containerDisk
	maxUnpackEntries = 1 << 20
)

// UnsafeImageError is an image whose filesystem tries to reach outside its root: an entry named
// with "..", a symbolic link that is absolute or climbs with "..", a write through a symbolic link,
// or a hard link to something that is not a regular file of the image.
type UnsafeImageError struct {
	Entry  string
	Reason string
}

func (e *UnsafeImageError) Error() string {
	return fmt.Sprintf("image entry %q refused: %s", e.Entry, e.Reason)
}

// unpackTar extracts a flattened image filesystem (one tar stream, whiteouts already applied, as
// go-containerregistry's mutate.Extract writes it) into dir, which must exist and be empty, with
// at most limit bytes of file content (sparse entries count at their full size).
//
// The contract, checked by FuzzUnpackTar: nothing is created, changed or opened outside dir, and
// every symbolic link left under dir resolves inside dir. To keep that simple to prove, links are
// held to a rule stricter than container runtimes: a symbolic link target must be relative and free
// of ".." (it can only point down from its own directory), no entry is written through a symbolic
// link, and hard links name regular files. Everything goes through an os.Root as a second line of
// defence. Ownership is not kept (the launcher is unprivileged); permissions are reduced to rwx
// bits for the owner and read/execute for others; device nodes and FIFOs are skipped: a VM image
// (kernel, initrd, disk) has no use for them.
func unpackTar(r io.Reader, dir string, limit int64) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	u := unpacker{root: root, budget: limit, limit: limit}
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read image filesystem: %w", err)
		}
		if n >= maxUnpackEntries {
			return fmt.Errorf("image has more than %d entries", maxUnpackEntries)
		}
		if err := u.entry(hdr, tr); err != nil {
			return err
		}
	}
	return u.hardLinks()
}

type unpacker struct {
	root   *os.Root
	budget int64 // bytes of file content left of limit
	limit  int64
	// links are hard links, made once every file is there: mutate.Extract writes upper layers
	// first, so a link can come before the file it names.
	links []*tar.Header
}

func (u *unpacker) entry(hdr *tar.Header, body io.Reader) error {
	name, err := entryPath(hdr.Name)
	if err != nil || name == "." {
		return err
	}
	if err := u.noSymlinkIn(path.Dir(name), hdr.Name); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(name)
	case tar.TypeReg:
		return u.file(name, hdr, body)
	case tar.TypeSymlink:
		return u.symlink(name, hdr.Linkname, hdr.Name)
	case tar.TypeLink:
		u.links = append(u.links, hdr)
		return nil
	}
	return nil
}

// entryPath is a tar entry's name relative to the image root; "." for the root itself.
func entryPath(name string) (string, error) {
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", &UnsafeImageError{Entry: name, Reason: "the path climbs out with .."}
		}
	}
	if strings.ContainsRune(name, 0) {
		return "", &UnsafeImageError{Entry: name, Reason: "NUL in the path"}
	}
	clean := strings.TrimPrefix(path.Clean("/"+name), "/")
	if clean == "" {
		return ".", nil
	}
	return clean, nil
}

// noSymlinkIn makes the parent directories of an entry, refusing to go through a symbolic link.
func (u *unpacker) noSymlinkIn(dir, entry string) error {
	if dir == "." {
		return nil
	}
	p := ""
	for c := range strings.SplitSeq(dir, "/") {
		p = path.Join(p, c)
		st, err := u.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := u.root.Mkdir(p, 0o755); err != nil {
				return fmt.Errorf("unpack %s: %w", entry, err)
			}
		case err != nil:
			return fmt.Errorf("unpack %s: %w", entry, err)
		case st.Mode()&fs.ModeSymlink != 0:
			return &UnsafeImageError{Entry: entry, Reason: "written through the symbolic link /" + p}
		case !st.IsDir():
			return &UnsafeImageError{Entry: entry, Reason: "/" + p + " is not a directory"}
		}
	}
	return nil
}

func (u *unpacker) dir(name string) error {
	st, err := u.root.Lstat(name)
	if err == nil {
		if !st.IsDir() {
			return &UnsafeImageError{Entry: name, Reason: "a directory replaces a file or link"}
		}
		return nil
	}
	return u.root.Mkdir(name, 0o755)
}

func (u *unpacker) file(name string, hdr *tar.Header, body io.Reader) error {
	if hdr.Size > u.budget {
		return fmt.Errorf("image is larger than %d bytes", u.limit)
	}
	if err := u.replace(name); err != nil {
		return err
	}
	// O_EXCL: never open through a link someone placed there.
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode(hdr.Mode))
	if err != nil {
		return fmt.Errorf("unpack %s: %w", name, err)
	}
	n, err := io.Copy(f, io.LimitReader(body, hdr.Size))
	u.budget -= n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("unpack %s: %w", name, err)
	}
	return nil
}

// replace removes a non-directory already at name (a later entry wins, as in a layer).
func (u *unpacker) replace(name string) error {
	st, err := u.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case st.IsDir():
		return &UnsafeImageError{Entry: name, Reason: "a file replaces a directory"}
	}
	return u.root.Remove(name)
}

func fileMode(m int64) fs.FileMode {
	if m&0o111 != 0 {
		return 0o755
	}
	return 0o644
}

func (u *unpacker) symlink(name, target, entry string) error {
	if err := checkLinkTarget(target); err != nil {
		return &UnsafeImageError{Entry: entry, Reason: err.Error()}
	}
	if err := u.replace(name); err != nil {
		return err
	}
	return u.root.Symlink(target, name)
}

// checkLinkTarget allows only relative targets that never climb: they stay below the link's own
// directory whatever other links they pass through, since those obey the same rule.
func checkLinkTarget(target string) error {
	switch {
	case target == "":
		return errors.New("empty symbolic link target")
	case strings.ContainsRune(target, 0):
		return errors.New("NUL in the symbolic link target")
	case path.IsAbs(target):
		return fmt.Errorf("absolute symbolic link to %s", target)
	}
	for c := range strings.SplitSeq(target, "/") {
		if c == ".." {
			return fmt.Errorf("symbolic link to %s climbs with a .. component", target)
		}
	}
	return nil
}

// hardLinks makes the hard links once every file exists; each must name a regular file reached
// without following a symbolic link.
func (u *unpacker) hardLinks() error {
	for _, hdr := range u.links {
		name, err := entryPath(hdr.Name)
		if err != nil {
			return err
		}
		target, err := entryPath(hdr.Linkname)
		if err != nil {
			return &UnsafeImageError{Entry: hdr.Name, Reason: "hard link target climbs out with .."}
		}
		if err := u.noSymlinkIn(path.Dir(target), hdr.Name); err != nil {
			return err
		}
		st, err := u.root.Lstat(target)
		if err != nil || !st.Mode().IsRegular() {
			return &UnsafeImageError{Entry: hdr.Name, Reason: "hard link to /" + target + ", which is not a regular file of the image"}
		}
		if name == target {
			continue
		}
		if err := u.replace(name); err != nil {
			return err
		}
		if err := u.root.Link(target, name); err != nil {
			return fmt.Errorf("unpack %s: %w", hdr.Name, err)
		}
	}
	return nil
}
