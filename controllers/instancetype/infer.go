package instancetype

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/cdi"
)

// infer is KubeVirt's inferFromVolume (pkg/instancetype/infer): the labels of what stands behind
// the named volume name the instancetype or preference and its kind (cluster-scoped when the kind
// label is absent). Behind a persistentVolumeClaim (or ephemeral) volume that is the claim; behind
// a dataVolume volume the DataVolume (the VM's template of that name, else the object, else, once
// the garbage collector took it, the claim of its name) and, when it has no such label, its
// source: the claim it clones or the DataSource it refers to, and that DataSource's claim. Under
// the Ignore policy a volume that names none gives no reference; under Reject (the default) it is
// an error.
func (r *Resolver) infer(ctx context.Context, vm *v1alpha1.VirtualMachine, k *kindSpec, volume string, policy *v1alpha1.InferFromVolumeFailurePolicy) (name, kind string, err error) {
	fp := k.path.Child("inferFromVolume")
	fail := func(detail string) (string, string, error) {
		if policy != nil && *policy == v1alpha1.IgnoreInferFromVolumeFailure {
			return "", "", nil
		}
		return "", "", &Error{Reason: ReasonInferFromVolume, Field: fp, Value: volume, Detail: detail}
	}
	var v *v1alpha1.Volume
	for i := range vm.Spec.Template.Spec.Volumes {
		if vm.Spec.Template.Spec.Volumes[i].Name == volume {
			v = &vm.Spec.Template.Spec.Volumes[i]
		}
	}
	if v == nil {
		return "", "", &Error{Reason: ReasonInferFromVolume, Field: fp, Value: volume, Detail: fmt.Sprintf("volume %q is not in spec.template.spec.volumes", volume)}
	}
	in := &inference{r: r, vm: vm, nameLabel: k.nameLabel, kindLabel: k.kindLabel}
	switch {
	case v.PersistentVolumeClaim != nil:
		name, kind, err = in.fromClaim(ctx, cdi.Ref{Name: v.PersistentVolumeClaim.ClaimName})
	case v.Ephemeral != nil && v.Ephemeral.PersistentVolumeClaim != nil:
		name, kind, err = in.fromClaim(ctx, cdi.Ref{Name: v.Ephemeral.PersistentVolumeClaim.ClaimName})
	case v.DataVolume != nil:
		name, kind, err = in.fromDataVolume(ctx, v.DataVolume.Name)
	default:
		return "", "", &Error{Reason: ReasonInferFromVolume, Field: fp, Value: volume, Detail: fmt.Sprintf(
			"volume %q is not a persistentVolumeClaim, ephemeral or dataVolume volume; only a claim's, DataVolume's or DataSource's labels can name the %s", volume, k.what)}
	}
	var miss inferMiss
	switch {
	case errors.As(err, &miss):
		return fail(fmt.Sprintf("volume %q: %s", volume, miss))
	case err != nil:
		return "", "", err
	case name == "":
		return fail(in.noLabel(volume))
	}
	return name, kind, nil
}

// inferMiss is what inferFromVolume did not find (an object, a source it can follow): under the
// Ignore policy it is no error.
type inferMiss string

func (m inferMiss) Error() string { return string(m) }

// inference follows one volume's chain of objects to the first whose labels name the instancetype
// or preference; name is "" when none does (trail lists what was looked at).
type inference struct {
	r                    *Resolver
	vm                   *v1alpha1.VirtualMachine
	nameLabel, kindLabel string
	trail                []string
}

// labelled records obj, described as what, and returns the name and kind its labels give.
func (in *inference) labelled(what string, labels map[string]string) (name, kind string) {
	in.trail = append(in.trail, what)
	return labels[in.nameLabel], labels[in.kindLabel]
}

// noLabel says that nothing on the trail has the name label.
func (in *inference) noLabel(volume string) string {
	if len(in.trail) == 1 {
		return fmt.Sprintf("%s of volume %q has no %s label", in.trail[0], volume, in.nameLabel)
	}
	return fmt.Sprintf("none of %s (behind volume %q) has the %s label", strings.Join(in.trail, ", "), volume, in.nameLabel)
}

// key is ref in the VM's namespace when it names none.
func (in *inference) key(ref cdi.Ref) client.ObjectKey {
	if ref.Namespace == "" {
		ref.Namespace = in.vm.Namespace
	}
	return client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}
}

// describe is kind "name", or kind "namespace/name" outside the VM's namespace.
func (in *inference) describe(kind string, key client.ObjectKey) string {
	if key.Namespace == in.vm.Namespace {
		return fmt.Sprintf("%s %q", kind, key.Name)
	}
	return fmt.Sprintf("%s %q", kind, key.Namespace+"/"+key.Name)
}

