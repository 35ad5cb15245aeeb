package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
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

// Interface is the spec's interface named name, nil when there is none.
func (spec *VirtualMachineInstanceSpec) Interface(name string) *Interface {
	for i := range spec.Domain.Devices.Interfaces {
		if spec.Domain.Devices.Interfaces[i].Name == name {
			return &spec.Domain.Devices.Interfaces[i]
		}
	}
	return nil
}

// UsesPasst says whether an interface of spec has the passt binding.
func (spec *VirtualMachineInstanceSpec) UsesPasst() bool {
	return slices.ContainsFunc(spec.Domain.Devices.Interfaces, func(in Interface) bool { return in.IsPasst() })
}

// UsesUserMode says whether an interface of spec has a user-mode binding (passt or slirp).
func (spec *VirtualMachineInstanceSpec) UsesUserMode() bool {
	return slices.ContainsFunc(spec.Domain.Devices.Interfaces, func(in Interface) bool { return in.IsUserMode() })
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

// Split is the NetworkAttachmentDefinition's namespace and name; the namespace is "" when
// networkName names none.
func (m *MultusNetwork) Split() (namespace, name string) {
	if ns, n, ok := strings.Cut(m.NetworkName, "/"); ok {
		return ns, n
	}
	return "", m.NetworkName
}

// MultusGlobalNamespace is Multus's global namespace: its NetworkAttachmentDefinitions may be used
// from any namespace, as Multus's namespaceIsolation allows.
const MultusGlobalNamespace = "default"

// ValidateMultusNamespaces refuses a multus network whose NetworkAttachmentDefinition is named in a
// namespace other than namespace (the instance's) or MultusGlobalNamespace: another tenant's
// attachment must not be reachable by naming it, and Multus checks that (namespaceIsolation) for
// secondary networks only, not for the pod's default network. An unqualified default network is
// Multus's to resolve in its own namespace (an administrator's, as KubeVirt passes it). p is the
// spec's path.
func ValidateMultusNamespaces(spec *VirtualMachineInstanceSpec, namespace string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, n := range spec.Networks {
		if n.Multus == nil {
			continue
		}
		ns, _ := n.Multus.Split()
		if ns != "" && ns != namespace && ns != MultusGlobalNamespace {
			errs = append(errs, field.Forbidden(p.Child("networks").Index(i).Child("multus", "networkName"),
				fmt.Sprintf("a NetworkAttachmentDefinition of namespace %q: an instance may use those of its own namespace (%s) and of %q only", ns, namespace, MultusGlobalNamespace)))
		}
	}
	return errs
}
