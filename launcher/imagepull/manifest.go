package imagepull

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// manifest records an unpacked image as it was when unpacked: every entry of its filesystem with
// a stamp, and the content hash of every regular file.
type manifest struct {
	Digest  string      `json:"digest"`
	Size    int64       `json:"size"` // bytes of regular files
	Entries []fileEntry `json:"entries"`
}

// fileEntry is one file, directory or link of the image. The stamp (inode, mode, size, mtime, ctime,
// link target) is what each use compares; ctime changes with any write, chmod or rename and
// cannot be set back, so an equal stamp means untouched contents.
type fileEntry struct {
	Path   string `json:"path"`
	Mode   uint32 `json:"mode"`
	Size   int64  `json:"size"`
	Inode  uint64 `json:"inode"`
	Mtime  int64  `json:"mtime"`
	Ctime  int64  `json:"ctime"`
	Link   string `json:"link,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

const manifestName = "manifest.json"

// newManifest stamps and hashes rootfs, just unpacked.
func newManifest(digest, rootfs string) (*manifest, error) {
	entries, err := scan(rootfs, true)
	if err != nil {
		return nil, err
	}
	m := &manifest{Digest: digest, Entries: entries}
	for _, e := range entries {
		if fs.FileMode(e.Mode).IsRegular() {
			m.Size += e.Size
		}
	}
	return m, nil
}

func readManifest(entryDir string) (*manifest, error) {
	b, err := os.ReadFile(filepath.Join(entryDir, manifestName))
	if err != nil {
		return nil, err
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("manifest of %s: %w", entryDir, err)
	}
	return &m, nil
}

func (m *manifest) write(entryDir string) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(entryDir, manifestName), b)
}

// verify compares rootfs with the manifest: the stamps of its entries, and with rehash the content
// of every regular file too.
func (m *manifest) verify(rootfs string, rehash bool) error {
	got, err := scan(rootfs, rehash)
	if err != nil {
		return &TamperedError{Digest: m.Digest, Path: "/", Reason: err.Error()}
	}
	if len(got) != len(m.Entries) {
		return &TamperedError{Digest: m.Digest, Path: "/", Reason: fmt.Sprintf("holds %d entries, %d when unpacked", len(got), len(m.Entries))}
	}
	for i, want := range m.Entries {
		g := got[i]
		if !rehash {
			g.SHA256 = want.SHA256
		}
		if g != want {
			return &TamperedError{Digest: m.Digest, Path: "/" + want.Path, Reason: describeChange(want, g)}
		}
	}
	return nil
}

func describeChange(want, got fileEntry) string {
	switch {
	case want.Path != got.Path:
		return fmt.Sprintf("is gone or another entry took its place (%s)", got.Path)
	case want.SHA256 != got.SHA256:
		return "has other contents"
	case want.Size != got.Size:
		return fmt.Sprintf("is %d bytes, %d when unpacked", got.Size, want.Size)
	}
	return "was modified (stamp differs)"
}

// scan lists rootfs's entries in lexical order, without following links, hashing regular files
// when asked.
func scan(rootfs string, hash bool) ([]fileEntry, error) {
	var out []fileEntry
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rootfs, path)
		if err != nil {
			return err
		}
		e, err := stamp(path, filepath.ToSlash(rel))
		if err != nil {
			return err
		}
		if hash && fs.FileMode(e.Mode).IsRegular() {
			if e.SHA256, err = fileSHA256(path); err != nil {
				return err
			}
		}
		out = append(out, e)
		return nil
	})
	slices.SortFunc(out, func(a, b fileEntry) int {
		switch {
		case a.Path < b.Path:
			return -1
		case a.Path > b.Path:
			return 1
		}
		return 0
	})
	return out, err
}

func stamp(path, rel string) (fileEntry, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return fileEntry{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileEntry{}, fmt.Errorf("%s: no stat", path)
	}
	e := fileEntry{Path: rel, Mode: uint32(fi.Mode()), Size: fi.Size(), Inode: st.Ino,
		Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano()}
	if fi.IsDir() {
		e.Size = 0 // grows with entries the stamp of each fileEntry already covers
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if e.Link, err = os.Readlink(path); err != nil {
			return fileEntry{}, err
		}
	}
	return e, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
