package v1alpha1

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// A VirtualMachineInstance's spec is fixed at creation except for its disks and NICs: as in
// KubeVirt, a user (qvirtctl addvolume/removevolume) edits spec.volumes and spec.domain.devices.disks,
// or spec.domain.devices.interfaces and spec.networks (as virtctl addinterface does), and the node
// agent hot(un)plugs the difference. The CRD's CEL rules freeze every other field (one rule per
// field in HotplugImmutableFields, on the VMI's spec); ValidateVirtualMachineInstanceUpdate repeats
// that for Go callers and adds the per-disk rules CEL cannot afford within the API server's cost
// budget.

// hotplugMessage ends every refusal of a spec change.
const hotplugMessage = "only volumes, disks, interfaces and networks can be hot-plugged"

// ImmutableMessage is the refusal of a change to the spec field at path (e.g. spec.domain.memory),
// the same text the CRD's CEL rules give.
func ImmutableMessage(path string) string {
	return path + " is immutable; " + hotplugMessage
}

// HotplugImmutableFields lists, relative to spec, every spec field that cannot change after
// creation: the children of spec, spec.domain and spec.domain.devices except the hotplug fields.
// A test checks that the CRD has a CEL rule for each, so a field added to the types cannot
// silently become mutable.
func HotplugImmutableFields() []string {
	var out []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for _, f := range jsonFields(t) {
			path := prefix + f.name
			switch path {
			case "domain", "domain.devices":
				walk(f.typ, path+".")
				continue
			case "volumes", "domain.devices.disks", "networks", "domain.devices.interfaces":
				continue
			}
			out = append(out, path)
		}
	}
	walk(reflect.TypeFor[VirtualMachineInstanceSpec](), "")
	return out
}

// ValidateVirtualMachineInstanceUpdate checks a change of an instance: every spec field but the
// disks, volumes, interfaces and networks (and, with maxSockets, domain.cpu.sockets: CPU hotplug,
// validateSocketsUpdate; with maxGuest, domain.memory.guest: memory hotplug,
// validateGuestMemoryUpdate) is immutable; disks, volumes, interfaces and networks
// present at creation cannot change or go; a disk (an interface) can be removed only when old's
// status says it was hot-plugged (status.volumeStatus[].hotplugged, status.interfaces[].hotplugged);
// an added disk must be a virtio disk backed by a hostDisk or emptyDisk volume
// (ValidateHotplugDisk, ValidateHotplugVolume); an added interface must be a virtio NIC with the
// masquerade or bridge binding on the pod network, into an instance that has no interface on the
// pod network yet (ValidateHotplugInterface, ValidateHotplugNetwork).
// The cluster's allowed host paths are the caller's to check for added hostDisk volumes
// (AddedVolumes). An update that leaves the spec alone is always accepted, so metadata (finalizers)
// can change even for an instance created under older rules.
func ValidateVirtualMachineInstanceUpdate(old, vmi *VirtualMachineInstance) field.ErrorList {
	if equality.Semantic.DeepEqual(old.Spec, vmi.Spec) {
		return nil
	}
	p := field.NewPath("spec")
	var errs field.ErrorList
	cpuHotplug := old.Spec.Domain.CPU != nil && old.Spec.Domain.CPU.MaxSockets != 0
	memHotplug := hotplugsMemory(&old.Spec)
	skip := func(fp *field.Path) bool {
		return isHotplugField(fp) || cpuHotplug && fp.String() == "spec.domain.cpu.sockets" ||
			memHotplug && fp.String() == "spec.domain.memory.guest"
	}
	for _, fp := range specDiff(reflect.ValueOf(old.Spec), reflect.ValueOf(vmi.Spec), p, skip) {
		errs = append(errs, field.Forbidden(fp, ImmutableMessage(fp.String())))
	}
	errs = append(errs, validateSocketsUpdate(old, vmi, p.Child("domain", "cpu", "sockets"))...)
	errs = append(errs, validateGuestMemoryUpdate(old, vmi, p.Child("domain", "memory", "guest"))...)
	if old.Spec.Domain.Devices.DisableHotplug {
		errs = append(errs, hotplugDisabled(old, vmi, p)...)
		if len(errs) > 0 {
			return errs
		}
	}
	errs = append(errs, ValidateVirtualMachineInstanceSpec(&vmi.Spec, p)...)
	errs = append(errs, validateDiskUpdate(old, vmi, p.Child("domain", "devices", "disks"))...)
	errs = append(errs, validateVolumeUpdate(old, vmi, p.Child("volumes"))...)
	errs = append(errs, validateInterfaceUpdate(old, vmi, p.Child("domain", "devices", "interfaces"))...)
	return append(errs, validateNetworkUpdate(old, vmi, p.Child("networks"))...)
}

