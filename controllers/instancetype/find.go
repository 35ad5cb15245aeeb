package instancetype

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Reasons of Error, which the VM controller reports in its Failure condition.
const (
	ReasonInstancetypeNotFound = "FailedFindInstancetype"
	ReasonPreferenceNotFound   = "FailedFindPreference"
	ReasonInferFromVolume      = "FailedInferFromVolume"
	ReasonRevision             = "FailedInstancetypeRevision"
	ReasonInvalid              = "InvalidInstancetype"
)

// Error is a reference a VM cannot be expanded from: a missing instancetype or preference, an
// inferFromVolume that finds nothing, an unreadable revision. Field is the VM's field it concerns.
type Error struct {
	Reason string
	Field  *field.Path
	// Value is the name not found, or empty.
	Value  string
	Detail string
	// missing marks a revision that does not exist.
	missing bool
}

func (e *Error) Error() string { return e.Field.String() + ": " + e.Detail }

// FieldError is e as a validation error of the VM.
func (e *Error) FieldError() *field.Error {
	typ := field.ErrorTypeInvalid
	if e.Reason == ReasonInstancetypeNotFound || e.Reason == ReasonPreferenceNotFound {
		typ = field.ErrorTypeNotFound
	}
	return &field.Error{Type: typ, Field: e.Field.String(), BadValue: e.Value, Detail: e.Detail}
}

// Resolution is what a VM's references resolve to: the instancetype's and the preference's specs
// (nil without a reference) and their status references (VirtualMachineStatus.InstancetypeRef
// and PreferenceRef).
type Resolution struct {
	Instancetype    *v1alpha1.VirtualMachineInstancetypeSpec
	InstancetypeRef *v1alpha1.InstancetypeStatusRef
	Preference      *v1alpha1.VirtualMachinePreferenceSpec
	PreferenceRef   *v1alpha1.InstancetypeStatusRef
}

// Resolver finds the instancetype and preference a VM refers to. Reader reads them, the VM's
// PersistentVolumeClaims (inferFromVolume) and ControllerRevisions; Client, when set, creates the
// revisions (Pin).
type Resolver struct {
	Reader client.Reader
	Client client.Client
}

// Find resolves vm's references without writing anything: the copies vm has pinned
// (spec.*.revisionName, else status.*Ref), else the objects as they are now. Admission uses it.
func (r *Resolver) Find(ctx context.Context, vm *v1alpha1.VirtualMachine) (*Resolution, error) {
	return r.resolve(ctx, vm, false)
}

// Pin is Find, and stores the objects of references not pinned yet in ControllerRevisions owned by
// vm (KubeVirt's revision.StoreControllerRevisions), so that later changes to the instancetype or
// preference do not reach vm's instances. The returned references are vm's new status references.
func (r *Resolver) Pin(ctx context.Context, vm *v1alpha1.VirtualMachine) (*Resolution, error) {
	return r.resolve(ctx, vm, true)
}

// kindSpec describes the instancetype or the preference side of a VM.
type kindSpec struct {
	what                     string // "instancetype" or "preference"
	path                     *field.Path
	namespaced, cluster      string
	notFound                 string
	nameLabel, kindLabel     string
	newObject                func(kind string) client.Object
	specOf                   func(o client.Object) any
	lowerNamespaced, lowerCl []string
	matcher                  func(vm *v1alpha1.VirtualMachine) (name, kind, revision, infer string, policy *v1alpha1.InferFromVolumeFailurePolicy, ok bool)
	statusRef                func(vm *v1alpha1.VirtualMachine) *v1alpha1.InstancetypeStatusRef
}

