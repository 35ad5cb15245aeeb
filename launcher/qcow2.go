package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/qvirt/qvirt/internal/atomicfile"
)

// The qcow2 format, as far as the launcher needs it (QEMU's docs/interop/qcow2.txt): it reads the
// header of a container disk's qcow2 image (untrusted: it came from a registry) for its virtual
// size and the features QEMU would act on, and it writes an empty qcow2 overlay over a container
// disk so the guest can write to it. It never opens a backing file named inside an image, and
// creates an overlay without QEMU's tools: QEMU's own `qemu-img create -b` would open the backing
// image to find its size.

const (
	qcow2Magic = 0x514649fb // "QFI\xfb"
	// qcow2HeaderV2 and qcow2HeaderV3 are the header lengths of versions 2 and 3 (v3 may be longer).
	qcow2HeaderV2 = 72
	qcow2HeaderV3 = 104

	// Incompatible feature bits QEMU acts on when it opens an image.
	qcow2Dirty        = 1 << 0 // refcounts may be wrong: repaired on a writable open
	qcow2Corrupt      = 1 << 1 // opened read-only only
	qcow2DataFile     = 1 << 2 // guest data lives in an external file named in the header
	qcow2Compression  = 1 << 3 // non-zlib compression type field
	qcow2ExtendedL2   = 1 << 4 // subcluster allocation
	qcow2KnownFeature = qcow2Dirty | qcow2Corrupt | qcow2DataFile | qcow2Compression | qcow2ExtendedL2

	// Header extension types.
	qcow2ExtEnd           = 0
	qcow2ExtBackingFormat = 0xe2792aca

	// overlayClusterBits is the overlay's cluster size, 64 KiB (QEMU's default).
	overlayClusterBits = 16
	// maxVirtualSize bounds the virtual size of a container disk the launcher accepts (and so the
	// size of an overlay's L1 table: 4 MiB, left sparse).
	maxVirtualSize = 256 << 40
	// maxBackingName is QEMU's limit on the backing file name stored in a header.
	maxBackingName = 1023
)

// Qcow2Header is what the launcher reads from a qcow2 image's header.
type Qcow2Header struct {
	Version uint32
	// Size is the virtual disk size in bytes.
	Size uint64
	// BackingFile says whether the image names a backing file. The launcher never opens it: QEMU
	// is told "backing": null, or an overlay's explicit backing node.
	BackingFile          bool
	IncompatibleFeatures uint64
}