// validateSocketsUpdate checks a change of a running instance's sockets, which CPU hotplug
// allows when the instance has maxSockets: they may grow up to maxSockets, never shrink (the
// launcher plugs vCPUs, it does not unplug them). p is the sockets' path.
func validateSocketsUpdate(old, vmi *VirtualMachineInstance, p *field.Path) field.ErrorList {
	oc, nc := old.Spec.Domain.CPU, vmi.Spec.Domain.CPU
	if oc == nil || nc == nil || oc.MaxSockets == 0 || oc.Sockets == nc.Sockets {
		return nil
	}
	switch {
	case max(nc.Sockets, 1) < max(oc.Sockets, 1):
		return field.ErrorList{field.Forbidden(p, fmt.Sprintf("vCPUs cannot be unplugged: sockets can only grow from %d, up to maxSockets; restart the VM for fewer", max(oc.Sockets, 1)))}
	case nc.Sockets > oc.MaxSockets:
		return field.ErrorList{field.Invalid(p, nc.Sockets, fmt.Sprintf("must be at most maxSockets (%d)", oc.MaxSockets))}
	}
	return nil
}

// AddedVolumes are the indexes in vmi.Spec.Volumes of the volumes old does not have.
func AddedVolumes(old, vmi *VirtualMachineInstance) []int {
	had := map[string]bool{}
	for _, v := range old.Spec.Volumes {
		had[v.Name] = true
	}
	var out []int
	for i, v := range vmi.Spec.Volumes {
		if !had[v.Name] {
			out = append(out, i)
		}
	}
	return out
}

// hotplugDisabled refuses any change of the four hot-plug lists of an instance created with
// spec.domain.devices.disableHotplug.
func hotplugDisabled(old, vmi *VirtualMachineInstance, p *field.Path) field.ErrorList {
	const msg = "hot-plug is disabled for this instance (spec.domain.devices.disableHotplug)"
	o, n := &old.Spec, &vmi.Spec
	lists := []struct {
		path     *field.Path
		old, new any
	}{
		{p.Child("volumes"), o.Volumes, n.Volumes},
		{p.Child("domain", "devices", "disks"), o.Domain.Devices.Disks, n.Domain.Devices.Disks},
		{p.Child("networks"), o.Networks, n.Networks},
		{p.Child("domain", "devices", "interfaces"), o.Domain.Devices.Interfaces, n.Domain.Devices.Interfaces},
	}
	var errs field.ErrorList
	for _, l := range lists {
		if !equality.Semantic.DeepEqual(l.old, l.new) {
			errs = append(errs, field.Forbidden(l.path, msg))
		}
	}
	return errs
}

func isHotplugField(p *field.Path) bool {
	s := p.String()
	return s == "spec.volumes" || s == "spec.domain.devices.disks" || s == "spec.networks" || s == "spec.domain.devices.interfaces"
}

// hotplugged are the volumes old's status reports as attached while the guest ran.
func hotplugged(old *VirtualMachineInstance) map[string]bool {
	out := map[string]bool{}
	for _, vs := range old.Status.VolumeStatus {
		if vs.Hotplugged {
			out[vs.Name] = true
		}
	}
	return out
}

