// Package admission is qvirt's admission webhooks. The mutating one records KubeVirt's defaults in
// the stored object (defaults.go). The validating one checks what the CRD schema and its CEL rules
// cannot express (the cluster's allowed host paths, base64 payloads, quantity rules the CEL cost
// budget refuses, cross-field rules), and what the schema accepts but this version of qvirt
// cannot run (v1alpha1.NotRealised), so that everything admitted can start. Everything it refuses
// names the field.
package admission

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/instancetype"
	"github.com/qvirt/qvirt/controllers/uninstall"
	"github.com/qvirt/qvirt/internal/config"
)

// Setup registers the VirtualMachine and VirtualMachineInstance defaulters and validators, and the
// launcher pods' eviction webhook (eviction.go) and the uninstall guard
// (controllers/uninstall), with mgr's
// webhook server.
func Setup(mgr ctrl.Manager, store *config.Store) error {
	reader := mgr.GetAPIReader()
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.VirtualMachine{}).WithDefaulter(VMDefaulter{Reader: reader}).
		WithValidator(&VMValidator{Config: store, Reader: reader}).Complete(); err != nil {
		return fmt.Errorf("register VirtualMachine webhooks: %w", err)
	}
	if err := setupInstancetypes(mgr); err != nil {
		return err
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1alpha1.VirtualMachineInstance{}).WithDefaulter(VMIDefaulter{}).
		WithValidator(&VMIValidator{Config: store}).Complete(); err != nil {
		return fmt.Errorf("register VirtualMachineInstance webhooks: %w", err)
	}
	mgr.GetWebhookServer().Register(EvictionPath, &webhook.Admission{Handler: &EvictionAdmitter{Reader: reader, Client: mgr.GetClient(), Config: store}})
	mgr.GetWebhookServer().Register(uninstall.Path, &webhook.Admission{Handler: &uninstall.Guard{Reader: reader, Client: mgr.GetClient()}})
	return nil
}

// +kubebuilder:webhook:path=/validate-qvirt-io-v1alpha1-virtualmachine,mutating=false,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachines,verbs=create;update,versions=v1alpha1,name=vvm.qvirt.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-qvirt-io-v1alpha1-virtualmachineinstance,mutating=false,failurePolicy=fail,sideEffects=None,groups=qvirt.io,resources=virtualmachineinstances,verbs=create;update,versions=v1alpha1,name=vvmi.qvirt.io,admissionReviewVersions=v1

// VMValidator validates VirtualMachines. With Reader set, a VM's instancetype and preference are
// resolved and expanded into its template first (as KubeVirt's VM admitter does), so that a
// missing one or a conflict with the instancetype is refused, naming the field, and the expanded
// template is what is validated; without it a VM that refers to either is refused.
type VMValidator struct {
	Config *config.Store
	Reader client.Reader
}

// ValidateCreate implements admission.Validator.
func (v *VMValidator) ValidateCreate(ctx context.Context, vm *v1alpha1.VirtualMachine) (admission.Warnings, error) {
	return v.validate(ctx, vm)
}

// ValidateUpdate implements admission.Validator. An update is refused only for problems the old
// object did not have (ratchet): a VirtualMachine admitted under earlier rules or another
// configuration can still be stopped, and its finalizer removed. Status-only updates go through
// the status subresource and do not reach this webhook.
func (v *VMValidator) ValidateUpdate(ctx context.Context, old, vm *v1alpha1.VirtualMachine) (admission.Warnings, error) {
	expanded, errs := v.check(ctx, vm)
	_, oldErrs := v.check(ctx, old)
	return warnings(&defaulted(expanded).Spec.Template.Spec, templateSpecPath), invalid("VirtualMachine", vm.Name, ratchet(errs, oldErrs))
}

// ValidateDelete implements admission.Validator.
func (v *VMValidator) ValidateDelete(context.Context, *v1alpha1.VirtualMachine) (admission.Warnings, error) {
	return nil, nil
}

func (v *VMValidator) validate(ctx context.Context, vm *v1alpha1.VirtualMachine) (admission.Warnings, error) {
	expanded, errs := v.check(ctx, vm)
	return warnings(&defaulted(expanded).Spec.Template.Spec, templateSpecPath), invalid("VirtualMachine", vm.Name, errs)
}

