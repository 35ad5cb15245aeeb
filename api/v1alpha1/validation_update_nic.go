package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// NIC hotplug: a user adds an interface to spec.domain.devices.interfaces together with the network
// of the same name in spec.networks, and removes both to unplug it. qvirt serves only the pod
// network, and (as in KubeVirt) only one interface can use it, so a NIC can be hot-plugged only
// into an instance that has no interface on the pod network; the node agent then sets up its host
// side (tap, bridge, NAT) in the launcher pod's network namespace as at start.

// hotplugNICModel is the one model a hot-plugged interface may have: the default, virtio.
const hotplugNICModel = "virtio"

// hotplugInterfaces are the interfaces old's status reports as attached while the guest ran.
func hotplugInterfaces(old *VirtualMachineInstance) map[string]bool {
	out := map[string]bool{}
	for _, in := range old.Status.Interfaces {
		if in.Hotplugged {
			out[in.Name] = true
		}
	}
	return out
}

// PodInterface is the name of spec's interface on the pod network, or "" when it has none.
func PodInterface(spec *VirtualMachineInstanceSpec) string {
	pod := map[string]bool{}
	for _, n := range spec.Networks {
		if n.Pod != nil {
			pod[n.Name] = true
		}
	}
	for _, in := range spec.Domain.Devices.Interfaces {
		if pod[in.Name] {
			return in.Name
		}
	}
	return ""
}

// AddedInterfaces are the indexes in vmi.Spec.Domain.Devices.Interfaces of the interfaces old does
// not have.
func AddedInterfaces(old, vmi *VirtualMachineInstance) []int {
	had := map[string]bool{}
	for _, in := range old.Spec.Domain.Devices.Interfaces {
		had[in.Name] = true
	}
	var out []int
	for i, in := range vmi.Spec.Domain.Devices.Interfaces {
		if !had[in.Name] {
			out = append(out, i)
		}
	}
	return out
}

func validateInterfaceUpdate(old, vmi *VirtualMachineInstance, p *field.Path) field.ErrorList {
	podIface := PodInterface(&old.Spec)
	added := func(in *Interface, p *field.Path) field.ErrorList {
		errs := ValidateHotplugInterface(in, p)
		if podIface != "" {
			errs = append(errs, field.Forbidden(p, fmt.Sprintf(
				"interface %q already uses the pod network and only one interface can; remove it before adding another", podIface)))
		}
		return errs
	}
	return validateListUpdate(old.Spec.Domain.Devices.Interfaces, vmi.Spec.Domain.Devices.Interfaces, listUpdate[Interface]{
		kind: "interface", name: func(in *Interface) string { return in.Name }, added: added,
		changed: "interface %q is attached: %s cannot change; remove the interface and add it again",
		hot:     hotplugInterfaces(old), statusField: interfaceHotplugStatus,
	}, p)
}

func validateNetworkUpdate(old, vmi *VirtualMachineInstance, p *field.Path) field.ErrorList {
	// A network goes with its interface (the spec's pairing rule), so the interface's status decides.
	return validateListUpdate(old.Spec.Networks, vmi.Spec.Networks, listUpdate[Network]{
		kind: "network", name: func(n *Network) string { return n.Name }, added: ValidateHotplugNetwork,
		changed: "network %q is in use: %s cannot change; remove the interface and network and add them again",
		hot:     hotplugInterfaces(old), statusField: interfaceHotplugStatus,
	}, p)
}

// ValidateHotplugInterface checks an interface added to a running instance: a virtio NIC (the
// model may be left empty) with the masquerade (the default) or bridge binding, not passt. p is the
// interface's path. Its network (same name, required by the spec's pairing rule) is
// ValidateHotplugNetwork's; whether the instance already has a pod interface is the caller's to
// check, as is everything ValidateVirtualMachineInstanceSpec checks (MACs, ports).
func ValidateHotplugInterface(in *Interface, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if in.Model != "" && in.Model != hotplugNICModel {
		errs = append(errs, field.NotSupported(p.Child("model"), in.Model, []string{hotplugNICModel}))
	}
	errs = append(errs, validateBinding(in, p)...)
	if in.Binding != nil {
		// passt connects to QEMU, and QEMU's slirp comes up, as the launcher starts it; a
		// hot-plugged NIC has a tap.
		errs = append(errs, field.Forbidden(p.Child("binding"), "an interface with a binding plugin (passt, slirp) cannot be hot-plugged: its network is started with the guest; use masquerade or bridge"))
	}
	return errs
}

// ValidateHotplugNetwork checks a network added to a running instance: only the pod network; a
// multus network is refused at its multus field, since Multus attaches a pod's networks when the
// pod starts and qvirt runs no controller that attaches more to a running pod (KubeVirt needs
// Multus's dynamic-networks controller for it). p is the network's path.
func ValidateHotplugNetwork(n *Network, p *field.Path) field.ErrorList {
	if n.Multus != nil {
		return field.ErrorList{field.Forbidden(p.Child("multus"), "a multus network cannot be hot-plugged: Multus attaches a pod's networks when the pod starts; add it to the spec and restart the VM")}
	}
	return nil
}