// ParseQcow2Header reads a qcow2 header from the start of r and checks what the launcher relies on:
// the magic, a version QEMU 7.2 opens (2 or 3), a sane cluster size and virtual size, and no
// external data file (QEMU would open a file named inside the image, which a container disk must
// never make it do) or feature this code does not know. It reads at most the fixed header.
func ParseQcow2Header(r io.ReaderAt) (Qcow2Header, error) {
	var b [qcow2HeaderV3]byte
	n, err := r.ReadAt(b[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Qcow2Header{}, err
	}
	if n < qcow2HeaderV2 {
		return Qcow2Header{}, fmt.Errorf("not a qcow2 image: %d bytes, shorter than a qcow2 header", n)
	}
	be := binary.BigEndian
	if be.Uint32(b[0:]) != qcow2Magic {
		return Qcow2Header{}, errors.New("not a qcow2 image: no qcow2 magic at its start")
	}
	h := Qcow2Header{Version: be.Uint32(b[4:]), Size: be.Uint64(b[24:]), BackingFile: be.Uint64(b[8:]) != 0}
	switch h.Version {
	case 2:
	case 3:
		if n < qcow2HeaderV3 {
			return Qcow2Header{}, fmt.Errorf("qcow2 version 3 header cut short at %d bytes", n)
		}
		h.IncompatibleFeatures = be.Uint64(b[72:])
	default:
		return Qcow2Header{}, fmt.Errorf("qcow2 version %d; QEMU opens versions 2 and 3", h.Version)
	}
	if cb := be.Uint32(b[20:]); cb < 9 || cb > 21 {
		return Qcow2Header{}, fmt.Errorf("qcow2 cluster size 2^%d is outside 512 B to 2 MiB", cb)
	}
	if h.Size == 0 || h.Size > maxVirtualSize {
		return Qcow2Header{}, fmt.Errorf("qcow2 virtual size %d bytes is outside 1 B to %d TiB", h.Size, maxVirtualSize>>40)
	}
	if h.IncompatibleFeatures&qcow2DataFile != 0 {
		return Qcow2Header{}, errors.New("the qcow2 image keeps its data in an external data file named inside it, which is never opened")
	}
	if unknown := h.IncompatibleFeatures &^ qcow2KnownFeature; unknown != 0 {
		return Qcow2Header{}, fmt.Errorf("the qcow2 image needs unknown incompatible features %#x", unknown)
	}
	return h, nil
}

// imageVirtualSize is the disk size a guest sees from img: a qcow2 image's virtual size from its
// header, a raw image's file size.
func imageVirtualSize(img *DiskImage) (uint64, error) {
	f, err := os.Open(img.Path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if img.Format == "qcow2" {
		h, err := ParseQcow2Header(f)
		if err != nil {
			return 0, err
		}
		return h.Size, nil
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if st.Size() <= 0 || st.Size() > maxVirtualSize {
		return 0, fmt.Errorf("size %d bytes is outside 1 B to %d TiB", st.Size(), maxVirtualSize>>40)
	}
	return uint64(st.Size()), nil
}

// overlayLayout is an empty qcow2 v3 image of size bytes: the header (with the backing file's
// format in an extension and its name after the extensions) in cluster 0, the refcount table in
// cluster 1, its one refcount block in cluster 2 and the L1 table from cluster 3, all zero but
// the refcounts of those clusters. The file is that long; the L1 table is left sparse.
type overlayLayout struct {
	size                   uint64
	l1Entries, l1Clusters  uint64
	backing, backingFormat string
}

func newOverlayLayout(size uint64, backing, backingFormat string) (overlayLayout, error) {
	if size == 0 || size > maxVirtualSize {
		return overlayLayout{}, fmt.Errorf("virtual size %d bytes is outside 1 B to %d TiB", size, maxVirtualSize>>40)
	}
	if len(backing) == 0 || len(backing) > maxBackingName {
		return overlayLayout{}, fmt.Errorf("backing file name of %d bytes; qcow2 takes 1 to %d", len(backing), maxBackingName)
	}
	size = (size + 511) &^ 511 // QEMU sizes a qcow2 image in whole sectors
	const cluster = 1 << overlayClusterBits
	perL1 := uint64(cluster) * (cluster / 8) // bytes one L2 table maps
	l := overlayLayout{size: size, backing: backing, backingFormat: backingFormat}
	l.l1Entries = (size + perL1 - 1) / perL1
	l.l1Clusters = (l.l1Entries*8 + cluster - 1) / cluster
	return l, nil
}

// header is cluster 0's content.
func (l overlayLayout) header() ([]byte, error) {
	const cluster = 1 << overlayClusterBits
	be := binary.BigEndian
	b := make([]byte, qcow2HeaderV3)
	be.PutUint32(b[0:], qcow2Magic)
	be.PutUint32(b[4:], 3)
	be.PutUint32(b[20:], overlayClusterBits)
	be.PutUint64(b[24:], l.size)
	be.PutUint32(b[36:], uint32(l.l1Entries))
	be.PutUint64(b[40:], 3*cluster) // L1 table
	be.PutUint64(b[48:], 1*cluster) // refcount table
	be.PutUint32(b[56:], 1)         // refcount table clusters
	be.PutUint32(b[96:], 4)         // refcount order: 16-bit refcounts
	be.PutUint32(b[100:], qcow2HeaderV3)
	b = appendExtension(b, qcow2ExtBackingFormat, []byte(l.backingFormat))
	b = appendExtension(b, qcow2ExtEnd, nil)
	be.PutUint64(b[8:], uint64(len(b))) // backing file name right after the extensions
	be.PutUint32(b[16:], uint32(len(l.backing)))
	b = append(b, l.backing...)
	if len(b) > cluster {
		return nil, fmt.Errorf("qcow2 header of %d bytes does not fit one cluster", len(b))
	}
	return b, nil
}

// appendExtension appends a header extension: type, length, data padded to 8 bytes.
func appendExtension(b []byte, typ uint32, data []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	b = append(b, data...)
	for len(b)%8 != 0 {
		b = append(b, 0)
	}
	return b
}

// metadataClusters is how many clusters the empty image uses: header, refcount table and block,
// L1 table. One refcount block of 16-bit entries counts 32768 clusters, far more than the L1
// table of maxVirtualSize needs.
func (l overlayLayout) metadataClusters() uint64 { return 3 + l.l1Clusters }

// write writes the image to f, which must be empty.
func (l overlayLayout) write(f *os.File) error {
	const cluster = 1 << overlayClusterBits
	hdr, err := l.header()
	if err != nil {
		return err
	}
	table := make([]byte, 8)
	binary.BigEndian.PutUint64(table, 2*cluster) // the one refcount block
	block := make([]byte, 2*l.metadataClusters())
	for i := range l.metadataClusters() {
		binary.BigEndian.PutUint16(block[2*i:], 1)
	}
	if err := f.Truncate(int64(l.metadataClusters() * cluster)); err != nil {
		return err
	}
	for _, w := range []struct {
		off  int64
		data []byte
	}{{0, hdr}, {cluster, table}, {2 * cluster, block}} {
		if _, err := f.WriteAt(w.data, w.off); err != nil {
			return err
		}
	}
	return nil
}

// createOverlay writes an empty qcow2 image of size bytes at path whose backing is backing
// (recorded in its header for people reading it with qemu-img; QEMU is given the backing node
// explicitly). An existing file at path is replaced: an overlay lives for one start of the VM. It
// is never half written: a crash may lose it, not leave a part (not synced: it is remade at the
// next start anyway, and a sync on every start costs the start time).
func createOverlay(path string, backing *DiskImage, size uint64) error {
	l, err := newOverlayLayout(size, backing.Path, backing.Format)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, 0o600, l.write)
}