// check is everything a VirtualMachine's instances would be refused for at creation, at the
// template's paths: its template is checked expanded with its instancetype and preference and
// with the defaults its instances will get. It returns the expanded VM too (vm itself when it
// cannot be expanded).
func (v *VMValidator) check(ctx context.Context, vm *v1alpha1.VirtualMachine) (*v1alpha1.VirtualMachine, field.ErrorList) {
	expanded, errs := v.expand(ctx, vm)
	if len(errs) > 0 {
		return vm, errs
	}
	return expanded, v.checkExpanded(expanded)
}

// expand is vm with its template expanded with its instancetype and preference
// (instancetype.Expand), or the errors that keep it from being expanded.
func (v *VMValidator) expand(ctx context.Context, vm *v1alpha1.VirtualMachine) (*v1alpha1.VirtualMachine, field.ErrorList) {
	if !instancetype.HasReferences(vm) {
		return vm, nil
	}
	if v.Reader == nil {
		return vm, field.ErrorList{field.InternalError(field.NewPath("spec", "instancetype"), errors.New("this validator cannot read instancetypes and preferences"))}
	}
	res, err := (&instancetype.Resolver{Reader: v.Reader}).Find(ctx, vm)
	var ie *instancetype.Error
	switch {
	case errors.As(err, &ie):
		return vm, field.ErrorList{ie.FieldError()}
	case err != nil:
		return vm, field.ErrorList{field.InternalError(field.NewPath("spec", "instancetype"), err)}
	}
	spec, annotations, errs := instancetype.Expand(vm, res)
	if len(errs) > 0 {
		return vm, errs
	}
	out := vm.DeepCopy()
	out.Spec.Template.Spec, out.Spec.Template.ObjectMeta.Annotations = *spec, annotations
	return out, nil
}

func (v *VMValidator) checkExpanded(vm *v1alpha1.VirtualMachine) field.ErrorList {
	vm = defaulted(vm)
	p := field.NewPath("spec", "template", "spec")
	errs := append(v1alpha1.ValidateVirtualMachine(vm), v1alpha1.NotRealisedVM(&vm.Spec)...)
	return append(errs, checkRunnable(v.Config.Get(), vm.Namespace, &vm.Spec.Template.Spec, p)...)
}

// defaulted is a copy of vm whose template has the defaults an instance gets at creation, as
// KubeVirt's VM admitter validates it.
func defaulted(vm *v1alpha1.VirtualMachine) *v1alpha1.VirtualMachine {
	vm = vm.DeepCopy()
	v1alpha1.SetDefaults(&vm.Spec.Template.Spec)
	return vm
}

// VMIValidator validates VirtualMachineInstances: the whole spec at creation; on update the disk
// and NIC hotplug rules (v1alpha1.ValidateVirtualMachineInstanceUpdate; the CRD's CEL rules already
// froze every other field) and the allowed host paths of added hostDisk volumes.
type VMIValidator struct{ Config *config.Store }

// ValidateCreate implements admission.Validator.
func (v *VMIValidator) ValidateCreate(_ context.Context, vmi *v1alpha1.VirtualMachineInstance) (admission.Warnings, error) {
	p := field.NewPath("spec")
	errs := v1alpha1.ValidateVirtualMachineInstanceSpec(&vmi.Spec, p)
	errs = append(errs, checkRunnable(v.Config.Get(), vmi.Namespace, &vmi.Spec, p)...)
	return warnings(&vmi.Spec, p), invalid("VirtualMachineInstance", vmi.Name, errs)
}

