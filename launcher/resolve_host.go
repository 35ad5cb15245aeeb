package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/qvirt/qvirt/machine"
)

// HostResolver resolves a machine description against the filesystem the launcher sees: for
// `qvirt-launcher run` the host's, for `qvirt-launcher serve` the launcher pod's (whose hostDisk
// volumes are hostPath mounts and whose images are image volumes, see Images). In run mode a
// container image reference of the form file://DIR names an image already unpacked at DIR (a
// leading ~ is the user's home), so a machine that boots from a kernel or container disk image runs
// without a container runtime; other references are pulled into ImageCache.
type HostResolver struct {
	// Images, when set, are where the launcher pod mounts its images (podlayout): they are read
	// from there only. Nothing is pulled and file:// is refused, since images in a pod come from
	// trusted code (the kubelet, or a virtual node's provider), never from the launcher.
	Images *ImageMounts
	// FileImagesInPod accepts file:// images besides Images: for tests that run serve-mode
	// launchers on a prepared directory (--allow-file-images); never in a launcher pod.
	FileImagesInPod bool
	// SpareRootPorts is how many empty pcie-root-ports to create for hotplug.
	SpareRootPorts int
	// ScratchDir holds emptyDisk and cloud-init images, containerDisk overlays and an EFI
	// machine's variable store; the run directory when empty.
	ScratchDir string
	// CloudInitSecrets is where the pod mounts the Secret volumes of cloud-init volumes
	// (podlayout.CloudInitSecretDir); empty outside a pod, where cloud-init data from a Secret is
	// refused.
	CloudInitSecrets string
	// ConfigVolumes is where the pod mounts the volumes behind config disks
	// (podlayout.ConfigVolumeDir); empty outside a pod, where config volumes are refused.
	ConfigVolumes string
	// OVMFDir holds the OVMF builds, named as Debian's ovmf package names them (see OVMFFiles);
	// DefaultOVMFDir when empty.
	OVMFDir string
	// ImageCache is the node's image cache directory (image.go); without it only file:// images
	// can be used.
	ImageCache string
	// InsecureRegistries may be reached over plain HTTP (host:port as in image references).
	InsecureRegistries []string
	// Puller is the image puller binary (image.go); qvirt-pull beside the launcher when empty.
	Puller string
}

