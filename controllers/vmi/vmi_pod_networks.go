package vmi

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Multus's pod annotations (k8s.cni.cncf.io's network plumbing working group's specification).
const (
	// MultusNetworksAnnotation lists the pod's secondary networks, as JSON network selection
	// elements.
	MultusNetworksAnnotation = "k8s.v1.cni.cncf.io/networks"
	// MultusDefaultNetworkAnnotation replaces the cluster's default network of the pod.
	MultusDefaultNetworkAnnotation = "v1.multus-cni.io/default-network"
)

// multusSelection is one element of MultusNetworksAnnotation.
type multusSelection struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Interface string `json:"interface"`
	// MAC asks the attachment for the interface's macAddress (a plugin with the mac capability
	// sets it), as KubeVirt's MacRequest: networks that check the port's MAC then let the guest's
	// through.
	MAC string `json:"mac,omitempty"`
}

// addMultusNetworks asks Multus for the instance's multus networks, as KubeVirt's virt-controller
// does: each secondary network as an extra pod interface named v1alpha1.MultusInterfaceName of the
// network, where the node agent's bridge binding finds it, and a default one in place of the
// cluster's network. A secondary NetworkAttachmentDefinition named without a namespace is the
// instance's. (Admission refused other tenants' namespaces: v1alpha1.ValidateMultusNamespaces.)
func addMultusNetworks(pod *corev1.Pod, vmi *v1alpha1.VirtualMachineInstance) error {
	var secondary []multusSelection
	for _, n := range vmi.Spec.Networks {
		if n.Multus == nil {
			continue
		}
		if n.Multus.Default {
			// As KubeVirt: an unqualified name is Multus's to resolve, in its own namespace.
			metav1.SetMetaDataAnnotation(&pod.ObjectMeta, MultusDefaultNetworkAnnotation, n.Multus.NetworkName)
			continue
		}
		ns, name := n.Multus.Split()
		if ns == "" {
			ns = vmi.Namespace
		}
		sel := multusSelection{Name: name, Namespace: ns, Interface: v1alpha1.MultusInterfaceName(n.Name)}
		if in := vmi.Spec.Interface(n.Name); in != nil {
			sel.MAC = in.MacAddress
		}
		secondary = append(secondary, sel)
	}
	if len(secondary) == 0 {
		return nil
	}
	b, err := json.Marshal(secondary)
	if err != nil {
		return fmt.Errorf("spec.networks: the multus networks annotation: %w", err)
	}
	metav1.SetMetaDataAnnotation(&pod.ObjectMeta, MultusNetworksAnnotation, string(b))
	return nil
}