var instancetypeSide = kindSpec{
	what: "instancetype", path: instancetypePath,
	namespaced: v1alpha1.InstancetypeKind, cluster: v1alpha1.ClusterInstancetypeKind,
	notFound:  ReasonInstancetypeNotFound,
	nameLabel: v1alpha1.DefaultInstancetypeLabel, kindLabel: v1alpha1.DefaultInstancetypeKindLabel,
	lowerNamespaced: []string{v1alpha1.SingularInstancetypeKind, v1alpha1.PluralInstancetypeKind},
	lowerCl:         []string{v1alpha1.SingularClusterInstancetypeKind, v1alpha1.PluralClusterInstancetypeKind},
	newObject: func(kind string) client.Object {
		if kind == v1alpha1.InstancetypeKind {
			return &v1alpha1.VirtualMachineInstancetype{}
		}
		return &v1alpha1.VirtualMachineClusterInstancetype{}
	},
	specOf: func(o client.Object) any {
		switch o := o.(type) {
		case *v1alpha1.VirtualMachineInstancetype:
			return &o.Spec
		case *v1alpha1.VirtualMachineClusterInstancetype:
			return &o.Spec
		}
		return nil
	},
	matcher: func(vm *v1alpha1.VirtualMachine) (string, string, string, string, *v1alpha1.InferFromVolumeFailurePolicy, bool) {
		m := vm.Spec.Instancetype
		if m == nil {
			return "", "", "", "", nil, false
		}
		return m.Name, m.Kind, m.RevisionName, m.InferFromVolume, m.InferFromVolumeFailurePolicy, true
	},
	statusRef: func(vm *v1alpha1.VirtualMachine) *v1alpha1.InstancetypeStatusRef { return vm.Status.InstancetypeRef },
}

var preferenceSide = kindSpec{
	what: "preference", path: preferencePath,
	namespaced: v1alpha1.PreferenceKind, cluster: v1alpha1.ClusterPreferenceKind,
	notFound:  ReasonPreferenceNotFound,
	nameLabel: v1alpha1.DefaultPreferenceLabel, kindLabel: v1alpha1.DefaultPreferenceKindLabel,
	lowerNamespaced: []string{v1alpha1.SingularPreferenceKind, v1alpha1.PluralPreferenceKind},
	lowerCl:         []string{v1alpha1.SingularClusterPreferenceKind, v1alpha1.PluralClusterPreferenceKind},
	newObject: func(kind string) client.Object {
		if kind == v1alpha1.PreferenceKind {
			return &v1alpha1.VirtualMachinePreference{}
		}
		return &v1alpha1.VirtualMachineClusterPreference{}
	},
	specOf: func(o client.Object) any {
		switch o := o.(type) {
		case *v1alpha1.VirtualMachinePreference:
			return &o.Spec
		case *v1alpha1.VirtualMachineClusterPreference:
			return &o.Spec
		}
		return nil
	},
	matcher: func(vm *v1alpha1.VirtualMachine) (string, string, string, string, *v1alpha1.InferFromVolumeFailurePolicy, bool) {
		m := vm.Spec.Preference
		if m == nil {
			return "", "", "", "", nil, false
		}
		return m.Name, m.Kind, m.RevisionName, m.InferFromVolume, m.InferFromVolumeFailurePolicy, true
	},
	statusRef: func(vm *v1alpha1.VirtualMachine) *v1alpha1.InstancetypeStatusRef { return vm.Status.PreferenceRef },
}

// canonicalKind is kind in its CamelCase spelling; cluster-scoped when empty, as in KubeVirt.
func (k *kindSpec) canonicalKind(kind string) (string, bool) {
	switch {
	case kind == "" || kind == k.cluster:
		return k.cluster, true
	case kind == k.namespaced:
		return k.namespaced, true
	}
	for _, l := range k.lowerCl {
		if kind == l {
			return k.cluster, true
		}
	}
	for _, l := range k.lowerNamespaced {
		if kind == l {
			return k.namespaced, true
		}
	}
	return "", false
}

func (r *Resolver) resolve(ctx context.Context, vm *v1alpha1.VirtualMachine, pin bool) (*Resolution, error) {
	res := &Resolution{}
	itSpec, itRef, err := r.resolveSide(ctx, vm, &instancetypeSide, pin)
	if err != nil {
		return nil, err
	}
	prefSpec, prefRef, err := r.resolveSide(ctx, vm, &preferenceSide, pin)
	if err != nil {
		return nil, err
	}
	if itSpec != nil {
		res.Instancetype, res.InstancetypeRef = itSpec.(*v1alpha1.VirtualMachineInstancetypeSpec), itRef
	}
	if prefSpec != nil {
		res.Preference, res.PreferenceRef = prefSpec.(*v1alpha1.VirtualMachinePreferenceSpec), prefRef
	}
	return res, nil
}