// Resolve implements Resolver.
func (h HostResolver) Resolve(desc *machine.Machine, runDir string) (*Machine, error) {
	m := &Machine{Machine: *desc, RunDir: runDir, Images: map[string]DiskImage{}, SpareRootPorts: h.SpareRootPorts}
	if desc.NoHotplug {
		m.SpareRootPorts = 0
	}
	if off := desc.Clock.RTCOffsetSeconds; off != 0 {
		m.RTCStart = time.Now().UTC().Add(time.Duration(off) * time.Second)
	}
	var errs machine.FieldErrors
	if kb := desc.Kernel; kb != nil {
		p := machinePath.Child("kernel")
		root, err := h.imageRoot(kb.Image, h.Images.kernelBoot())
		if err != nil {
			return nil, machine.Invalid(p.Child("image", "ref"), kb.Image.Ref, err.Error())
		}
		if m.KernelFile, err = existingFile(root, kb.KernelPath); err != nil {
			errs = append(errs, machine.Invalid(p.Child("kernelPath"), kb.KernelPath, err.Error()))
		}
		if m.InitrdFile, err = existingFile(root, kb.InitrdPath); err != nil {
			errs = append(errs, machine.Invalid(p.Child("initrdPath"), kb.InitrdPath, err.Error()))
		}
	}
	if st := desc.State; st != nil {
		if err := stateDir(st.Dir); err != nil {
			return nil, machine.Invalid(machinePath.Child("state", "dir"), st.Dir, err.Error())
		}
	}
	if efi := desc.Firmware.EFI; efi != nil {
		dir := h.scratch(runDir)
		if desc.State != nil && desc.State.EFIVars {
			dir = desc.State.Dir
		}
		var err *machine.FieldError
		if m.EFICode, m.EFIVars, err = h.resolveEFI(efi, dir); err != nil {
			errs = append(errs, err)
		}
	}
	// The disks get what the launcher reads of their storage; desc stays as the node agent sent it.
	m.Disks = slices.Clone(desc.Disks)
	for i := range m.Disks {
		p := machinePath.Child("disks").Index(i)
		img, err := h.ResolveDisk(&m.Disks[i], runDir, p)
		if err == nil {
			err = resolveVolumeBlockSize(&m.Disks[i], img, p)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.Images[m.Disks[i].Name] = img
	}
	for i, f := range desc.Filesystems {
		if err := sharedDir(machinePath.Child("filesystems").Index(i).Child("dir"), f); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return m, nil
}

// ResolveDisk finds (or creates: an emptyDisk, a hostDisk to create) d's image; errors are at p.
// It is called again for a disk hot-plugged while the VM runs and creates nothing but that disk's
// image.
func (h HostResolver) ResolveDisk(d *machine.Disk, runDir string, p machine.Path) (DiskImage, *machine.FieldError) {
	src, sp := d.Source, p.Child("source")
	switch {
	case src.HostFile != nil:
		return hostFile(src.HostFile, sp.Child("hostFile"))
	case src.Container != nil:
		img, size, err := h.containerDisk(src.Container, h.Images.containerDisk(d.Name), sp.Child("container"))
		if err != nil || d.ReadOnly || d.CDROM {
			return img, err
		}
		return h.containerOverlay(d, img, size, runDir, p)
	case src.Claim != nil:
		return h.claim(d, src.Claim, runDir, sp.Child("claim"))
	case src.CloudInit != nil:
		return h.cloudInitDisk(d, h.scratch(runDir), p)
	case src.Config != nil:
		return h.configDisk(d, h.scratch(runDir), p)
	case src.Empty != nil:
		if err := checkName(p.Child("name"), d.Name); err != nil {
			return DiskImage{}, err
		}
		path := filepath.Join(h.scratch(runDir), emptyDiskFile(d.Name))
		if err := createSparse(path, src.Empty.CapacityBytes); err != nil {
			return DiskImage{}, machine.Invalid(sp.Child("empty", "capacityBytes"), src.Empty.CapacityBytes, err.Error())
		}
		return DiskImage{Path: path, Format: "raw", Ephemeral: true}, nil
	}
	return DiskImage{}, machine.Required(sp, "one of hostFile, container, empty, claim, cloudInit or config")
}

// scratch is where the launcher keeps the files it makes for the machine: ScratchDir, else the run
// directory.
func (h HostResolver) scratch(runDir string) string {
	if h.ScratchDir != "" {
		return h.ScratchDir
	}
	return runDir
}

// emptyDiskFile is the file name of an emptyDisk volume's image in the scratch directory.
func emptyDiskFile(volume string) string { return "empty-" + volume + ".img" }

// overlayFile is the file name of a writable containerDisk's overlay in the scratch directory.
func overlayFile(volume string) string { return "overlay-" + volume + ".qcow2" }

// containerOverlay makes a container disk the guest may write to writable as KubeVirt does: a new,
// empty qcow2 overlay in the scratch directory over the read-only image. The guest's writes go to
// the overlay, the image stays as pulled (it is a read-only image volume), and the overlay, so
// every write, goes with the VM. The overlay's backing is named to QEMU explicitly with its format
// (blockNodes), never taken from the overlay's header.
func (h HostResolver) containerOverlay(d *machine.Disk, base DiskImage, size uint64, runDir string, p machine.Path) (DiskImage, *machine.FieldError) {
	if err := checkName(p.Child("name"), d.Name); err != nil {
		return DiskImage{}, err
	}
	path := filepath.Join(h.scratch(runDir), overlayFile(d.Name))
	if err := createOverlay(path, &base, size); err != nil {
		return DiskImage{}, machine.Invalid(p.Child("source", "container"), d.Name,
			fmt.Sprintf("create the writable overlay %s over the image: %v", path, err))
	}
	return DiskImage{Path: path, Format: "qcow2", Backing: &base, Ephemeral: true}, nil
}

// hostFile is an image file the launcher sees (KubeVirt's hostDisk), created sparse when asked.
// With a Root, the file is taken by its resolved path and only if that stays within Root.
func hostFile(hf *machine.HostFile, p machine.Path) (DiskImage, *machine.FieldError) {
	if err := absPath(p.Child("path"), hf.Path); err != nil {
		return DiskImage{}, err
	}
	if hf.Format != "raw" && hf.Format != "qcow2" {
		return DiskImage{}, machine.NotSupported(p.Child("format"), hf.Format, []string{"raw", "qcow2"})
	}
	path := hf.Path
	if hf.Root != "" {
		var err error
		if path, err = withinRoot(hf.Root, hf.Path); err != nil {
			return DiskImage{}, machine.Invalid(p.Child("path"), hf.Path, err.Error())
		}
	}
	_, err := os.Stat(path)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist) && hf.CreateBytes > 0 && hf.Format == "raw":
		if err := createSparse(path, hf.CreateBytes); err != nil {
			return DiskImage{}, machine.Invalid(p.Child("path"), hf.Path, err.Error())
		}
	default:
		return DiskImage{}, machine.Invalid(p.Child("path"), hf.Path, err.Error())
	}
	return DiskImage{Path: path, Format: hf.Format}, nil
}

// withinRoot resolves path's links (of a file not there yet, its directory's) and refuses a path
// that leads outside root, lexically or through a link.
func withinRoot(root, path string) (string, error) {
	path = filepath.Clean(path)
	if rel, err := filepath.Rel(root, path); err != nil || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
		return "", fmt.Errorf("%s is not under %s", path, root)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	base := ""
	resolved, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		if _, lerr := os.Lstat(path); lerr == nil {
			return "", fmt.Errorf("%s is a link to nothing", path)
		}
		base = filepath.Base(path)
		resolved, err = filepath.EvalSymlinks(filepath.Dir(path))
	}
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(realRoot, resolved); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s leads outside %s (to %s)", path, root, resolved)
	}
	if base != "" {
		resolved = filepath.Join(resolved, base)
	}
	return resolved, nil
}

