package apiserver

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// addVolume adds a volume and its disk to the VM's template and, when an instance runs, to the
// instance's spec: the node agent hot-plugs what the instance's spec adds. The instance is
// patched first, so a refusal there (the update rules of validation_update.go) leaves the VM as
// it was.
func (a *API) addVolume(ctx context.Context, r vmRequest) (any, error) {
	vol, disk, err := ParseAddVolumeOptions(r.body)
	if err != nil {
		return nil, err
	}
	if hasVolume(&r.vm.Spec.Template.Spec, vol.Name) {
		return nil, conflict(r, "VM %s has a volume or disk named %q already; removevolume it first or pick another name", r.key(), vol.Name)
	}
	add := func(spec *v1alpha1.VirtualMachineInstanceSpec) {
		spec.Volumes = append(spec.Volumes, vol)
		spec.Domain.Devices.Disks = append(spec.Domain.Devices.Disks, disk)
	}
	hot, err := a.editVMI(ctx, r, vol.Name, true, add)
	if err != nil {
		return nil, err
	}
	if err := a.editTemplate(ctx, r, add); err != nil {
		return nil, err
	}
	msg := fmt.Sprintf("VM %s: volume %s added to the template", r.key(), vol.Name)
	if hot {
		msg += " and hot-plugged into the running VMI"
	}
	return msg, nil
}

// removeVolume removes a volume and its disk from the VM's template and from the running instance
// (which allows it only for hot-plugged disks).
func (a *API) removeVolume(ctx context.Context, r vmRequest) (any, error) {
	o, err := ParseRemoveVolumeOptions(r.body)
	if err != nil {
		return nil, err
	}
	inTemplate := hasVolume(&r.vm.Spec.Template.Spec, o.Name)
	if !inTemplate && (r.vmi == nil || !hasVolume(&r.vmi.Spec, o.Name)) {
		return nil, conflict(r, "VM %s has no volume named %q", r.key(), o.Name)
	}
	remove := func(spec *v1alpha1.VirtualMachineInstanceSpec) {
		spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v v1alpha1.Volume) bool { return v.Name == o.Name })
		spec.Domain.Devices.Disks = slices.DeleteFunc(spec.Domain.Devices.Disks, func(d v1alpha1.Disk) bool { return d.Name == o.Name })
	}
	hot, err := a.editVMI(ctx, r, o.Name, false, remove)
	if err != nil {
		return nil, err
	}
	if inTemplate {
		if err := a.editTemplate(ctx, r, remove); err != nil {
			return nil, err
		}
	}
	msg := fmt.Sprintf("VM %s: volume %s removed from the template", r.key(), o.Name)
	if hot {
		msg += " and unplugged from the running VMI"
	}
	return msg, nil
}

func hasVolume(spec *v1alpha1.VirtualMachineInstanceSpec, name string) bool {
	return slices.ContainsFunc(spec.Volumes, func(v v1alpha1.Volume) bool { return v.Name == name }) ||
		slices.ContainsFunc(spec.Domain.Devices.Disks, func(d v1alpha1.Disk) bool { return d.Name == name })
}

// editVMI applies edit to the running instance's spec, checked with the instance update rules;
// it reports whether there was an instance to edit. An instance that is not active, or that does
// not have the volume being removed, is left alone.
func (a *API) editVMI(ctx context.Context, r vmRequest, name string, adding bool, edit func(*v1alpha1.VirtualMachineInstanceSpec)) (bool, error) {
	if !active(r.vmi) || (!adding && !hasVolume(&r.vmi.Spec, name)) {
		return false, nil
	}
	if adding && hasVolume(&r.vmi.Spec, name) {
		// Hot-plugged by an earlier attempt whose template write met a conflict.
		return true, nil
	}
	orig := r.vmi.DeepCopy()
	edit(&r.vmi.Spec)
	if errs := v1alpha1.ValidateVirtualMachineInstanceUpdate(orig, r.vmi); len(errs) > 0 {
		return false, invalid(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "VirtualMachineInstance"}, r.vmi.Name, errs)
	}
	err := a.client.Patch(ctx, r.vmi, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	return true, writeErr(err, "patch the volumes and disks of VMI %s", r.key())
}

// editTemplate applies edit to the VM's template, checked with the VM's validation.
func (a *API) editTemplate(ctx context.Context, r vmRequest, edit func(*v1alpha1.VirtualMachineInstanceSpec)) error {
	orig := r.vm.DeepCopy()
	edit(&r.vm.Spec.Template.Spec)
	if errs := v1alpha1.ValidateVirtualMachine(r.vm); len(errs) > 0 {
		return invalid(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "VirtualMachine"}, r.vm.Name, errs)
	}
	err := a.client.Patch(ctx, r.vm, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	return writeErr(err, "patch the template of VM %s", r.key())
}

func invalid(gk schema.GroupKind, name string, errs field.ErrorList) error {
	return apierrors.NewInvalid(gk, name, errs)
}