func validateDiskUpdate(old, vmi *VirtualMachineInstance, p *field.Path) field.ErrorList {
	return validateListUpdate(old.Spec.Domain.Devices.Disks, vmi.Spec.Domain.Devices.Disks, listUpdate[Disk]{
		kind: "disk", name: func(d *Disk) string { return d.Name }, added: ValidateHotplugDisk,
		changed: "disk %q is attached: %s cannot change; remove the disk and add it again",
		hot:     hotplugged(old), statusField: volumeHotplugStatus,
	}, p)
}

func validateVolumeUpdate(old, vmi *VirtualMachineInstance, p *field.Path) field.ErrorList {
	return validateListUpdate(old.Spec.Volumes, vmi.Spec.Volumes, listUpdate[Volume]{
		kind: "volume", name: func(v *Volume) string { return v.Name }, added: ValidateHotplugVolume,
		changed: "volume %q is attached: %s cannot change; remove the volume and add it again",
		hot:     hotplugged(old), statusField: volumeHotplugStatus,
	}, p)
}

// listUpdate describes one hot-pluggable list of the spec (disks, volumes, interfaces, networks)
// for validateListUpdate.
type listUpdate[T any] struct {
	kind string
	name func(*T) string
	// added checks an item the update adds.
	added func(*T, *field.Path) field.ErrorList
	// changed is the refusal of a change to an existing item; it takes the name and the field.
	changed string
	// hot are the names the status says were hot-plugged: only those may be removed;
	// statusField names that status in the refusal.
	hot         map[string]bool
	statusField string
}

// validateListUpdate checks a hot-pluggable list: items present before cannot change, added
// items must pass u.added, removed items must have been hot-plugged.
func validateListUpdate[T any](old, cur []T, u listUpdate[T], p *field.Path) field.ErrorList {
	before := map[string]*T{}
	for i := range old {
		before[u.name(&old[i])] = &old[i]
	}
	var errs field.ErrorList
	for i := range cur {
		item := &cur[i]
		name := u.name(item)
		prev, ok := before[name]
		delete(before, name)
		if !ok {
			errs = append(errs, u.added(item, p.Index(i))...)
			continue
		}
		for _, fp := range specDiff(reflect.ValueOf(*prev), reflect.ValueOf(*item), p.Index(i), nil) {
			errs = append(errs, field.Forbidden(fp, fmt.Sprintf(u.changed, name, fp)))
		}
	}
	return append(errs, validateRemovals(u.kind, slices.Sorted(maps.Keys(before)), u.hot, u.statusField, p)...)
}

// The status fields that mark a device hot-plugged, named in refusals of a removal.
const (
	volumeHotplugStatus    = "status.volumeStatus[].hotplugged"
	interfaceHotplugStatus = "status.interfaces[].hotplugged"
)

// validateRemovals refuses removing what was not hot-plugged: the guest booted with it. statusField
// is where hot says so.
func validateRemovals(kind string, removed []string, hot map[string]bool, statusField string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, name := range removed {
		if !hot[name] {
			errs = append(errs, field.Forbidden(p.Key(name), fmt.Sprintf(
				"%s %q was attached at start and cannot be removed; only hot-plugged %ss (%s) can be removed", kind, name, kind, statusField)))
		}
	}
	return errs
}

