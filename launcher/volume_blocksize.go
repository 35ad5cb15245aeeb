package launcher

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/qvirt/qvirt/machine"
)

// A disk with blockSize.matchVolume gets the block sizes of its image's storage, read as
// KubeVirt's virt-launcher reads them (its converter's blockio.go): a block device's logical and
// physical sector sizes and its queue's discard granularity; for an image file, the block size
// of the filesystem it is on, for all three. The image probed is the one QEMU opens (a
// containerDisk's overlay, not the image under it), as there.

// resolveVolumeBlockSize sets d.BlockSize from the storage of d's image img when d asks for it
// and has none yet (a migration target has the source's); errors are at p, the disk's path.
func resolveVolumeBlockSize(d *machine.Disk, img DiskImage, p machine.Path) *machine.FieldError {
	if !d.MatchVolumeBlockSize || d.BlockSize != nil {
		return nil
	}
	bp := p.Child("blockSize")
	bs, err := volumeBlockSize(img)
	if err != nil {
		return machine.Invalid(bp, img.Path, fmt.Sprintf("read the block sizes of the volume's storage (matchVolume): %v", err))
	}
	if prs := bs.Problems(d.Bus == machine.BusSATA); len(prs) > 0 {
		pr := prs[0]
		return machine.Invalid(bp.Child(pr.Field), pr.Value, fmt.Sprintf("the volume's storage (%s) has this %s size, which QEMU refuses: it %s; set blockSize.custom instead of matchVolume", img.Path, pr.Field, pr.Detail))
	}
	d.BlockSize = bs
	return nil
}

// volumeBlockSize reads the block sizes of the storage behind img.
func volumeBlockSize(img DiskImage) (*machine.BlockSize, error) {
	if !img.Device {
		var st unix.Statfs_t
		if err := unix.Statfs(img.Path, &st); err != nil {
			return nil, fmt.Errorf("statfs %s: %w", img.Path, err)
		}
		if st.Bsize <= 0 || st.Bsize > 1<<31 {
			return nil, fmt.Errorf("the filesystem of %s reports a block size of %d", img.Path, st.Bsize)
		}
		b := uint32(st.Bsize)
		return &machine.BlockSize{Logical: b, Physical: b, DiscardGranularity: b}, nil
	}
	return deviceBlockSize(img.Path)
}

// deviceBlockSize reads a block device's sector sizes and discard granularity. A size the device
// reports as 0 is taken from the other; a granularity that is no multiple of the logical size is
// the physical size; none (0, or no queue: a partition) is left to QEMU.
func deviceBlockSize(path string) (*machine.BlockSize, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	logical, err := unix.IoctlGetInt(fd, unix.BLKSSZGET)
	if err != nil {
		return nil, fmt.Errorf("logical sector size of %s (BLKSSZGET): %w", path, err)
	}
	physical, err := unix.IoctlGetUint32(fd, unix.BLKPBSZGET)
	if err != nil {
		return nil, fmt.Errorf("physical sector size of %s (BLKPBSZGET): %w", path, err)
	}
	bs := &machine.BlockSize{Logical: uint32(logical), Physical: physical}
	switch {
	case bs.Logical == 0 && bs.Physical == 0:
		return nil, fmt.Errorf("%s reports no sector sizes", path)
	case bs.Logical == 0:
		bs.Logical = bs.Physical
	case bs.Physical == 0:
		bs.Physical = bs.Logical
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	g, err := discardGranularity(unix.Major(st.Rdev), unix.Minor(st.Rdev))
	if err != nil {
		return nil, fmt.Errorf("discard granularity of %s: %w", path, err)
	}
	if g != 0 && g%bs.Logical != 0 {
		g = bs.Physical
	}
	bs.DiscardGranularity = g
	return bs, nil
}

// sysBlockDir is where sysfs describes block devices by number; a variable for tests.
var sysBlockDir = "/sys/dev/block"

// discardGranularity is the discard granularity of block device major:minor in sysfs; 0 when
// the device has no queue of its own (a partition) or does not discard.
func discardGranularity(major, minor uint32) (uint32, error) {
	data, err := os.ReadFile(fmt.Sprintf("%s/%d:%d/queue/discard_granularity", sysBlockDir, major, minor))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	g, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("sysfs says %q: %w", strings.TrimSpace(string(data)), err)
	}
	return uint32(g), nil
}
