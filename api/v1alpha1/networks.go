package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
)

// Network is the spec's network named name, or nil.
func (spec *VirtualMachineInstanceSpec) Network(name string) *Network {
	for i := range spec.Networks {
		if spec.Networks[i].Name == name {
			return &spec.Networks[i]
		}
	}
	return nil
}

// IsSecondary says whether n is a Multus network besides the pod's default one: its interface is
// an extra pod interface that Multus adds, named by MultusInterfaceName.
func (n *Network) IsSecondary() bool {
	return n.Multus != nil && !n.Multus.Default
}

// MultusInterfaceName is the pod interface Multus creates for the secondary network named
// network (the spec's name, not the NetworkAttachmentDefinition's): "pod" and the first 11 hex
// digits of the name's SHA-256, as KubeVirt names it, so the name fits a Linux interface (15
// bytes) whatever the network's name and stays the same for a migration target's pod.
func MultusInterfaceName(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "pod" + hex.EncodeToString(sum[:])[:11]
}
