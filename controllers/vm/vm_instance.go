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
	return withStableUUID(vm, vm.Spec.Template.Spec.DeepCopy())
}

// withStableUUID is spec (a copy the caller gives up) with desiredVMISpec's SMBIOS UUID default.
func withStableUUID(vm *v1alpha1.VirtualMachine, s *v1alpha1.VirtualMachineInstanceSpec) v1alpha1.VirtualMachineInstanceSpec {
	spec := *s
	if spec.Domain.Firmware == nil {
		spec.Domain.Firmware = &v1alpha1.Firmware{}
	}
	if spec.Domain.Firmware.UUID == "" {
		spec.Domain.Firmware.UUID = vm.UID
	}
	return spec
}

// instanceSpec is what the VM's next instance is made of: its spec and annotations, the template's
// expanded with the VM's instancetype and preference (vm_instancetype.go).
type instanceSpec struct {
	Spec        v1alpha1.VirtualMachineInstanceSpec
	Annotations map[string]string
}

// newVMI renders the VM's instance from its template alone.
func newVMI(vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachineInstance {
	return newVMIFrom(vm, &instanceSpec{Spec: desiredVMISpec(vm), Annotations: maps.Clone(vm.Spec.Template.ObjectMeta.Annotations)})
}

// newVMIFrom renders the VM's instance: named like the VM, in its namespace, controlled by it, with the
// template's labels plus qvirt.io/vm=<vm>, and the spec and annotations of in.
func newVMIFrom(vm *v1alpha1.VirtualMachine, in *instanceSpec) *v1alpha1.VirtualMachineInstance {
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
			Annotations: in.Annotations,
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(vm, v1alpha1.GroupVersion.WithKind("VirtualMachine")),
			},
		},
		Spec: in.Spec,
	}
}

// controlledBy is true when vm is the instance's controller.
func controlledBy(vmi *v1alpha1.VirtualMachineInstance, vm *v1alpha1.VirtualMachine) bool {
	ref := metav1.GetControllerOf(vmi)
	return ref != nil && ref.UID == vm.UID
}
