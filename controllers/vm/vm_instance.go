package vm

import (
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// desiredVMISpec is the spec of the instance the VM creates: its template's spec, with the SMBIOS
// UUID defaulted to the VM's UID so that the guest sees the same machine across restarts (the API
// documents spec.domain.firmware.uuid as "derived from the VirtualMachine, stable across
// restarts"; the launcher falls back to the VMI's UID, which changes with every instance).
func desiredVMISpec(vm *v1alpha1.VirtualMachine) v1alpha1.VirtualMachineInstanceSpec {
	spec := *vm.Spec.Template.Spec.DeepCopy()
	if spec.Domain.Firmware == nil {
		spec.Domain.Firmware = &v1alpha1.Firmware{}
	}
	if spec.Domain.Firmware.UUID == "" {
		spec.Domain.Firmware.UUID = vm.UID
	}
	return spec
}

// newVMI renders the VM's instance: named like the VM, in its namespace, controlled by it, with the
// template's labels plus qvirt.io/vm=<vm> and the template's annotations.
func newVMI(vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachineInstance {
	labels := maps.Clone(vm.Spec.Template.ObjectMeta.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[v1alpha1.VMNameLabel] = vm.Name
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name:        vm.Name,
			Namespace:   vm.Namespace,
			Labels:      labels,
			Annotations: maps.Clone(vm.Spec.Template.ObjectMeta.Annotations),
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(vm, v1alpha1.GroupVersion.WithKind("VirtualMachine")),
			},
		},
		Spec: desiredVMISpec(vm),
	}
}

// controlledBy is true when vm is the instance's controller.
func controlledBy(vmi *v1alpha1.VirtualMachineInstance, vm *v1alpha1.VirtualMachine) bool {
	ref := metav1.GetControllerOf(vmi)
	return ref != nil && ref.UID == vm.UID
}
