package apiserver

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"

	apiextensionsopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// The group holds no stored objects: its resources exist only to hang subresources off. The
// generic API server still wants a kind per storage (for discovery, OpenAPI and the managed-fields
// type converter), so each resource has a kind that carries nothing but its type meta.

// VirtualMachineInstance is the kind of virtualmachineinstances and of its subresources.
type VirtualMachineInstance struct {
	metav1.TypeMeta `json:",inline"`
}

// VirtualMachine is the kind of virtualmachines and of its subresources.
type VirtualMachine struct {
	metav1.TypeMeta `json:",inline"`
}

// DeepCopyObject implements runtime.Object.
func (o *VirtualMachineInstance) DeepCopyObject() runtime.Object { c := *o; return &c }

// DeepCopyObject implements runtime.Object.
func (o *VirtualMachine) DeepCopyObject() runtime.Object { c := *o; return &c }

// OpenAPIModelName names the kind in the OpenAPI document.
func (VirtualMachineInstance) OpenAPIModelName() string {
	return "io.qvirt.subresources.v1alpha1.VirtualMachineInstance"
}

// OpenAPIModelName names the kind in the OpenAPI document.
func (VirtualMachine) OpenAPIModelName() string {
	return "io.qvirt.subresources.v1alpha1.VirtualMachine"
}

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	scheme.AddKnownTypes(sub.GroupVersion, &VirtualMachineInstance{}, &VirtualMachine{})
	metav1.AddToGroupVersion(scheme, sub.GroupVersion)
	// The generic server decodes options and writes Status in the unversioned meta types.
	unversioned := schema.GroupVersion{Version: "v1"}
	metav1.AddToGroupVersion(scheme, unversioned)
	scheme.AddUnversionedTypes(unversioned, &metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
}

// openAPIDefinitions are the generated definitions of the meta types (shipped with
// apiextensions-apiserver, which generates them for the same apimachinery) plus the two kinds
// above, which have no fields beyond their type meta.
func openAPIDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := apiextensionsopenapi.GetOpenAPIDefinitions(ref)
	defs[VirtualMachineInstance{}.OpenAPIModelName()] = typeMetaOnly("VirtualMachineInstance: the subresources of a qvirt.io VirtualMachineInstance.")
	defs[VirtualMachine{}.OpenAPIModelName()] = typeMetaOnly("VirtualMachine: the subresources of a qvirt.io VirtualMachine.")
	return defs
}

func typeMetaOnly(doc string) common.OpenAPIDefinition {
	str := func(d string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}, Description: d}}
	}
	return common.OpenAPIDefinition{Schema: spec.Schema{SchemaProps: spec.SchemaProps{
		Description: doc,
		Type:        []string{"object"},
		Properties: map[string]spec.Schema{
			"apiVersion": str("APIVersion of the object."),
			"kind":       str("Kind of the object."),
		},
	}}}
}