// containerDisk is the image file of a container disk, read-only, and its virtual size. A qcow2
// image's header is checked (ParseQcow2Header): it came from a registry, and QEMU must not be led
// to a file it names.
func (h HostResolver) containerDisk(cd *machine.Container, mount string, p machine.Path) (DiskImage, uint64, *machine.FieldError) {
	root, err := h.imageRoot(cd.Image, mount)
	if err != nil {
		return DiskImage{}, 0, machine.Invalid(p.Child("image", "ref"), cd.Image.Ref, err.Error())
	}
	path := cd.Path
	if path == "" {
		if path, err = singleDiskFile(root); err != nil {
			return DiskImage{}, 0, machine.Invalid(p.Child("path"), cd.Path, err.Error())
		}
	}
	file, err := existingFile(root, path)
	if err != nil {
		return DiskImage{}, 0, machine.Invalid(p.Child("path"), path, err.Error())
	}
	format, err := FormatFromName(file)
	if err != nil {
		return DiskImage{}, 0, machine.Invalid(p.Child("path"), path, err.Error())
	}
	// The image is the pod's read-only image volume (shared with nothing writable, but never
	// written): a writable disk gets an overlay over it.
	img := DiskImage{Path: file, Format: format, ReadOnly: true}
	size, err := imageVirtualSize(&img)
	if err != nil {
		return DiskImage{}, 0, machine.Invalid(p.Child("path"), path, err.Error())
	}
	return img, size, nil
}

// FormatFromName is a container disk's format from its file name (.qcow2, or .img/.raw/.iso for
// raw). The format is never probed from the content: a raw image holding a qcow2 header would
// otherwise let a guest read host files through a backing file.
func FormatFromName(path string) (string, error) {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".qcow2":
		return "qcow2", nil
	case ".img", ".raw", ".iso":
		return "raw", nil
	}
	return "", fmt.Errorf("cannot tell the image format of %s: name it .qcow2, .img, .raw or .iso", filepath.Base(path))
}

// singleDiskFile is the one file under the image's /disk directory, KubeVirt's convention for a
// containerDisk image without a path.
func singleDiskFile(root string) (string, error) {
	const want = "a containerDisk image holds one disk image file under /disk/ (KubeVirt's layout), or the volume names the file with containerDisk.path"
	entries, err := os.ReadDir(filepath.Join(root, "disk"))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("the image has no /disk directory: %s", want)
	}
	if err != nil {
		return "", fmt.Errorf("read /disk in the image: %w", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	switch {
	case len(entries) == 0:
		return "", fmt.Errorf("the image's /disk directory is empty: %s", want)
	case len(entries) > 1:
		shown := names
		if len(shown) > 8 {
			shown = append(shown[:8:8], "...")
		}
		return "", fmt.Errorf("the image's /disk directory holds %d entries (%s), so which is the disk is not clear: set containerDisk.path", len(entries), strings.Join(shown, ", "))
	case entries[0].IsDir():
		return "", fmt.Errorf("/disk/%s in the image is a directory: %s", names[0], want)
	}
	return "/disk/" + entries[0].Name(), nil
}

// imageRoot is the directory of an image: its volume's mount in a launcher pod, else the directory
// a file:// reference names, else the image pulled into the user's image cache (image.go).
func (h HostResolver) imageRoot(ref machine.ImageRef, mount string) (string, error) {
	if h.Images != nil && !(h.FileImagesInPod && strings.HasPrefix(ref.Ref, "file://")) {
		return mountedImage(ref, mount)
	}
	dir, ok := strings.CutPrefix(ref.Ref, "file://")
	if !ok {
		return h.pullImage(ref)
	}
	if rest, ok := strings.CutPrefix(dir, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(home, rest)
	}
	if !filepath.IsAbs(dir) {
		return "", errors.New("file:// image needs an absolute directory")
	}
	return existingDir(dir)
}

func existingDir(dir string) (string, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	return dir, nil
}

// existingFile joins an in-image path to the image root and resolves its links, refusing a path
// that leaves the root by "..", or by a link (of the image, or of whoever wrote it) that leads
// outside. The result is the resolved path, so QEMU opens what was checked.
func existingFile(root, inImage string) (string, error) {
	if inImage == "" {
		return "", nil
	}
	if slices.Contains(strings.Split(filepath.ToSlash(inImage), "/"), "..") {
		return "", fmt.Errorf("%s leads outside the image: no .. components", inImage)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return "", err
	}
	path, err := filepath.EvalSymlinks(filepath.Join(realRoot, filepath.Clean("/"+inImage)))
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(realRoot, path); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s leads outside the image (to %s)", inImage, path)
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	return path, nil
}

// createSparse creates a sparse raw image of size bytes unless one exists already.
func createSparse(path string, size int64) error {
	if size <= 0 {
		return fmt.Errorf("create %s: size must be positive", path)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// stateDir checks the VM's state directory: an existing directory, named absolutely.
func stateDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("must be an absolute path")
	}
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("the backend-storage claim is not mounted there: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("must be a directory")
	}
	return nil
}
