package translate

import (
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/machine"
)

// Filesystem is a filesystem of the spec, sharing vol's directory in the launcher pod: a
// filesystem-mode claim's mount, or the directory the pod mounts a config volume at. The pod's
// mount decides whether the guest may write: config volumes and read-only claims are mounted
// read-only.
func Filesystem(f *v1alpha1.Filesystem, vol *v1alpha1.Volume, pod *PodVolumes, p *field.Path) (machine.Filesystem, field.ErrorList) {
	if vol == nil {
		return machine.Filesystem{}, field.ErrorList{field.NotFound(p.Child("name"), f.Name)}
	}
	kind := v1alpha1.FilesystemKind(&vol.VolumeSource)
	out := machine.Filesystem{Name: f.Name, Kind: kind}
	switch {
	case vol.PersistentVolumeClaim != nil:
		if pod == nil {
			return out, field.ErrorList{field.Forbidden(p, "a claim is shared only in a launcher pod")}
		}
		c, ok := pod.Claims[vol.PersistentVolumeClaim.ClaimName]
		if !ok {
			return out, field.ErrorList{field.NotFound(p.Child("name"), vol.PersistentVolumeClaim.ClaimName)}
		}
		if c.Block {
			return out, field.ErrorList{field.Invalid(p.Child("name"), f.Name, "claim "+vol.PersistentVolumeClaim.ClaimName+" has volumeMode Block: only a filesystem-mode claim can be shared as a filesystem")}
		}
		out.Dir = podlayout.ClaimMount(vol.Name)
	case kind != "":
		out.Dir = podlayout.ConfigVolumeMount(vol.Name)
	default:
		return out, field.ErrorList{field.Invalid(p.Child("name"), f.Name, "this volume cannot be shared as a filesystem")}
	}
	return out, nil
}
