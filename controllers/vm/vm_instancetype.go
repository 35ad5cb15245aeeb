package vm

import (
	"context"
	"errors"
	"maps"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/instancetype"
)

// expand is what vm's next instance is made of. With an instancetype or a preference it pins
// them first (instancetype.Resolver.Pin: a ControllerRevision owned by vm holds the copy taken at
// first use, recorded in vm.Status.InstancetypeRef and PreferenceRef, which this sets), so a later
// change to the instancetype does not reach the VM's instances; KubeVirt's newer status refs are
// used rather than its older spec.instancetype.revisionName, which stays the user's to set. A
// reference that cannot be resolved or expanded (a missing instancetype, a conflict that
// admission did not stop) is a Failure; other errors are returned for a retry.
func (r *Reconciler) expand(ctx context.Context, vm *v1alpha1.VirtualMachine) (*instanceSpec, *Failure, error) {
	if !instancetype.HasReferences(vm) {
		vm.Status.InstancetypeRef, vm.Status.PreferenceRef = nil, nil
		return &instanceSpec{Spec: desiredVMISpec(vm), Annotations: maps.Clone(vm.Spec.Template.ObjectMeta.Annotations)}, nil, nil
	}
	resolver := instancetype.Resolver{Reader: r.reader(), Client: r.Client}
	res, err := resolver.Pin(ctx, vm)
	var ie *instancetype.Error
	switch {
	case errors.As(err, &ie):
		return nil, &Failure{Reason: ie.Reason, Message: ie.Error()}, nil
	case err != nil:
		return nil, nil, err
	}
	vm.Status.InstancetypeRef, vm.Status.PreferenceRef = res.InstancetypeRef, res.PreferenceRef
	spec, annotations, errs := instancetype.Expand(vm, res)
	if len(errs) > 0 {
		return nil, &Failure{Reason: instancetype.ReasonConflict, Message: errs.ToAggregate().Error()}, nil
	}
	return &instanceSpec{Spec: withStableUUID(vm, spec), Annotations: annotations}, nil, nil
}