// resolveSide resolves one reference; spec is nil when the VM has none (or inferFromVolume found
// none under the Ignore policy).
func (r *Resolver) resolveSide(ctx context.Context, vm *v1alpha1.VirtualMachine, k *kindSpec, pin bool) (spec any, ref *v1alpha1.InstancetypeStatusRef, err error) {
	name, kind, revision, infer, policy, ok := k.matcher(vm)
	if !ok {
		return nil, nil, nil
	}
	if name == "" && infer != "" {
		name, kind, err = r.infer(ctx, vm, k, infer, policy)
		if err != nil || name == "" {
			return nil, nil, err
		}
	}
	kind, ok = k.canonicalKind(kind)
	if !ok {
		return nil, nil, &Error{Reason: ReasonInvalid, Field: k.path.Child("kind"), Detail: fmt.Sprintf("unknown kind; use %s or %s", k.cluster, k.namespaced)}
	}
	ref = &v1alpha1.InstancetypeStatusRef{Name: name, Kind: kind}
	fromStatus := false
	if revision == "" {
		if st := k.statusRef(vm); st != nil && st.Name == name && st.Kind == kind && st.ControllerRevisionRef != nil {
			revision, fromStatus = st.ControllerRevisionRef.Name, true
		}
	}
	if revision != "" {
		spec, err := r.readRevision(ctx, vm, k, kind, revision)
		switch {
		case err == nil:
			ref.ControllerRevisionRef = &v1alpha1.ControllerRevisionRef{Name: revision}
			return spec, ref, nil
		case !fromStatus || !isMissingRevision(err):
			return nil, nil, err
		}
		// The revision recorded in the status is gone (deleted by hand): take a new copy.
	}
	obj := k.newObject(kind)
	key := client.ObjectKey{Name: name}
	if kind == k.namespaced {
		key.Namespace = vm.Namespace
	}
	if err := r.Reader.Get(ctx, key, obj); err != nil {
		if apierrors.IsNotFound(err) {
			where := "in the cluster"
			if key.Namespace != "" {
				where = "in namespace " + key.Namespace
			}
			return nil, nil, &Error{Reason: k.notFound, Field: k.path, Value: name, Detail: fmt.Sprintf("Failure to find %s: %s %q not found %s", k.what, kind, name, where)}
		}
		return nil, nil, fmt.Errorf("get %s %s: %w", kind, name, err)
	}
	if pin {
		rev, err := r.storeRevision(ctx, vm, kind, obj)
		if err != nil {
			return nil, nil, err
		}
		ref.ControllerRevisionRef = &v1alpha1.ControllerRevisionRef{Name: rev}
	}
	return k.specOf(obj), ref, nil
}

// revisionObject is what a ControllerRevision's data holds: the whole instancetype or preference
// object, as KubeVirt stores it (revision.CreateControllerRevision).
type revisionObject struct {
	metav1.TypeMeta `json:",inline"`
	Spec            json.RawMessage `json:"spec"`
}

func (r *Resolver) readRevision(ctx context.Context, vm *v1alpha1.VirtualMachine, k *kindSpec, kind, name string) (any, error) {
	cr := &appsv1.ControllerRevision{}
	if err := r.Reader.Get(ctx, client.ObjectKey{Namespace: vm.Namespace, Name: name}, cr); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &Error{Reason: ReasonRevision, Field: k.path.Child("revisionName"), Detail: fmt.Sprintf("ControllerRevision %q not found", name), missing: true}
		}
		return nil, fmt.Errorf("get ControllerRevision %s: %w", name, err)
	}
	var o revisionObject
	if err := json.Unmarshal(cr.Data.Raw, &o); err != nil {
		return nil, &Error{Reason: ReasonRevision, Field: k.path.Child("revisionName"), Detail: fmt.Sprintf("ControllerRevision %q does not hold a %s: %v", name, k.what, err)}
	}
	if o.Kind != kind || o.APIVersion != v1alpha1.GroupVersion.String() {
		return nil, &Error{Reason: ReasonRevision, Field: k.path.Child("revisionName"), Detail: fmt.Sprintf("ControllerRevision %q holds a %s %s, not a %s %s", name, o.APIVersion, o.Kind, v1alpha1.GroupVersion, kind)}
	}
	spec := k.specOf(k.newObject(kind))
	if err := json.Unmarshal(o.Spec, spec); err != nil {
		return nil, &Error{Reason: ReasonRevision, Field: k.path.Child("revisionName"), Detail: fmt.Sprintf("ControllerRevision %q: %v", name, err)}
	}
	return spec, nil
}