// ValidateHotplugDisk checks a disk added to a running instance: a hard disk (not a CD-ROM) on the
// virtio bus with the hotplug defaults (cache none, io threads) and no boot order, plus the checks
// every disk gets. p is the disk's path.
func ValidateHotplugDisk(d *Disk, p *field.Path) field.ErrorList {
	errs := validateDisk(d, p, map[string]bool{}, map[uint32]string{})
	if d.CDRom != nil {
		errs = append(errs, field.Forbidden(p.Child("cdrom"), "only hard disks can be hot-plugged, not CD-ROMs"))
	}
	if d.LUN != nil {
		errs = append(errs, field.Forbidden(p.Child("lun"), "only hard disks can be hot-plugged, not LUNs"))
	}
	if d.Disk != nil && d.Disk.Bus != "" && d.Disk.Bus != DiskBusVirtio {
		errs = append(errs, field.NotSupported(p.Child("disk", "bus"), string(d.Disk.Bus), []string{string(DiskBusVirtio)}))
	}
	if d.BootOrder != nil {
		errs = append(errs, field.Forbidden(p.Child("bootOrder"), "a hot-plugged disk cannot be a boot disk"))
	}
	if d.Cache != "" && d.Cache != CacheNone {
		errs = append(errs, field.NotSupported(p.Child("cache"), string(d.Cache), []string{string(CacheNone)}))
	}
	if d.IO != "" && d.IO != IOThreads {
		errs = append(errs, field.NotSupported(p.Child("io"), string(d.IO), []string{string(IOThreads)}))
	}
	if d.DedicatedIOThread != nil && *d.DedicatedIOThread {
		errs = append(errs, field.Forbidden(p.Child("dedicatedIOThread"), "a hot-plugged disk cannot have an I/O thread of its own: QEMU's threads are made when it starts (ioThreadsPolicy's threads serve hot-plugged disks too)"))
	}
	return errs
}

// ValidateHotplugVolume checks a volume added to a running instance: a hostDisk or an emptyDisk,
// plus the checks every volume gets. p is the volume's path.
func ValidateHotplugVolume(v *Volume, p *field.Path) field.ErrorList {
	errs := validateName(p.Child("name"), v.Name, map[string]bool{})
	if src := validateVolumeSource(&v.VolumeSource, p); len(src) > 0 {
		return append(errs, src...)
	}
	if v.HostDisk == nil && v.EmptyDisk == nil {
		errs = append(errs, field.Forbidden(p.Child(volumeSourceName(&v.VolumeSource)), "only hostDisk and emptyDisk volumes can be hot-plugged"))
	}
	return errs
}

// volumeSourceName is the JSON name of the one source a volume sets.
func volumeSourceName(s *VolumeSource) string {
	for _, f := range jsonFields(reflect.TypeFor[VolumeSource]()) {
		if !reflect.ValueOf(*s).FieldByIndex(f.index).IsNil() {
			return f.name
		}
	}
	return ""
}

type jsonField struct {
	name  string
	index []int
	typ   reflect.Type
}

// jsonFields are t's fields by JSON name, inline structs flattened as encoding/json does.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if f.Anonymous && strings.Contains(opts, "inline") {
			for _, sub := range jsonFields(f.Type) {
				sub.index = append([]int{i}, sub.index...)
				out = append(out, sub)
			}
			continue
		}
		out = append(out, jsonField{name: name, index: []int{i}, typ: f.Type})
	}
	return out
}

// ownType is a struct type of this package, which specDiff descends into; other types (quantities,
// core/v1 types, lists, maps) are compared whole.
func ownType(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && t.PkgPath() == reflect.TypeFor[Disk]().PkgPath()
}

// specDiff is the paths of the leaf fields that differ between a and b (values of the same type),
// descending into this package's structs; paths for which skip is true are left out.
func specDiff(a, b reflect.Value, p *field.Path, skip func(*field.Path) bool) []*field.Path {
	if skip != nil && skip(p) {
		return nil
	}
	t := a.Type()
	switch {
	case t.Kind() == reflect.Pointer && ownType(t.Elem()):
		if a.IsNil() || b.IsNil() {
			if a.IsNil() == b.IsNil() {
				return nil
			}
			return []*field.Path{p}
		}
		return specDiff(a.Elem(), b.Elem(), p, skip)
	case ownType(t):
		var out []*field.Path
		for _, f := range jsonFields(t) {
			out = append(out, specDiff(a.FieldByIndex(f.index), b.FieldByIndex(f.index), p.Child(f.name), skip)...)
		}
		return out
	}
	if equality.Semantic.DeepEqual(a.Interface(), b.Interface()) {
		return nil
	}
	return []*field.Path{p}
}
