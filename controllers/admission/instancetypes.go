package admission

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// The instancetypes and preferences are refused at creation for what this version cannot give an
// instance (v1alpha1.NotRealisedInstancetype and NotRealisedPreference), naming the field, so that
// nobody finds out only when a VM refers to one. The VM validator checks them again where they are
// used (they may predate the webhook).

// +kubebuilder:webhook:path=/validate-qvirt-io-v1alpha1-virtualmachineinstancetype,mutating=false,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachineinstancetypes,verbs=create;update,versions=v1alpha1,name=vvminstancetype.qvirt.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-qvirt-io-v1alpha1-virtualmachineclusterinstancetype,mutating=false,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachineclusterinstancetypes,verbs=create;update,versions=v1alpha1,name=vvmclusterinstancetype.qvirt.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-qvirt-io-v1alpha1-virtualmachinepreference,mutating=false,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachinepreferences,verbs=create;update,versions=v1alpha1,name=vvmpreference.qvirt.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-qvirt-io-v1alpha1-virtualmachineclusterpreference,mutating=false,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachineclusterpreferences,verbs=create;update,versions=v1alpha1,name=vvmclusterpreference.qvirt.io,admissionReviewVersions=v1

func setupInstancetypes(mgr ctrl.Manager) error {
	spec := field.NewPath("spec")
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.VirtualMachineInstancetype{}).WithValidator(specValidator[*v1alpha1.VirtualMachineInstancetype]{
		kind: v1alpha1.InstancetypeKind, check: func(o *v1alpha1.VirtualMachineInstancetype) field.ErrorList {
			return ValidateInstancetypeSpec(&o.Spec, spec)
		},
	}).Complete(); err != nil {
		return fmt.Errorf("register %s webhook: %w", v1alpha1.InstancetypeKind, err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.VirtualMachineClusterInstancetype{}).WithValidator(specValidator[*v1alpha1.VirtualMachineClusterInstancetype]{
		kind: v1alpha1.ClusterInstancetypeKind, check: func(o *v1alpha1.VirtualMachineClusterInstancetype) field.ErrorList {
			return ValidateInstancetypeSpec(&o.Spec, spec)
		},
	}).Complete(); err != nil {
		return fmt.Errorf("register %s webhook: %w", v1alpha1.ClusterInstancetypeKind, err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.VirtualMachinePreference{}).WithValidator(specValidator[*v1alpha1.VirtualMachinePreference]{
		kind: v1alpha1.PreferenceKind, check: func(o *v1alpha1.VirtualMachinePreference) field.ErrorList {
			return v1alpha1.NotRealisedPreference(&o.Spec, spec)
		},
	}).Complete(); err != nil {
		return fmt.Errorf("register %s webhook: %w", v1alpha1.PreferenceKind, err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.VirtualMachineClusterPreference{}).WithValidator(specValidator[*v1alpha1.VirtualMachineClusterPreference]{
		kind: v1alpha1.ClusterPreferenceKind, check: func(o *v1alpha1.VirtualMachineClusterPreference) field.ErrorList {
			return v1alpha1.NotRealisedPreference(&o.Spec, spec)
		},
	}).Complete(); err != nil {
		return fmt.Errorf("register %s webhook: %w", v1alpha1.ClusterPreferenceKind, err)
	}
	return nil
}

// ValidateInstancetypeSpec is what an instancetype must be for its instances to start: nothing
// NotRealisedInstancetype refuses, guest memory within what an instance may ask for, and memory
// hotplug room an instance may have. p is the
// spec's path.
func ValidateInstancetypeSpec(spec *v1alpha1.VirtualMachineInstancetypeSpec, p *field.Path) field.ErrorList {
	errs := v1alpha1.NotRealisedInstancetype(spec, p)
	errs = append(errs, v1alpha1.ValidateInstancetypeMaxGuest(spec, p)...)
	if g := spec.Memory.Guest; g.CmpInt64(v1alpha1.MaxGuestMemory) > 0 {
		errs = append(errs, field.Invalid(p.Child("memory", "guest"), g.String(), "must be at most 1Ei"))
	}
	return errs
}

// specValidator validates one instancetype or preference kind with check; an update is refused
// only for problems the old object did not have (ratchet).
type specValidator[T client.Object] struct {
	kind  string
	check func(T) field.ErrorList
}

func (v specValidator[T]) ValidateCreate(_ context.Context, o T) (admission.Warnings, error) {
	return nil, invalid(v.kind, o.GetName(), v.check(o))
}

func (v specValidator[T]) ValidateUpdate(_ context.Context, old, o T) (admission.Warnings, error) {
	return nil, invalid(v.kind, o.GetName(), ratchet(v.check(o), v.check(old)))
}

func (v specValidator[T]) ValidateDelete(context.Context, T) (admission.Warnings, error) {
	return nil, nil
}
