// Package v1alpha1 holds the qvirt.io/v1alpha1 API: VirtualMachine, VirtualMachineInstance and
// VirtualMachineInstanceMigration. Field names and meanings follow KubeVirt's kubevirt.io/v1 wherever
// the concept exists, so a KubeVirt manifest runs after changing its apiVersion; fields qvirt does not
// support are absent from the schema and refused by the API server (kubectl validates strictly).
//
// +kubebuilder:object:generate=true
// +groupName=qvirt.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "qvirt.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
