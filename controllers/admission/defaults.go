package admission

import (
	"context"
	"errors"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/instancetype"
)

// The mutating webhook records KubeVirt's defaults in the stored object, as KubeVirt's
// (pkg/virt-api/webhooks/mutating-webhook): a VirtualMachine gets its template's machine type on
// create and update (vm-mutator.go), an instance everything else when it is created
// (vmi-mutator.go). The API server calls it before the schema, the CEL rules and the validating
// webhook, which therefore see the defaults: a volume without a disk has one by then.

// +kubebuilder:webhook:path=/mutate-qvirt-io-v1alpha1-virtualmachine,mutating=true,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachines,verbs=create;update,versions=v1alpha1,name=mvm.qvirt.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/mutate-qvirt-io-v1alpha1-virtualmachineinstance,mutating=true,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachineinstances,verbs=create,versions=v1alpha1,name=mvmi.qvirt.io,admissionReviewVersions=v1

// VMDefaulter defaults VirtualMachines: their template's machine type only (the instances a VM
// creates get the rest), so that the machine ABI is pinned when the VM is created. With Reader
// set it also resolves inferFromVolume references, the machine type is the preference's
// preferredMachineType when the VM has one, and the preference's storage class goes into the
// dataVolumeTemplates that name none (KubeVirt's vm-mutator does all three).
type VMDefaulter struct{ Reader client.Reader }

// Default implements admission.Defaulter. A VM being deleted is left alone, as KubeVirt does, so
// that removing its finalizers never rewrites its spec.
func (d VMDefaulter) Default(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if vm.DeletionTimestamp != nil {
		return nil
	}
	if d.Reader != nil && instancetype.HasReferences(vm) {
		r := instancetype.Resolver{Reader: d.Reader}
		if err := r.Infer(ctx, vm); err != nil {
			var ie *instancetype.Error
			if errors.As(err, &ie) {
				return apierrors.NewInvalid(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "VirtualMachine"}, vm.Name, field.ErrorList{ie.FieldError()})
			}
			return err
		}
		// A preference that cannot be found is the validating webhook's to report.
		if pref, err := r.FindPreference(ctx, vm); err == nil && pref != nil {
			setPreferredMachineType(vm, pref)
			instancetype.ApplyStorageClassPreference(vm, pref)
		}
	}
	v1alpha1.SetVirtualMachineDefaults(&vm.Spec)
	return nil
}

// setPreferredMachineType records the preference's machine type in a template that names none.
func setPreferredMachineType(vm *v1alpha1.VirtualMachine, pref *v1alpha1.VirtualMachinePreferenceSpec) {
	if pref.Machine == nil || pref.Machine.PreferredMachineType == "" {
		return
	}
	d := &vm.Spec.Template.Spec.Domain
	if d.Machine == nil || d.Machine.Type == "" {
		d.Machine = &v1alpha1.Machine{Type: pref.Machine.PreferredMachineType}
	}
}

// VMIDefaulter defaults VirtualMachineInstances when they are created (v1alpha1.SetDefaults) and
// gives them the graceful shutdown finalizer.
// Updates keep the spec as stored: a hot-plugged disk gets its defaults when the node agent
// attaches it.
type VMIDefaulter struct{}

// Default implements admission.Defaulter.
func (VMIDefaulter) Default(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	if req, err := admission.RequestFromContext(ctx); err == nil && req.Operation != admissionv1.Create {
		return nil
	}
	v1alpha1.SetDefaults(&vmi.Spec)
	// The finalizer the controller's first pass would otherwise add with a write of its own (and
	// still does where no webhook ran), as KubeVirt's VMI mutator adds its own.
	controllerutil.AddFinalizer(vmi, v1alpha1.GracefulShutdownFinalizer)
	return nil
}