// ValidateUpdate implements admission.Validator. Host paths are checked only for added volumes:
// a volume attached under an earlier allowedHostPaths stays, and metadata updates (finalizers)
// never fail on it. Likewise a hot-plug may not add what this version cannot run, but what the
// instance already had is not held against it (ratchet). Status updates go through the status
// subresource and do not reach this webhook.
func (v *VMIValidator) ValidateUpdate(_ context.Context, old, vmi *v1alpha1.VirtualMachineInstance) (admission.Warnings, error) {
	p := field.NewPath("spec")
	errs := v1alpha1.ValidateVirtualMachineInstanceUpdate(old, vmi)
	errs = append(errs, validateHostPaths(v.Config.Get(), vmi.Namespace, &vmi.Spec, p, v1alpha1.AddedVolumes(old, vmi))...)
	errs = append(errs, ratchet(v1alpha1.NotRealised(&vmi.Spec, p), v1alpha1.NotRealised(&old.Spec, p))...)
	var warn admission.Warnings
	if was, _, _ := v1alpha1.LiveMigratable(&old.Spec); was {
		warn = warnings(&vmi.Spec, p) // an added host disk or bridge interface ends live migration
	}
	return warn, invalid("VirtualMachineInstance", vmi.Name, errs)
}

// ValidateDelete implements admission.Validator.
func (v *VMIValidator) ValidateDelete(context.Context, *v1alpha1.VirtualMachineInstance) (admission.Warnings, error) {
	return nil, nil
}

// checkRunnable refuses, beyond validation, what the launcher would refuse at start: what this
// version does not realise (v1alpha1.NotRealised), and what the cluster's configuration rules out
// (host disks outside the namespace's host disk directories, the host CPU model under emulation),
// and a multus network of another namespace.
// p is spec's path.
func checkRunnable(cfg config.Config, namespace string, spec *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	errs := v1alpha1.NotRealised(spec, p)
	errs = append(errs, v1alpha1.ValidateMultusNamespaces(spec, namespace, p)...)
	errs = append(errs, validateHostPaths(cfg, namespace, spec, p, allVolumes(spec))...)
	errs = append(errs, validateVirtiofs(cfg, spec, p)...)
	errs = append(errs, validatePasst(cfg, spec, p)...)
	errs = append(errs, validateDownwardMetrics(cfg, spec, p)...)
	return append(errs, validateEmulation(cfg, spec, p)...)
}

// validateVirtiofs refuses filesystems unless the cluster enabled them (see
// config.Config.EnableVirtiofs for what enabling costs).
func validateVirtiofs(cfg config.Config, spec *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	if cfg.EnableVirtiofs || len(spec.Domain.Devices.Filesystems) == 0 {
		return nil
	}
	return field.ErrorList{field.Forbidden(p.Child("domain", "devices", "filesystems"), fmt.Sprintf(
		"virtiofs filesystems are not enabled in this cluster (enableVirtiofs in ConfigMap %s): their launcher pod runs without a seccomp profile, "+
			"because QEMU 7.2's virtiofsd sandboxes itself in a user namespace; share the volume as a disk instead", config.ConfigMapName))}
}

// validatePasst refuses the passt binding unless the cluster enabled it (see
// config.Config.EnablePasstBinding for what enabling costs).
func validatePasst(cfg config.Config, spec *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	if cfg.EnablePasstBinding {
		return nil
	}
	var errs field.ErrorList
	for i, in := range spec.Domain.Devices.Interfaces {
		if in.IsPasst() {
			errs = append(errs, field.Forbidden(p.Child("domain", "devices", "interfaces").Index(i).Child("binding"), fmt.Sprintf(
				"the passt binding is not enabled in this cluster (enablePasstBinding in ConfigMap %s, as KubeVirt needs its passt plugin registered): "+
					"its launcher pod runs without a seccomp profile, because passt sandboxes itself in a user namespace; use masquerade instead", config.ConfigMapName)))
		}
	}
	return errs
}

// validateDownwardMetrics refuses the downward metrics port unless the cluster enabled it (see
// config.Config.EnableDownwardMetrics).
func validateDownwardMetrics(cfg config.Config, spec *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	if cfg.EnableDownwardMetrics || spec.Domain.Devices.DownwardMetrics == nil {
		return nil
	}
	return field.ErrorList{field.Forbidden(p.Child("domain", "devices", "downwardMetrics"), fmt.Sprintf(
		"downward metrics are not enabled in this cluster (enableDownwardMetrics in ConfigMap %s): they show the guest its node's load", config.ConfigMapName))}
}

