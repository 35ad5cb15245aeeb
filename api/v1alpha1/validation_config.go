package v1alpha1

import (
	"fmt"
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateConfigVolume checks a secret, configMap, serviceAccount or downwardAPI volume (p is the
// source's path): the object it names and the ISO 9660 label. Pod validation checks the pod's
// volume again; these checks give the error the instance's field path instead of a pod that
// cannot be created.
func validateConfigVolume(s *VolumeSource, p *field.Path) field.ErrorList {
	switch {
	case s.Secret != nil:
		errs := validateObjectName(p.Child("secretName"), s.Secret.SecretName, "the Secret's name")
		return append(errs, ValidateVolumeLabel(p.Child("volumeLabel"), s.Secret.VolumeLabel)...)
	case s.ConfigMap != nil:
		errs := validateObjectName(p.Child("name"), s.ConfigMap.Name, "the ConfigMap's name")
		return append(errs, ValidateVolumeLabel(p.Child("volumeLabel"), s.ConfigMap.VolumeLabel)...)
	case s.ServiceAccount != nil:
		return validateObjectName(p.Child("serviceAccountName"), s.ServiceAccount.ServiceAccountName, "the service account's name")
	case s.DownwardAPI != nil:
		errs := validateDownwardAPIFields(s.DownwardAPI, p.Child("fields"))
		return append(errs, ValidateVolumeLabel(p.Child("volumeLabel"), s.DownwardAPI.VolumeLabel)...)
	}
	return nil
}

func validateObjectName(p *field.Path, name, what string) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, what)}
	}
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p, name, strings.Join(msgs, "; "))}
	}
	return nil
}

// ValidateVolumeLabel checks a config volume's ISO 9660 volume label: at most
// ConfigVolumeMaxLabel printable ASCII characters (the volume descriptor's field, which the guest
// reads as the filesystem's label). Empty means ConfigVolumeDefaultLabel.
func ValidateVolumeLabel(p *field.Path, label string) field.ErrorList {
	if len(label) > ConfigVolumeMaxLabel {
		return field.ErrorList{field.TooLong(p, label, ConfigVolumeMaxLabel)}
	}
	for _, r := range label {
		if r < 0x20 || r > 0x7e {
			return field.ErrorList{field.Invalid(p, label, fmt.Sprintf("must be printable ASCII (an ISO 9660 volume identifier); %q is not", r))}
		}
	}
	return nil
}

// validateDownwardAPIFields checks each file's path (relative, no '..' element, not starting with
// '..', as pod validation) and that it names exactly one of fieldRef and resourceFieldRef.
func validateDownwardAPIFields(d *DownwardAPIVolumeSource, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i := range d.Fields {
		f, fp := &d.Fields[i], p.Index(i)
		switch {
		case f.Path == "":
			errs = append(errs, field.Required(fp.Child("path"), "the file's path in the volume"))
		case path.IsAbs(f.Path) || strings.HasPrefix(f.Path, "..") || containsDotDot(f.Path):
			errs = append(errs, field.Invalid(fp.Child("path"), f.Path, "must be a relative path without '..' elements and must not start with '..'"))
		case seen[path.Clean(f.Path)]:
			errs = append(errs, field.Duplicate(fp.Child("path"), f.Path))
		}
		seen[path.Clean(f.Path)] = true
		if (f.FieldRef == nil) == (f.ResourceFieldRef == nil) {
			errs = append(errs, field.Invalid(fp, f.Path, "set exactly one of fieldRef and resourceFieldRef"))
		}
	}
	return errs
}

func containsDotDot(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}
