package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/qvirt/qvirt/machine"
)

// Claims, as KubeVirt attaches them. A filesystem-mode claim holds one raw image, disk.img, at the
// root of its volume; the launcher creates it sparse when it is absent, at the size the node
// agent computed (the claim's capacity less the filesystem overhead), after checking that the
// volume has room for it: some provisioners give a little less than asked, so up to
// lessSpaceTolerationPercent less is accepted and the image shrunk to what there is (KubeVirt's
// pvc-tolerate-less-space-up-to-percent, default 10, and its 128 KiB reserve). A block-mode claim
// is the pod's device node, attached as it is. An ephemeral volume is the claim read-only under a
// qcow2 overlay in the launcher's scratch directory.

const (
	lessSpaceTolerationPercent = 10
	minimumClaimReserveBytes   = 128 << 10
)

// claimOverlayFile is the file name of an ephemeral volume's overlay in the scratch directory.
func claimOverlayFile(volume string) string { return "ephemeral-" + volume + ".qcow2" }

// claim resolves disk d's claim volume; errors are at p (the source's path).
func (h HostResolver) claim(d *machine.Disk, c *machine.Claim, runDir string, p machine.Path) (DiskImage, *machine.FieldError) {
	img, err := claimImage(c, d.ReadOnly || c.Overlay, p)
	if err == nil && d.LUN {
		err = checkSCSI(c, p)
	}
	if err != nil || !c.Overlay {
		return img, err
	}
	if err := checkName(p.Child("name"), d.Name); err != nil {
		return DiskImage{}, err
	}
	base := img
	base.ReadOnly = true
	size, serr := imageSize(base.Path)
	if serr != nil {
		return DiskImage{}, machine.Invalid(p, c.Name, serr.Error())
	}
	scratch := h.ScratchDir
	if scratch == "" {
		scratch = runDir
	}
	path := filepath.Join(scratch, claimOverlayFile(d.Name))
	// Made afresh for each start: what the guest wrote before is gone, as with KubeVirt's
	// ephemeral volumes.
	if err := createOverlay(path, &base, uint64(size)); err != nil {
		return DiskImage{}, machine.Invalid(p.Child("overlay"), true, fmt.Sprintf("create the overlay over claim %s: %v", c.Name, err))
	}
	return DiskImage{Path: path, Format: "qcow2", Backing: &base, Ephemeral: true}, nil
}

// sgGetVersionNum is SG_GET_VERSION_NUM of <scsi/sg.h>, which golang.org/x/sys does not define:
// the SG_IO driver version of a device that takes SCSI commands.
const sgGetVersionNum = 0x2282

// minSGVersion is the SG_IO version QEMU's scsi-block requires (3.0).
const minSGVersion = 30000

// checkSCSI checks that claim c's block device takes SCSI commands, as a passed-through LUN needs,
// so that the refusal names the claim rather than QEMU's "Is this a SCSI device?".
func checkSCSI(c *machine.Claim, p machine.Path) *machine.FieldError {
	fd, err := unix.Open(c.Device, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return machine.Invalid(p.Child("device"), c.Device, fmt.Sprintf("block device of claim %s: %v", c.Name, err))
	}
	defer unix.Close(fd)
	v, err := unix.IoctlGetInt(fd, sgGetVersionNum)
	if err == nil && v < minSGVersion {
		err = fmt.Errorf("SG_IO version %d, QEMU needs %d or later", v, minSGVersion)
	}
	if err != nil {
		return machine.Invalid(p.Child("device"), c.Device, fmt.Sprintf("the block device of claim %s takes no SCSI commands (SG_IO: %v): a lun passes a SCSI LUN through (iSCSI, Fibre Channel); attach this claim with disk instead", c.Name, err))
	}
	return nil
}

// claimImage is the claim's raw image: its device, or its disk.img, created when absent and the
// claim may be written.
func claimImage(c *machine.Claim, readOnly bool, p machine.Path) (DiskImage, *machine.FieldError) {
	switch {
	case (c.Dir == "") == (c.Device == ""):
		return DiskImage{}, machine.Required(p, "exactly one of dir and device")
	case c.Device != "":
		if err := absPath(p.Child("device"), c.Device); err != nil {
			return DiskImage{}, err
		}
		var st unix.Stat_t
		if err := unix.Stat(c.Device, &st); err != nil {
			return DiskImage{}, machine.Invalid(p.Child("device"), c.Device, fmt.Sprintf("block device of claim %s: %v", c.Name, err))
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return DiskImage{}, machine.Invalid(p.Child("device"), c.Device, fmt.Sprintf("claim %s: not a block device", c.Name))
		}
		return DiskImage{Path: c.Device, Format: "raw", ReadOnly: readOnly, Device: true}, nil
	}
	if err := absPath(p.Child("dir"), c.Dir); err != nil {
		return DiskImage{}, err
	}
	path := filepath.Join(c.Dir, machine.ClaimImage)
	fi, err := os.Lstat(path)
	switch {
	case err == nil && !fi.Mode().IsRegular():
		return DiskImage{}, machine.Invalid(p.Child("dir"), c.Dir, fmt.Sprintf("claim %s: %s is not a regular file", c.Name, machine.ClaimImage))
	case err == nil:
		return DiskImage{Path: path, Format: "raw", ReadOnly: readOnly}, nil
	case !errors.Is(err, os.ErrNotExist):
		return DiskImage{}, machine.Invalid(p.Child("dir"), c.Dir, fmt.Sprintf("claim %s: %v", c.Name, err))
	case readOnly:
		return DiskImage{}, machine.Invalid(p.Child("dir"), c.Dir, fmt.Sprintf("claim %s has no %s, and a read-only claim cannot get one", c.Name, machine.ClaimImage))
	}
	size, err := claimImageSize(c)
	if err != nil {
		return DiskImage{}, machine.Invalid(p.Child("imageBytes"), c.ImageBytes, err.Error())
	}
	if err := createSparse(path, size); err != nil {
		return DiskImage{}, machine.Invalid(p.Child("dir"), c.Dir, fmt.Sprintf("create %s in claim %s: %v", machine.ClaimImage, c.Name, err))
	}
	return DiskImage{Path: path, Format: "raw"}, nil
}

// claimImageSize is the size to create the claim's disk.img at: ImageBytes, or what the volume has
// free when that is less but within the toleration. Less than that is an error naming both sizes.
func claimImageSize(c *machine.Claim) (int64, error) {
	if c.ImageBytes <= 0 {
		return 0, fmt.Errorf("claim %s: no size to create %s at", c.Name, machine.ClaimImage)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(c.Dir, &fs); err != nil {
		return 0, fmt.Errorf("claim %s: %w", c.Name, err)
	}
	avail := int64(fs.Bavail)*fs.Bsize - minimumClaimReserveBytes
	if c.ImageBytes <= avail {
		return c.ImageBytes, nil
	}
	if c.ImageBytes*(100-lessSpaceTolerationPercent)/100 > avail {
		return 0, fmt.Errorf("claim %s is too small: %s needs %d bytes and the volume has %d free, more than %d%% less",
			c.Name, machine.ClaimImage, c.ImageBytes, max(avail, 0), lessSpaceTolerationPercent)
	}
	return avail, nil
}

// imageSize is a raw image's size: a file's length or a block device's.
func imageSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, 2)
}
