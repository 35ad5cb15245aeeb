// Package v1alpha1 holds the qvirt.io/v1alpha1 API: VirtualMachine, VirtualMachineInstance,
// VirtualMachineInstanceMigration, and the instancetype and preference kinds. Field names and
// meanings follow KubeVirt's kubevirt.io/v1 (and instancetype.kubevirt.io/v1beta1) wherever the
// concept exists, so a KubeVirt manifest runs after changing its apiVersion; fields qvirt does not
// support are absent from the schema and refused by the API server (kubectl validates strictly).
//
// The package depends only on the standard library and k8s.io/api and apimachinery, so the launcher
// can import it without the controller's dependencies.
//
// +kubebuilder:object:generate=true
// +groupName=qvirt.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "qvirt.io", Version: "v1alpha1"}

	// SchemeBuilder registers the kinds of this package with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&VirtualMachine{}, &VirtualMachineList{},
		&VirtualMachineInstance{}, &VirtualMachineInstanceList{},
		&VirtualMachineInstanceMigration{}, &VirtualMachineInstanceMigrationList{},
		&MigrationPolicy{}, &MigrationPolicyList{},
		&VirtualMachineInstancetype{}, &VirtualMachineInstancetypeList{},
		&VirtualMachineClusterInstancetype{}, &VirtualMachineClusterInstancetypeList{},
		&VirtualMachinePreference{}, &VirtualMachinePreferenceList{},
		&VirtualMachineClusterPreference{}, &VirtualMachineClusterPreferenceList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
