package instancetype

import (
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// ReasonConflict is the Failure reason of a VM that sets what its instancetype sets, or whose
// instancetype or preference asks for what this version cannot run.
const ReasonConflict = "InstancetypeConflict"

// Expand is the spec and annotations of the instance vm creates, its references resolved to res
// (nil when it has none): the template's, with the instancetype and the preference applied. The
// errors name vm's fields: conflicts with the instancetype, unmet preference requirements, and
// what the instancetype or preference holds that this version cannot run (at spec.instancetype and
// spec.preference, naming the object's field).
func Expand(vm *v1alpha1.VirtualMachine, res *Resolution) (*v1alpha1.VirtualMachineInstanceSpec, map[string]string, field.ErrorList) {
	spec := vm.Spec.Template.Spec.DeepCopy()
	annotations := maps.Clone(vm.Spec.Template.ObjectMeta.Annotations)
	if res == nil || (res.Instancetype == nil && res.Preference == nil) {
		return spec, annotations, nil
	}
	var errs field.ErrorList
	if it := res.Instancetype; it != nil {
		errs = append(errs, notRealisedIn(instancetypePath, res.InstancetypeRef, v1alpha1.NotRealisedInstancetype(it, field.NewPath("spec")))...)
	}
	if pref := res.Preference; pref != nil {
		errs = append(errs, notRealisedIn(preferencePath, res.PreferenceRef, v1alpha1.NotRealisedPreference(pref, field.NewPath("spec")))...)
	}
	if len(errs) > 0 {
		return nil, nil, errs
	}
	if errs := Apply(spec, &annotations, res.Instancetype, res.Preference); len(errs) > 0 {
		return nil, nil, errs
	}
	return spec, annotations, nil
}

// notRealisedIn places the refusals of a referenced object's fields at the VM's reference, the
// object and its field named in the message.
func notRealisedIn(p *field.Path, ref *v1alpha1.InstancetypeStatusRef, errs field.ErrorList) field.ErrorList {
	out := make(field.ErrorList, 0, len(errs))
	for _, e := range errs {
		out = append(out, field.Forbidden(p, fmt.Sprintf("%s %q: %s", ref.Kind, ref.Name, e.Error())))
	}
	return out
}

// HasReferences says whether vm refers to an instancetype or a preference.
func HasReferences(vm *v1alpha1.VirtualMachine) bool {
	return vm.Spec.Instancetype != nil || vm.Spec.Preference != nil
}
