package images

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strings"
)

// LockEntry pins one Debian package: the exact version apt must fetch and the SHA-256 of its .deb.
type LockEntry struct {
	Package string
	Version string
	Arch    string
	SHA256  string
}

// Lock is the lock file: the Debian packages the images are built from, sorted by package name.
type Lock struct {
	Entries []LockEntry
}

// Get is the entry of pkg, if the lock has one.
func (l *Lock) Get(pkg string) (LockEntry, bool) {
	i, ok := slices.BinarySearchFunc(l.Entries, pkg, func(e LockEntry, p string) int { return strings.Compare(e.Package, p) })
	if !ok {
		return LockEntry{}, false
	}
	return l.Entries[i], true
}

const lockHeader = `# Debian packages the qvirt images are built from: package version architecture sha256.
# Written by 'make images-lock' (qvirt-images lock); 'make images' fetches exactly these with apt.
`

// ParseLock reads a lock file: one "package version arch sha256" line per package, '#' comments
// and blank lines ignored. Every problem is an error naming the line.
func ParseLock(data []byte) (*Lock, error) {
	l := &Lock{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	seen := map[string]int{}
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 {
			return nil, fmt.Errorf("lock line %d: want 4 fields (package version architecture sha256), have %d", n, len(f))
		}
		e := LockEntry{Package: f[0], Version: f[1], Arch: f[2], SHA256: f[3]}
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("lock line %d: %w", n, err)
		}
		if prev, dup := seen[e.Package]; dup {
			return nil, fmt.Errorf("lock line %d: package %s is locked already on line %d", n, e.Package, prev)
		}
		seen[e.Package] = n
		l.Entries = append(l.Entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read lock: %w", err)
	}
	l.sort()
	return l, nil
}

func (l *Lock) sort() {
	slices.SortFunc(l.Entries, func(a, b LockEntry) int { return strings.Compare(a.Package, b.Package) })
}

// validate checks the fields against Debian's rules (policy 5.6.1, 5.6.12) as far as a name on
// an apt-get command line and a cache file name need: nothing that could be an option or a path.
func (e LockEntry) validate() error {
	if !isPackageName(e.Package) {
		return fmt.Errorf("package %q: not a Debian package name (lower-case letters, digits and +-. , starting with a letter or digit)", e.Package)
	}
	if !isVersion(e.Version) {
		return fmt.Errorf("package %s: version %q is not a Debian version", e.Package, e.Version)
	}
	if e.Arch != "all" && e.Arch != "amd64" {
		return fmt.Errorf("package %s: architecture %q: want amd64 or all", e.Package, e.Arch)
	}
	if b, err := hex.DecodeString(e.SHA256); err != nil || len(b) != 32 || strings.ToLower(e.SHA256) != e.SHA256 {
		return fmt.Errorf("package %s: sha256 %q is not 64 lower-case hex digits", e.Package, e.SHA256)
	}
	return nil
}

func isPackageName(s string) bool {
	if len(s) < 2 || !isLowerAlnum(s[0]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isLowerAlnum(c) && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func isVersion(s string) bool {
	if s == "" || !(s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isLowerAlnum(c) && !(c >= 'A' && c <= 'Z') && !strings.ContainsRune(".+-:~", rune(c)) {
			return false
		}
	}
	return true
}

func isLowerAlnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }

// WriteTo writes the lock in the form ParseLock reads.
func (l *Lock) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	b.WriteString(lockHeader)
	for _, e := range l.Entries {
		fmt.Fprintf(&b, "%s %s %s %s\n", e.Package, e.Version, e.Arch, e.SHA256)
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}
