package launcher

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// HostResolver resolves a spec against the filesystem the launcher sees: for `qvirt-launcher run`
// the host's, for `qvirt-launcher serve` the launcher pod's (whose hostDisk volumes are hostPath
// mounts). A container image reference of the form file://DIR names an image already unpacked at DIR
// (a leading ~ is the user's home), so a spec that boots from a kernelBoot or containerDisk image
// runs without a container runtime, as in local mode. Interfaces take the taps and MACs the node
// agent put in the request; without a node agent (run mode) a spec with interfaces is refused.
type HostResolver struct {
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
func (h HostResolver) Resolve(req *SyncRequest, runDir string) (*Machine, error) {
	spec := &req.Spec
	m := &Machine{
		Name: req.Name, Namespace: req.Namespace, UID: string(req.UID), Spec: spec,
		Emulation: req.Emulation, RunDir: runDir, Incoming: req.Incoming,
		Disks: map[string]DiskImage{}, SpareRootPorts: h.SpareRootPorts, Hotplugged: req.Hotplugged,
		HotplugNICs: req.HotplugNICs,
	}
	var errs field.ErrorList
	if kb := spec.Domain.Firmware; kb != nil && kb.KernelBoot != nil && kb.KernelBoot.Container != nil {
		p := field.NewPath("spec", "domain", "firmware", "kernelBoot", "container")
		c := kb.KernelBoot.Container
		root, err := h.imageRoot(c.Image, c.ImagePullPolicy, c.ImagePullSecret)
		if err != nil {
			return nil, field.Invalid(p.Child("image"), c.Image, err.Error())
		}
		if m.Kernel, err = existingFile(root, c.KernelPath); err != nil {
			errs = append(errs, field.Invalid(p.Child("kernelPath"), c.KernelPath, err.Error()))
		}
		if m.Initrd, err = existingFile(root, c.InitrdPath); err != nil {
			errs = append(errs, field.Invalid(p.Child("initrdPath"), c.InitrdPath, err.Error()))
		}
	}
	scratch := h.ScratchDir
	if scratch == "" {
		scratch = runDir
	}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		img, err := h.volume(v, scratch, field.NewPath("spec", "volumes").Index(i))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.Disks[v.Name] = img
	}
	errs = append(errs, resolveInterfaces(m, req)...)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return m, nil
}

// resolveInterfaces takes each spec interface's tap and MAC from the node agent's setup.
func resolveInterfaces(m *Machine, req *SyncRequest) field.ErrorList {
	ifaces := req.Spec.Domain.Devices.Interfaces
	if len(ifaces) == 0 {
		return nil
	}
	m.Taps, m.MACs = map[string]string{}, map[string]string{}
	var errs field.ErrorList
	for i := range ifaces {
		p := field.NewPath("spec", "domain", "devices", "interfaces").Index(i)
		setup := findInterface(req.Interfaces, ifaces[i].Name)
		if setup == nil {
			errs = append(errs, field.Forbidden(p, "no tap was set up for this interface: pod networking needs the node agent (qvirt-handler)"))
			continue
		}
		m.Taps[setup.Name] = setup.Tap
		m.MACs[setup.Name] = setup.MAC
	}
	return errs
}

func findInterface(setups []InterfaceSetup, name string) *InterfaceSetup {
	for i := range setups {
		if setups[i].Name == name {
			return &setups[i]
		}
	}
	return nil
}

func (h HostResolver) volume(v *v1alpha1.Volume, runDir string, p *field.Path) (DiskImage, *field.Error) {
	switch {
	case v.HostDisk != nil:
		return hostDisk(v.HostDisk, p.Child("hostDisk"))
	case v.ContainerDisk != nil:
		return h.containerDisk(v.ContainerDisk, p.Child("containerDisk"))
	case v.EmptyDisk != nil:
		path := filepath.Join(runDir, emptyDiskFile(v.Name))
		if err := createSparse(path, v.EmptyDisk.Capacity.Value()); err != nil {
			return DiskImage{}, field.InternalError(p.Child("emptyDisk"), err)
		}
		return DiskImage{Path: path, Format: "raw"}, nil
	}
	return DiskImage{}, field.Forbidden(p, "qvirt-launcher run supports hostDisk, containerDisk (file://) and emptyDisk volumes")
}

// emptyDiskFile is the file name of an emptyDisk volume's image in the scratch directory.
func emptyDiskFile(volume string) string { return "empty-" + volume + ".img" }

// hostDisk is KubeVirt's hostDisk: a raw image file, created sparse for DiskOrCreate.
func hostDisk(hd *v1alpha1.HostDisk, p *field.Path) (DiskImage, *field.Error) {
	_, err := os.Stat(hd.Path)
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist) && hd.Type == v1alpha1.HostDiskExistsOrCreate && hd.Capacity != nil:
		if err := createSparse(hd.Path, hd.Capacity.Value()); err != nil {
			return DiskImage{}, field.Invalid(p.Child("path"), hd.Path, err.Error())
		}
	default:
		return DiskImage{}, field.Invalid(p.Child("path"), hd.Path, err.Error())
	}
	return DiskImage{Path: hd.Path, Format: "raw"}, nil
}

func (h HostResolver) containerDisk(cd *v1alpha1.ContainerDiskSource, p *field.Path) (DiskImage, *field.Error) {
	root, err := h.imageRoot(cd.Image, cd.ImagePullPolicy, cd.ImagePullSecret)
	if err != nil {
		return DiskImage{}, field.Invalid(p.Child("image"), cd.Image, err.Error())
	}
	path := cd.Path
	if path == "" {
		if path, err = singleDiskFile(root); err != nil {
			return DiskImage{}, field.Invalid(p.Child("path"), cd.Path, err.Error())
		}
	}
	file, err := existingFile(root, path)
	if err != nil {
		return DiskImage{}, field.Invalid(p.Child("path"), path, err.Error())
	}
	format, err := FormatFromName(file)
	if err != nil {
		return DiskImage{}, field.Invalid(p.Child("path"), path, err.Error())
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

// imageRoot is the directory of an image: a file:// reference names it, any other is pulled into
// the node's image cache (image.go).
func (h HostResolver) imageRoot(image string, policy corev1.PullPolicy, pullSecret string) (string, error) {
	dir, ok := strings.CutPrefix(image, "file://")
	if !ok {
		return h.pullImage(image, policy, pullSecret)
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
	st, err := os.Stat(dir)
	if err != nil {
		return "", err
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	return dir, nil
}

// existingFile joins an in-image path to the image root, refusing paths that leave it.
func existingFile(root, inImage string) (string, error) {
	if inImage == "" {
		return "", nil
	}
	path := filepath.Join(root, filepath.Clean("/"+inImage))
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
