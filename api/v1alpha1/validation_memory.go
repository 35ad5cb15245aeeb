package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Memory hotplug (memory.maxGuest), as KubeVirt's: the guest boots with memory.guest and the
// launcher's QEMU holds a virtio-mem device of the room up to maxGuest, which it plugs when
// memory.guest is raised on the running instance. Unlike KubeVirt, which live-migrates the
// instance to a pod sized for the new memory, qvirt plugs in place: the launcher pod is not
// resized, so it must be able to hold maxGuest from the start (no memory limit below it, no
// Guaranteed pod of dedicated CPUs whose limit is its request).

// MinHotplugGuestMemory is the least guest memory memory hotplug works with (KubeVirt's rule: a
// Linux guest needs that much at boot for the memory map of what may be plugged).
var MinHotplugGuestMemory = resource.MustParse("1Gi")

// memoryBlock is the virtio-mem block: memory.guest and maxGuest are whole blocks (KubeVirt's 2 MiB
// alignment; machine.MemoryBlockMiB).
const memoryBlock = 2 << 20

// validateMaxGuest checks memory hotplug's bound against the rest of the domain. p is the domain's path.
func validateMaxGuest(d *DomainSpec, p *field.Path) field.ErrorList {
	if d.Memory == nil || d.Memory.MaxGuest == nil {
		return nil
	}
	mp := p.Child("memory", "maxGuest")
	maxGuest := *d.Memory.MaxGuest
	if errs := validateMemorySize(mp, &maxGuest); len(errs) > 0 {
		return errs
	}
	guest := GuestMemory(d)
	var errs field.ErrorList
	switch {
	case maxGuest.Value()%memoryBlock != 0:
		errs = append(errs, field.Invalid(mp, QuantityText(maxGuest), "must be a whole number of 2Mi blocks (memory is plugged in those)"))
	case guest == nil:
		errs = append(errs, field.Required(p.Child("memory", "guest"), "memory hotplug needs memory.guest, the memory the guest boots with"))
	case maxGuest.Cmp(*guest) < 0:
		errs = append(errs, field.Invalid(mp, QuantityText(maxGuest), fmt.Sprintf("must be at least memory.guest (%s)", QuantityText(*guest))))
	}
	if guest != nil {
		errs = append(errs, validateHotplugGuest(*guest, p.Child("memory", "guest"))...)
	}
	if d.Memory.Hugepages != nil {
		errs = append(errs, field.Invalid(mp, QuantityText(maxGuest), "cannot be combined with memory.hugepages: "+
			"the hotplug room would need huge pages of its own reserved for the pod"))
	}
	if d.CPU != nil && d.CPU.DedicatedCPUPlacement {
		errs = append(errs, field.Invalid(mp, QuantityText(maxGuest), "cannot be combined with dedicatedCpuPlacement: the pod is Guaranteed, "+
			"its memory limit fixed at start, and qvirt plugs memory in place without resizing the pod"))
	}
	if lim, ok := d.Resources.Limits["memory"]; ok && lim.Cmp(maxGuest) < 0 {
		errs = append(errs, field.Invalid(p.Child("resources", "limits", "memory"), QuantityText(lim),
			fmt.Sprintf("must be at least memory.maxGuest (%s): qvirt plugs memory in place, in the pod the instance starts in", QuantityText(maxGuest))))
	}
	return errs
}

// validateHotplugGuest checks a guest memory under memory hotplug: at least
// MinHotplugGuestMemory, whole 2Mi blocks.
func validateHotplugGuest(guest resource.Quantity, p *field.Path) field.ErrorList {
	switch {
	case guest.Cmp(MinHotplugGuestMemory) < 0:
		return field.ErrorList{field.Invalid(p, QuantityText(guest), "must be at least 1Gi with memory.maxGuest (memory hotplug)")}
	case guest.Value()%memoryBlock != 0:
		return field.ErrorList{field.Invalid(p, QuantityText(guest), "must be a whole number of 2Mi blocks with memory.maxGuest (memory hotplug)")}
	}
	return nil
}

// hotplugsMemory is whether an instance has memory hotplug room, so memory.guest may change while
// it runs.
func hotplugsMemory(spec *VirtualMachineInstanceSpec) bool {
	return spec.Domain.Memory != nil && spec.Domain.Memory.MaxGuest != nil
}

// validateGuestMemoryUpdate checks a change of a running instance's memory.guest, which memory
// hotplug allows when the instance has maxGuest: it may grow up to maxGuest, never shrink (the
// launcher plugs memory, it does not unplug it). p is memory.guest's path.
func validateGuestMemoryUpdate(old, vmi *VirtualMachineInstance, p *field.Path) field.ErrorList {
	if !hotplugsMemory(&old.Spec) {
		return nil
	}
	og, ng := GuestMemory(&old.Spec.Domain), GuestMemory(&vmi.Spec.Domain)
	if og == nil || ng == nil || og.Cmp(*ng) == 0 {
		return nil
	}
	if ng.Cmp(*og) < 0 {
		return field.ErrorList{field.Forbidden(p, fmt.Sprintf("memory cannot be unplugged: memory.guest can only grow from %s, up to maxGuest; "+
			"restart the VM for less", QuantityText(*og)))}
	}
	if mg := old.Spec.Domain.Memory.MaxGuest; ng.Cmp(*mg) > 0 {
		return field.ErrorList{field.Invalid(p, QuantityText(*ng), fmt.Sprintf("must be at most maxGuest (%s)", QuantityText(*mg)))}
	}
	return nil // blocks: validateMaxGuest on the new spec
}

// ValidateInstancetypeMaxGuest checks an instancetype's memory.maxGuest as an instance's, so that
// the refusal comes when the instancetype is written, not when a VM using it starts. p is the
// instancetype spec's path.
func ValidateInstancetypeMaxGuest(spec *VirtualMachineInstancetypeSpec, p *field.Path) field.ErrorList {
	if spec.Memory.MaxGuest == nil {
		return nil
	}
	guest := spec.Memory.Guest
	d := &DomainSpec{Memory: &Memory{Guest: &guest, MaxGuest: spec.Memory.MaxGuest, Hugepages: spec.Memory.Hugepages}}
	if b := spec.CPU.DedicatedCPUPlacement; b != nil && *b {
		d.CPU = &CPU{DedicatedCPUPlacement: true}
	}
	return validateMaxGuest(d, p)
}
