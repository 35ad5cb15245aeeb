package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

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
	// ScratchDir holds emptyDisk images; the run directory when empty.
	ScratchDir string
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
	for i := range desc.Disks {
		img, err := h.ResolveDisk(&desc.Disks[i], runDir, machinePath.Child("disks").Index(i))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.Images[desc.Disks[i].Name] = img
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
		return h.containerDisk(src.Container, h.Images.containerDisk(d.Name), sp.Child("container"))
	case src.Claim != nil:
		return h.claim(d, src.Claim, runDir, sp.Child("claim"))
	case src.Empty != nil:
		scratch := h.ScratchDir
		if scratch == "" {
			scratch = runDir
		}
		if err := checkName(p.Child("name"), d.Name); err != nil {
			return DiskImage{}, err
		}
		path := filepath.Join(scratch, emptyDiskFile(d.Name))
		if err := createSparse(path, src.Empty.CapacityBytes); err != nil {
			return DiskImage{}, machine.Invalid(sp.Child("empty", "capacityBytes"), src.Empty.CapacityBytes, err.Error())
		}
		return DiskImage{Path: path, Format: "raw", Ephemeral: true}, nil
	}
	return DiskImage{}, machine.Required(sp, "one of hostFile, container, empty or claim")
}

// emptyDiskFile is the file name of an emptyDisk volume's image in the scratch directory.
func emptyDiskFile(volume string) string { return "empty-" + volume + ".img" }

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

func (h HostResolver) containerDisk(cd *machine.Container, mount string, p machine.Path) (DiskImage, *machine.FieldError) {
	root, err := h.imageRoot(cd.Image, mount)
	if err != nil {
		return DiskImage{}, machine.Invalid(p.Child("image", "ref"), cd.Image.Ref, err.Error())
	}
	path := cd.Path
	if path == "" {
		if path, err = singleDiskFile(root); err != nil {
			return DiskImage{}, machine.Invalid(p.Child("path"), cd.Path, err.Error())
		}
	}
	file, err := existingFile(root, path)
	if err != nil {
		return DiskImage{}, machine.Invalid(p.Child("path"), path, err.Error())
	}
	format, err := FormatFromName(file)
	if err != nil {
		return DiskImage{}, machine.Invalid(p.Child("path"), path, err.Error())
	}
	// A container disk is shared by every VM using the image: never write to it.
	return DiskImage{Path: file, Format: format, ReadOnly: true}, nil
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

// singleDiskFile is the one file under the image's /disk directory, KubeVirt's convention.
func singleDiskFile(root string) (string, error) {
	entries, err := os.ReadDir(filepath.Join(root, "disk"))
	if err != nil {
		return "", fmt.Errorf("no path given and no /disk directory in the image: %w", err)
	}
	if len(entries) != 1 || entries[0].IsDir() {
		return "", fmt.Errorf("no path given and /disk holds %d entries, want exactly one file", len(entries))
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
