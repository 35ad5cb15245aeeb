package vm

import (
	"context"
	"errors"
	"maps"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/instancetype"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
	resolver := instancetype.Resolver{Reader: cacheFirst{cache: r.Client, api: r.APIReader}, Client: r.Client}
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

// RevisionSelector selects the ControllerRevisions that pin a VM's instancetype or preference
// (they carry the VM's name label), for the manager's cache.
func RevisionSelector() labels.Selector {
	req, err := labels.NewRequirement(v1alpha1.VMNameLabel, selection.Exists, nil)
	if err != nil {
		panic(err) // a constant key: only a programming error gets here
	}
	return labels.NewSelector().Add(*req)
}

// cacheFirst reads instancetypes, preferences, claims and revisions from the manager's cache, and
// from kube-apiserver only when the cache does not hold the object (yet): a VM's every pass reads
// its pinned revisions, which never change, so asking the API server each time cost two GETs per
// pass for nothing; but a revision this controller just created, or an instancetype created just
// before its VM, may not be in the cache yet, and taking "not found" from it would re-pin the VM
// to a newer copy or fail it.
type cacheFirst struct {
	cache client.Reader
	api   client.Reader // nil: the cache's answer is final
}

func (c cacheFirst) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := c.cache.Get(ctx, key, obj, opts...)
	if c.api == nil || !apierrors.IsNotFound(err) {
		return err
	}
	return c.api.Get(ctx, key, obj, opts...)
}

func (c cacheFirst) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.cache.List(ctx, list, opts...)
}
