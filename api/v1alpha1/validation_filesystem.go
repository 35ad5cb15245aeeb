package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxFilesystems is how many filesystems an instance may share (the CRD's maxItems too): each is a
// virtiofsd process in the launcher pod and a PCIe root port.
const MaxFilesystems = 16

// MaxFilesystemTag is the longest name a filesystem may have: the name is the virtio-fs tag the
// guest mounts, a 36-byte field of the device's configuration (QEMU's vhost-user-fs refuses longer).
const MaxFilesystemTag = 36

// FilesystemVolumeKinds are the volume sources a filesystem can share, as in KubeVirt: a directory
// the launcher pod holds.
var FilesystemVolumeKinds = []string{"persistentVolumeClaim", "configMap", "secret", "serviceAccount", "downwardAPI"}

// validateFilesystems checks the filesystems (p is devices.filesystems): each names a volume of a
// kind FilesystemVolumeKinds lists, that no disk attaches, once, with virtiofs.
func validateFilesystems(spec *VirtualMachineInstanceSpec, disks map[string]bool, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	vols := map[string]*Volume{}
	for i := range spec.Volumes {
		vols[spec.Volumes[i].Name] = &spec.Volumes[i]
	}
	seen := map[string]bool{}
	fss := spec.Domain.Devices.Filesystems
	for i, f := range fss {
		fp := p.Index(i)
		errs = append(errs, validateName(fp.Child("name"), f.Name, seen)...)
		if len(f.Name) > MaxFilesystemTag {
			errs = append(errs, field.TooLong(fp.Child("name"), f.Name, MaxFilesystemTag))
		}
		if f.Virtiofs == nil {
			errs = append(errs, field.Required(fp.Child("virtiofs"), "the filesystem's type: virtiofs is the only one"))
		}
		v, ok := vols[f.Name]
		switch {
		case !ok:
			errs = append(errs, field.NotFound(fp.Child("name"), f.Name))
		case disks[f.Name]:
			errs = append(errs, field.Invalid(fp.Child("name"), f.Name, "the volume is attached as a disk too; a volume is either a disk or a filesystem"))
		case FilesystemKind(&v.VolumeSource) == "":
			errs = append(errs, field.Invalid(fp.Child("name"), f.Name, fmt.Sprintf("volume %q cannot be shared as a filesystem: it must be one of %v", f.Name, FilesystemVolumeKinds)))
		}
	}
	if len(fss) > MaxFilesystems {
		errs = append(errs, field.TooMany(p, len(fss), MaxFilesystems))
	}
	return errs
}

// FilesystemKind is the source of a volume a filesystem can share (one of FilesystemVolumeKinds),
// or "" when it cannot be shared.
func FilesystemKind(s *VolumeSource) string {
	switch {
	case s.PersistentVolumeClaim != nil:
		return "persistentVolumeClaim"
	case s.ConfigMap != nil:
		return "configMap"
	case s.Secret != nil:
		return "secret"
	case s.ServiceAccount != nil:
		return "serviceAccount"
	case s.DownwardAPI != nil:
		return "downwardAPI"
	}
	return ""
}