// validateEmulation refuses the host CPU models (host-passthrough, host-model) where guests run
// under emulation: they need KVM.
func validateEmulation(cfg config.Config, spec *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	cpu := spec.Domain.CPU
	if !cfg.UseEmulation || cpu == nil || (cpu.Model != "host-passthrough" && cpu.Model != "host-model" && cpu.Model != "host") {
		return nil
	}
	return field.ErrorList{field.Forbidden(p.Child("domain", "cpu", "model"), fmt.Sprintf(
		"%s needs KVM, and this cluster runs guests under emulation (useEmulation in ConfigMap %s); use a named model such as qemu64 or max",
		cpu.Model, config.ConfigMapName))}
}

// ratchet is errs without those old had too: an update is refused for the problems it adds, not
// for those of an object admitted under earlier rules or another configuration (as Kubernetes'
// CRD validation ratcheting does). Errors are matched by their whole text (field, type, value,
// detail), so a problem that moves to another index counts as new.
func ratchet(errs, old field.ErrorList) field.ErrorList {
	had := map[string]bool{}
	for _, e := range old {
		had[e.Error()] = true
	}
	var out field.ErrorList
	for _, e := range errs {
		if !had[e.Error()] {
			out = append(out, e)
		}
	}
	return out
}

// allVolumes are the indexes of every volume of spec.
func allVolumes(spec *v1alpha1.VirtualMachineInstanceSpec) []int {
	out := make([]int, len(spec.Volumes))
	for i := range out {
		out[i] = i
	}
	return out
}

// validateHostPaths refuses, among the volumes at the indexes given, host disks of an instance in
// namespace that the configuration does not allow: hostDisk must be enabled for the namespace
// (hostDiskNamespaces), and the image must lie in the namespace's own directory under an allowed
// host path (<allowed path>/<namespace>/), so one tenant cannot name another's images.
func validateHostPaths(cfg config.Config, namespace string, spec *v1alpha1.VirtualMachineInstanceSpec, p *field.Path, volumes []int) field.ErrorList {
	var errs field.ErrorList
	for _, i := range volumes {
		v := spec.Volumes[i]
		if v.HostDisk == nil {
			continue
		}
		if _, ok := cfg.HostDiskDir(namespace, v.HostDisk.Path); ok {
			continue
		}
		fp := p.Child("volumes").Index(i).Child("hostDisk", "path")
		dirs := cfg.HostDiskDirs(namespace)
		var msg string
		switch {
		case len(dirs) == 0 && len(cfg.AllowedHostPaths) == 0:
			msg = fmt.Sprintf("hostDisk volumes are not enabled: no allowedHostPaths in ConfigMap %s", config.ConfigMapName)
		case len(dirs) == 0:
			msg = fmt.Sprintf("hostDisk volumes are not enabled for namespace %q (hostDiskNamespaces in ConfigMap %s)", namespace, config.ConfigMapName)
		default:
			msg = fmt.Sprintf("%s is not a clean path inside this namespace's host disk directories (%s)", v.HostDisk.Path, strings.Join(dirs, "/, ")+"/")
		}
		errs = append(errs, field.Forbidden(fp, msg))
	}
	return errs
}

// templateSpecPath is where a VirtualMachine keeps its instances' spec.
var templateSpecPath = field.NewPath("spec", "template", "spec")

// warnings tell users about accepted specs (at p) that will not behave as they may expect.
func warnings(spec *v1alpha1.VirtualMachineInstanceSpec, p *field.Path) admission.Warnings {
	w := admission.Warnings(v1alpha1.Ineffective(spec, p))
	if ok, _, msg := v1alpha1.LiveMigratable(spec); !ok {
		w = append(w, "this VM cannot be live-migrated: "+msg)
	}
	for _, d := range spec.Domain.Devices.Disks {
		if c := d.CDRom; c != nil && c.ReadOnly != nil && !*c.ReadOnly {
			w = append(w, fmt.Sprintf("cdrom %q has readonly: false, but a guest cannot write to a CD-ROM: it is attached read-only", d.Name))
		}
	}
	return w
}

func invalid(kind, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: kind}, name, errs)
}
