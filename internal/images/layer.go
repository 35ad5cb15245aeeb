package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"slices"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layerTar writes files as a tar archive that depends on nothing but their paths, types, modes
// and contents: entries sorted by path, every missing parent directory added (0755), owner 0:0
// without names, every time stamp set to epoch, no extended attributes. /tmp, when present, is
// sticky and world-writable as a container's /tmp must be.
func layerTar(files map[string]*entry, epoch time.Time) ([]byte, error) {
	all := make(map[string]*entry, len(files))
	for p, e := range files {
		all[p] = e
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := all[d]; !ok {
				all[d] = &entry{Type: typeDir, Mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := all[p]
		h := &tar.Header{Name: p[1:], Mode: e.Mode, ModTime: epoch, Format: tar.FormatPAX}
		switch e.Type {
		case typeDir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			if p == "/tmp" {
				h.Mode = 0o1777
			}
		case typeSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		case typeFile:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.Data))
		default:
			return nil, fmt.Errorf("layer entry %s: unknown type %d", p, e.Type)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", p, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// gzipLayer compresses a layer tar once (gzip at its best compression: the layers are written
// once and pulled by every node) into an OCI layer. compress/gzip writes the same bytes for the
// same input and level, and no name or time in its header.
func gzipLayer(tarData []byte) (v1.Layer, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarData); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	compressed := buf.Bytes()
	// Given gzip data, the tarball layer takes it as the compressed form as it is.
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(compressed)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
