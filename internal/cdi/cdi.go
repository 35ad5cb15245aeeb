// Package cdi is what qvirt knows of CDI's DataVolume API (cdi.kubevirt.io/v1beta1): its kind and
// the phases qvirt tells apart. qvirt links no CDI package; DataVolumes are read and written as
// unstructured objects, of which only metadata, spec (a VM's template, copied) and status.phase,
// status.progress and status.conditions[].message are used.
package cdi

import (
	"context"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DataVolumeGVK is CDI's DataVolume kind.
var DataVolumeGVK = schema.GroupVersionKind{Group: "cdi.kubevirt.io", Version: "v1beta1", Kind: "DataVolume"}

// CDI's DataVolume phases that qvirt tells apart (CDI's DataVolumePhase).
const (
	Succeeded            = "Succeeded"
	Failed               = "Failed"
	WaitForFirstConsumer = "WaitForFirstConsumer"
	// PendingPopulation is a claim of a WaitForFirstConsumer storage class that CDI fills through
	// a volume populator: the claim binds only once it is populated, so the launcher pod, its
	// first consumer, starts the population and waits for it (KubeVirt starts the VM then too).
	PendingPopulation = "PendingPopulation"
)

// New is an empty DataVolume object named namespace/name.
func New(namespace, name string) *unstructured.Unstructured {
	dv := &unstructured.Unstructured{}
	dv.SetGroupVersionKind(DataVolumeGVK)
	dv.SetNamespace(namespace)
	dv.SetName(name)
	return dv
}

// Get reads a DataVolume. Without CDI installed the error is a meta.NoKindMatchError
// (meta.IsNoMatchError).
func Get(ctx context.Context, r client.Reader, namespace, name string) (*unstructured.Unstructured, error) {
	dv := New(namespace, name)
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, dv); err != nil {
		return nil, err
	}
	return dv, nil
}

// Phase is dv's status.phase, empty before CDI has looked at it.
func Phase(dv *unstructured.Unstructured) string {
	p, _, _ := unstructured.NestedString(dv.Object, "status", "phase")
	return p
}

// Usable says whether an instance may start on the DataVolume's claim in phase p.
func Usable(p string) bool { return p == Succeeded || p == PendingPopulation }

// DataSourceGVK is CDI's DataSource kind: a named pointer to a claim (or snapshot) that
// DataVolumes clone through spec.sourceRef, as KubeVirt's common boot sources are published.
var DataSourceGVK = schema.GroupVersionKind{Group: "cdi.kubevirt.io", Version: "v1beta1", Kind: "DataSource"}

// GetDataSource reads a DataSource; without CDI installed the error is a meta.NoKindMatchError.
func GetDataSource(ctx context.Context, r client.Reader, namespace, name string) (*unstructured.Unstructured, error) {
	ds := &unstructured.Unstructured{}
	ds.SetGroupVersionKind(DataSourceGVK)
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// Ref names a namespaced object; Namespace may be empty where the referrer's is meant.
type Ref struct{ Namespace, Name string }

// SourcePVC is the claim a DataVolume's spec (or a DataSource's) copies from, spec.source.pvc.
func SourcePVC(spec map[string]any) (Ref, bool) {
	pvc, ok, _ := unstructured.NestedStringMap(spec, "source", "pvc")
	if !ok || pvc["name"] == "" {
		return Ref{}, false
	}
	return Ref{Namespace: pvc["namespace"], Name: pvc["name"]}, true
}

// SourceDataSource is the DataSource a DataVolume's spec names in spec.sourceRef (kind
// DataSource, the only kind CDI has there).
func SourceDataSource(spec map[string]any) (Ref, bool) {
	ref, ok, _ := unstructured.NestedStringMap(spec, "sourceRef")
	if !ok || ref["kind"] != DataSourceGVK.Kind || ref["name"] == "" {
		return Ref{}, false
	}
	return Ref{Namespace: ref["namespace"], Name: ref["name"]}, true
}
