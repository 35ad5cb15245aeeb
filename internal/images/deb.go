package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// A .deb is an ar archive (deb(5)): debian-binary, control.tar[.xz|.zst|.gz] and
// data.tar[.xz|.zst|.gz], in that order. The builder reads it itself, so no dpkg is needed and
// nothing of the package's maintainer scripts ever runs.

const (
	arMagic     = "!<arch>\n"
	arHeaderLen = 60
	// maxMemberSize bounds one member: the largest package the images use is about 10 MB.
	maxMemberSize = 1 << 30
)

// arMember is one file of an ar archive.
type arMember struct {
	Name string
	Data []byte
}

// readAr splits an ar archive (the common System V/GNU format dpkg writes) into its members.
func readAr(data []byte) ([]arMember, error) {
	if !bytes.HasPrefix(data, []byte(arMagic)) {
		return nil, errors.New("not an ar archive (bad magic)")
	}
	var out []arMember
	rest := data[len(arMagic):]
	for len(rest) > 0 {
		if len(rest) < arHeaderLen {
			return nil, fmt.Errorf("ar member %d: truncated header", len(out)+1)
		}
		h := rest[:arHeaderLen]
		if string(h[58:60]) != "`\n" {
			return nil, fmt.Errorf("ar member %d: bad header terminator", len(out)+1)
		}
		name := strings.TrimRight(strings.TrimSpace(string(h[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(h[48:58])), 10, 64)
		if err != nil || size < 0 || size > maxMemberSize {
			return nil, fmt.Errorf("ar member %q: bad size %q", name, strings.TrimSpace(string(h[48:58])))
		}
		rest = rest[arHeaderLen:]
		if int64(len(rest)) < size {
			return nil, fmt.Errorf("ar member %q: %d bytes, archive has %d left", name, size, len(rest))
		}
		out = append(out, arMember{Name: name, Data: rest[:size]})
		rest = rest[size:]
		if size%2 == 1 && len(rest) > 0 { // members are padded to an even offset
			rest = rest[1:]
		}
	}
	return out, nil
}

// debParts are a .deb's two tar streams, still compressed, with their member names.
type debParts struct {
	controlName string
	control     []byte
	dataName    string
	data        []byte
}

func splitDeb(deb []byte) (debParts, error) {
	members, err := readAr(deb)
	if err != nil {
		return debParts{}, err
	}
	if len(members) < 3 || members[0].Name != "debian-binary" || !strings.HasPrefix(string(members[0].Data), "2.") {
		return debParts{}, errors.New("not a Debian binary package (no debian-binary 2.x first)")
	}
	var p debParts
	for _, m := range members[1:] {
		switch {
		case strings.HasPrefix(m.Name, "control.tar"):
			p.controlName, p.control = m.Name, m.Data
		case strings.HasPrefix(m.Name, "data.tar"):
			p.dataName, p.data = m.Name, m.Data
		}
	}
	if p.control == nil || p.data == nil {
		return debParts{}, errors.New("package has no control.tar or no data.tar member")
	}
	return p, nil
}

// decompress opens a member by its name's extension.
func decompress(name string, data []byte) (io.Reader, error) {
	r := bytes.NewReader(data)
	switch path.Ext(name) {
	case ".tar":
		return r, nil
	case ".xz":
		return xz.NewReader(r)
	case ".zst":
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	case ".gz":
		return gzip.NewReader(r)
	}
	return nil, fmt.Errorf("member %s: unknown compression", name)
}

// Control is what the builder reads of a package's control file.
type Control struct {
	Package, Version, Arch string
	// Depends are the packages named by Depends and Pre-Depends: each alternative's first
	// package, without version or architecture qualifiers.
	Depends []string
}

// readControl reads the control file of a .deb.
func readControl(p debParts) (Control, error) {
	r, err := decompress(p.controlName, p.control)
	if err != nil {
		return Control{}, err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return Control{}, errors.New("control.tar has no control file")
		}
		if err != nil {
			return Control{}, fmt.Errorf("read control.tar: %w", err)
		}
		if path.Clean(h.Name) != "control" {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, 1<<20))
		if err != nil {
			return Control{}, fmt.Errorf("read control: %w", err)
		}
		return parseControl(b)
	}
}

// parseControl reads the fields of a deb-control(5) paragraph that the builder uses.
func parseControl(b []byte) (Control, error) {
	fields := map[string]string{}
	last := ""
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last == "" {
				return Control{}, errors.New("control: continuation line before any field")
			}
			fields[last] += "\n" + strings.TrimSpace(line)
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			return Control{}, fmt.Errorf("control: line %q is not a field", line)
		}
		last = k
		fields[k] = strings.TrimSpace(v)
	}
	c := Control{Package: fields["Package"], Version: fields["Version"], Arch: fields["Architecture"]}
	if c.Package == "" || c.Version == "" || c.Arch == "" {
		return Control{}, errors.New("control: Package, Version or Architecture missing")
	}
	for _, k := range []string{"Pre-Depends", "Depends"} {
		for _, dep := range strings.Split(fields[k], ",") {
			first, _, _ := strings.Cut(dep, "|")
			first = strings.TrimSpace(first)
			if i := strings.IndexAny(first, " (:["); i >= 0 {
				first = first[:i]
			}
			if first != "" {
				c.Depends = append(c.Depends, first)
			}
		}
	}
	return c, nil
}
