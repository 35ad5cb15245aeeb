package machine

import "fmt"

// Block sizes QEMU takes (its logical_block_size and physical_block_size limits).
const (
	MinBlockSize = 512
	MaxBlockSize = 2 << 20
)

// BlockSizeProblem is one way a block size breaks QEMU's rules: the field (logical, physical or
// discardGranularity), its value and what it must be.
type BlockSizeProblem struct {
	Field  string
	Value  uint32
	Detail string
}

// Problems lists what QEMU would refuse in bs on a disk, sata or not: admission (package
// v1alpha1) and the launcher check the same rules. The sizes come first: their order and the
// granularity are only judged when both are valid.
func (bs BlockSize) Problems(sata bool) []BlockSizeProblem {
	var out []BlockSizeProblem
	for _, s := range []struct {
		name string
		v    uint32
	}{{"logical", bs.Logical}, {"physical", bs.Physical}} {
		if s.v < MinBlockSize || s.v > MaxBlockSize || s.v&(s.v-1) != 0 {
			out = append(out, BlockSizeProblem{s.name, s.v, fmt.Sprintf("must be a power of two from %d to %d bytes", MinBlockSize, MaxBlockSize)})
		}
	}
	if len(out) > 0 {
		return out
	}
	if bs.Logical > bs.Physical {
		out = append(out, BlockSizeProblem{"logical", bs.Logical, fmt.Sprintf("must be at most the physical block size (%d)", bs.Physical)})
	}
	if bs.DiscardGranularity%bs.Logical != 0 {
		out = append(out, BlockSizeProblem{"discardGranularity", bs.DiscardGranularity, fmt.Sprintf("must be a multiple of the logical block size (%d)", bs.Logical)})
	}
	if sata && bs.Logical != MinBlockSize {
		out = append(out, BlockSizeProblem{"logical", bs.Logical, "a sata disk has 512-byte logical blocks; use virtio or scsi for larger ones"})
	}
	return out
}
