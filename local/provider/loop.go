package provider

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Loop devices: a virtual node gives a pod a block-mode claim as a kubelet's volume plugin would,
// here by attaching the claim's backing file to a free loop device (LOOP_CTL_GET_FREE, then
// LOOP_CONFIGURE) and making the device node at the container's devicePath. The pod records what
// it attached (loopsFile in its directory), so the pod's end, or Cleanup after a crash, detaches
// it.

const loopsFile = "loops"

// attachLoop attaches file to a free loop device, read-only if asked, and returns the device's
// path and number.
func attachLoop(file string, readOnly bool) (string, uint64, error) {
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", 0, fmt.Errorf("loop devices: %w", err)
	}
	defer unix.Close(ctl)
	flags := unix.O_RDWR
	if readOnly {
		flags = unix.O_RDONLY
	}
	backing, err := unix.Open(file, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", 0, fmt.Errorf("open %s: %w", file, err)
	}
	defer unix.Close(backing)
	// Another process may take the free device first: ask again.
	for range 8 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", 0, fmt.Errorf("find a free loop device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		fd, err := unix.Open(dev, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", 0, fmt.Errorf("open %s: %w", dev, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(backing)}
		if readOnly {
			cfg.Info.Flags = unix.LO_FLAGS_READ_ONLY
		}
		copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], file)
		err = unix.IoctlLoopConfigure(fd, &cfg)
		var st unix.Stat_t
		if err == nil {
			err = unix.Fstat(fd, &st)
		}
		unix.Close(fd)
		if errors.Is(err, unix.EBUSY) {
			continue
		}
		if err != nil {
			return "", 0, fmt.Errorf("attach %s to %s: %w", file, dev, err)
		}
		return dev, st.Rdev, nil
	}
	return "", 0, fmt.Errorf("attach %s: every free loop device was taken first", file)
}

// detachLoop detaches a loop device from its file, if backing is still its file; a device
// already free is fine.
func detachLoop(dev, backing string) error {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
	if err != nil || strings.TrimSpace(string(b)) != backing {
		return nil
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s: %w", dev, err)
	}
	return nil
}

// recordLoop notes in pod directory dir that dev is attached to backing.
func recordLoop(dir, dev, backing string) error {
	f, err := os.OpenFile(filepath.Join(dir, loopsFile), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s\t%s\n", dev, backing)
	return errors.Join(err, f.Close())
}

// detachRecordedLoops detaches the loop devices pod directory dir records.
func detachRecordedLoops(dir string) error {
	f, err := os.Open(filepath.Join(dir, loopsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if dev, backing, ok := strings.Cut(sc.Text(), "\t"); ok {
			errs = append(errs, detachLoop(dev, backing))
		}
	}
	return errors.Join(append(errs, sc.Err())...)
}
