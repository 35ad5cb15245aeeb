package translate

import (
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// LoadFile reads a VirtualMachineInstance or VirtualMachine (whose template is used) manifest
// strictly (unknown fields are errors, as with kubectl), applies the defaults admission records
// (v1alpha1.SetDefaults) and validates it as the API server and the webhooks would, refusing what
// this version does not realise (v1alpha1.NotRealised).
// A missing namespace is "default" and a missing UID a new one, so the instance can run outside a
// cluster (`qvirtctl machine`).
func LoadFile(file string) (*v1alpha1.VirtualMachineInstance, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if meta.APIVersion != v1alpha1.GroupVersion.String() {
		return nil, fmt.Errorf("%s: apiVersion %q: want %s", file, meta.APIVersion, v1alpha1.GroupVersion)
	}
	var vmi v1alpha1.VirtualMachineInstance
	var vmErrs field.ErrorList
	switch meta.Kind {
	case "VirtualMachineInstance":
		if err := yaml.UnmarshalStrict(data, &vmi); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
	case "VirtualMachine":
		var vm v1alpha1.VirtualMachine
		if err := yaml.UnmarshalStrict(data, &vm); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		vmi.ObjectMeta = vm.ObjectMeta
		vmi.Spec = vm.Spec.Template.Spec
		vmErrs = v1alpha1.NotRealisedVM(&vm.Spec)
	default:
		return nil, fmt.Errorf("%s: kind %q: want VirtualMachineInstance or VirtualMachine", file, meta.Kind)
	}
	v1alpha1.SetDefaults(&vmi.Spec)
	p := field.NewPath("spec")
	errs := append(vmErrs, v1alpha1.ValidateVirtualMachineInstanceSpec(&vmi.Spec, p)...)
	if errs = append(errs, v1alpha1.NotRealised(&vmi.Spec, p)...); len(errs) > 0 {
		return nil, fmt.Errorf("%s: %w", file, errs.ToAggregate())
	}
	if vmi.Namespace == "" {
		vmi.Namespace = "default"
	}
	if vmi.UID == "" {
		vmi.UID = uuid.NewUUID()
	}
	return &vmi, nil
}