func (in *inference) fromClaim(ctx context.Context, ref cdi.Ref) (string, string, error) {
	key := in.key(ref)
	what := in.describe("PersistentVolumeClaim", key)
	pvc := &corev1.PersistentVolumeClaim{}
	if err := in.r.Reader.Get(ctx, key, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return "", "", inferMiss(what + " not found")
		}
		return "", "", fmt.Errorf("get %s: %w", what, err)
	}
	name, kind := in.labelled(what, pvc.Labels)
	return name, kind, nil
}

// fromDataVolume is KubeVirt's fromDataVolume: the VM's template of that name (its spec: a template
// has no labels of its own to look at, as in KubeVirt), else the DataVolume's labels and then its
// spec, else the claim CDI made under the DataVolume's name.
func (in *inference) fromDataVolume(ctx context.Context, name string) (string, string, error) {
	for i, t := range in.vm.Spec.DataVolumeTemplates {
		if t.ObjectMeta.Name != name {
			continue
		}
		var spec map[string]any
		if len(t.Spec.Raw) > 0 {
			if err := json.Unmarshal(t.Spec.Raw, &spec); err != nil {
				return "", "", inferMiss(fmt.Sprintf("spec.dataVolumeTemplates[%d] (DataVolume %q) has a spec that is no JSON object: %v", i, name, err))
			}
		}
		return in.fromDataVolumeSpec(ctx, fmt.Sprintf("DataVolume template %q", name), spec)
	}
	key := in.key(cdi.Ref{Name: name})
	what := in.describe("DataVolume", key)
	dv, err := found(what, cdi.DataVolumeGVK.GroupKind())(cdi.Get(ctx, in.r.Reader, key.Namespace, key.Name))
	switch {
	case err != nil:
		return "", "", err
	case dv == nil:
		// Garbage-collected once its claim was populated: the claim keeps its name.
		return in.fromClaim(ctx, cdi.Ref{Name: name})
	}
	if n, k := in.labelled(what, dv.GetLabels()); n != "" {
		return n, k, nil
	}
	spec, _, _ := unstructured.NestedMap(dv.Object, "spec")
	return in.fromDataVolumeSpec(ctx, what, spec)
}

// fromDataVolumeSpec follows a DataVolume's source: the claim it clones (spec.source.pvc) or the
// DataSource it names (spec.sourceRef). what describes the DataVolume.
func (in *inference) fromDataVolumeSpec(ctx context.Context, what string, spec map[string]any) (string, string, error) {
	if ref, ok := cdi.SourcePVC(spec); ok {
		return in.fromClaim(ctx, ref)
	}
	if ref, ok := cdi.SourceDataSource(spec); ok {
		return in.fromDataSource(ctx, ref)
	}
	return "", "", inferMiss(fmt.Sprintf("%s has neither a source.pvc nor a sourceRef to a DataSource to infer from", what))
}

func (in *inference) fromDataSource(ctx context.Context, ref cdi.Ref) (string, string, error) {
	key := in.key(ref)
	what := in.describe("DataSource", key)
	ds, err := found(what, cdi.DataSourceGVK.GroupKind())(cdi.GetDataSource(ctx, in.r.Reader, key.Namespace, key.Name))
	switch {
	case err != nil:
		return "", "", err
	case ds == nil:
		return "", "", inferMiss(what + " not found")
	}
	if n, k := in.labelled(what, ds.GetLabels()); n != "" {
		return n, k, nil
	}
	spec, _, _ := unstructured.NestedMap(ds.Object, "spec")
	if pvc, ok := cdi.SourcePVC(spec); ok {
		// A DataSource's claim without a namespace is in the DataSource's.
		if pvc.Namespace == "" {
			pvc.Namespace = key.Namespace
		}
		return in.fromClaim(ctx, pvc)
	}
	return "", "", nil
}

// found sorts the outcome of reading a CDI object described as what, of kind gk: CDI's CRD
// missing is an inferMiss; the object missing is nil, for the caller to look elsewhere.
func found(what string, gk schema.GroupKind) func(*unstructured.Unstructured, error) (*unstructured.Unstructured, error) {
	return func(obj *unstructured.Unstructured, err error) (*unstructured.Unstructured, error) {
		switch {
		case meta.IsNoMatchError(err):
			return nil, inferMiss(fmt.Sprintf("%s cannot be read: CDI is not installed (no %s)", what, gk))
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("get %s: %w", what, err)
		}
		return obj, nil
	}
}