// RevisionName is KubeVirt's revision name (GetRevisionName): the VM, the object's name, UID and
// generation, so that one generation of one object is stored once per VM; shortened with a hash
// when longer than an object name may be.
func RevisionName(vmName string, obj client.Object) string {
	n := fmt.Sprintf("%s-%s-%s-%d", vmName, obj.GetName(), obj.GetUID(), obj.GetGeneration())
	const max = 253
	if len(n) <= max {
		return n
	}
	sum := sha256.Sum256([]byte(n))
	return fmt.Sprintf("%s-%x", n[:max-9], sum[:4])
}

// storeRevision creates the ControllerRevision holding obj for vm, or finds the one a previous
// pass created (its name says which object generation it holds).
func (r *Resolver) storeRevision(ctx context.Context, vm *v1alpha1.VirtualMachine, kind string, obj client.Object) (string, error) {
	if r.Client == nil {
		return "", errors.New("instancetype: Pin needs a Client")
	}
	name := RevisionName(vm.Name, obj)
	stored := obj.DeepCopyObject().(client.Object)
	stored.SetManagedFields(nil)
	stored.SetResourceVersion("")
	stored.GetObjectKind().SetGroupVersionKind(v1alpha1.GroupVersion.WithKind(kind))
	raw, err := json.Marshal(stored)
	if err != nil {
		return "", fmt.Errorf("encode %s %s: %w", kind, obj.GetName(), err)
	}
	labels := map[string]string{
		v1alpha1.VMNameLabel:             vm.Name,
		"instancetype.qvirt.io/kind":     kind,
		"instancetype.qvirt.io/name":     truncateLabel(obj.GetName()),
		"instancetype.qvirt.io/uid":      string(obj.GetUID()),
		"instancetype.qvirt.io/revision": fmt.Sprint(obj.GetGeneration()),
	}
	cr := &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: vm.Namespace, Labels: maps.Clone(labels),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vm, v1alpha1.GroupVersion.WithKind("VirtualMachine"))},
		},
		Data:     runtime.RawExtension{Raw: raw},
		Revision: obj.GetGeneration(),
	}
	if err := r.Client.Create(ctx, cr); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("store %s %s in ControllerRevision %s: %w", kind, obj.GetName(), name, err)
	}
	return name, nil
}

func truncateLabel(v string) string {
	if len(v) <= 63 {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return fmt.Sprintf("%s-%x", v[:54], sum[:4])
}

func isMissingRevision(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.missing
}

// Infer is KubeVirt's VM mutator step for inferFromVolume: a reference that names a volume rather
// than an object is replaced by the name and kind the volume's claim labels give (inferFromVolume
// and its policy cleared, as KubeVirt does), or removed when nothing is found under the Ignore
// policy. The stored VM then says which instancetype and preference it uses.
func (r *Resolver) Infer(ctx context.Context, vm *v1alpha1.VirtualMachine) error {
	if m := vm.Spec.Instancetype; m != nil && m.Name == "" && m.InferFromVolume != "" {
		name, kind, err := r.infer(ctx, vm, &instancetypeSide, m.InferFromVolume, m.InferFromVolumeFailurePolicy)
		switch {
		case err != nil:
			return err
		case name == "":
			vm.Spec.Instancetype = nil
		default:
			vm.Spec.Instancetype = &v1alpha1.InstancetypeMatcher{Name: name, Kind: kind}
		}
	}
	if m := vm.Spec.Preference; m != nil && m.Name == "" && m.InferFromVolume != "" {
		name, kind, err := r.infer(ctx, vm, &preferenceSide, m.InferFromVolume, m.InferFromVolumeFailurePolicy)
		switch {
		case err != nil:
			return err
		case name == "":
			vm.Spec.Preference = nil
		default:
			vm.Spec.Preference = &v1alpha1.PreferenceMatcher{Name: name, Kind: kind}
		}
	}
	return nil
}

// FindPreference is the preference vm refers to, as Find resolves it; nil when it has none.
func (r *Resolver) FindPreference(ctx context.Context, vm *v1alpha1.VirtualMachine) (*v1alpha1.VirtualMachinePreferenceSpec, error) {
	spec, _, err := r.resolveSide(ctx, vm, &preferenceSide, false)
	if err != nil || spec == nil {
		return nil, err
	}
	return spec.(*v1alpha1.VirtualMachinePreferenceSpec), nil
}
