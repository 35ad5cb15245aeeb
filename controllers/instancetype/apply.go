// Package instancetype expands a VirtualMachine's instancetype and preference into the instances
// it creates, as KubeVirt's pkg/instancetype does: Apply is the pure expansion (apply/vmi.go and
// preference/apply), Resolver finds the instancetype and preference a VM refers to and keeps the
// copy it expands from in a ControllerRevision owned by the VM (find/ and revision/).
//
// The VM controller (controllers/vm) expands every instance it creates; the VM webhooks
// (controllers/admission) expand a VM's template to refuse conflicts and validate the result.
package instancetype

import (
	"fmt"
	"maps"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Paths of a VirtualMachine that expansion errors name.
var (
	templateSpecPath     = field.NewPath("spec", "template", "spec")
	templateMetadataPath = field.NewPath("spec", "template", "metadata")
	instancetypePath     = field.NewPath("spec", "instancetype")
	preferencePath       = field.NewPath("spec", "preference")
)

// conflict is KubeVirt's refusal of a VM field its instancetype also sets
// (pkg/instancetype/conflict: "VM field(s) %s conflicts with selected instance type"), naming the
// field and what the instancetype sets there.
func conflict(fp *field.Path, sets string) *field.Error {
	return field.Forbidden(fp, fmt.Sprintf("VM field %s conflicts with selected instance type, which sets %s; remove it from the VM", fp, sets))
}

// Apply expands instancetype it and preference pref (either may be nil) into spec, an instance's
// spec taken from a VM's template, and into annotations, the instance's annotations (created when
// needed). The instancetype's settings go in as they are, and a VM field it also sets is a
// conflict (KubeVirt's apply/vmi.go: node selector, scheduler, CPU, memory, I/O thread policy,
// annotations); on any conflict nothing of the preference is applied and the errors are
// returned. The preference then fills only what is still unset. Errors name the VM's fields
// (spec.template.spec...), or spec.instancetype and spec.preference for what the referenced
// objects themselves cannot do.
func Apply(spec *v1alpha1.VirtualMachineInstanceSpec, annotations *map[string]string, it *v1alpha1.VirtualMachineInstancetypeSpec, pref *v1alpha1.VirtualMachinePreferenceSpec) field.ErrorList {
	var errs field.ErrorList
	if it != nil {
		errs = append(errs, applyNodeSelector(spec, it)...)
		errs = append(errs, applySchedulerName(spec, it)...)
		errs = append(errs, applyCPU(spec, it, pref)...)
		errs = append(errs, applyMemory(spec, it)...)
		errs = append(errs, applyIOThreadsPolicy(spec, it)...)
		errs = append(errs, applyAnnotations(annotations, it.Annotations)...)
		if len(errs) > 0 {
			return errs
		}
	}
	if pref == nil {
		return nil
	}
	if errs := checkRequirements(spec, it, pref); len(errs) > 0 {
		return errs
	}
	applyPreference(spec, annotations, pref)
	return nil
}

func applyNodeSelector(spec *v1alpha1.VirtualMachineInstanceSpec, it *v1alpha1.VirtualMachineInstancetypeSpec) field.ErrorList {
	if it.NodeSelector == nil {
		return nil
	}
	if spec.NodeSelector != nil {
		return field.ErrorList{conflict(templateSpecPath.Child("nodeSelector"), "nodeSelector")}
	}
	spec.NodeSelector = maps.Clone(it.NodeSelector)
	return nil
}

func applySchedulerName(spec *v1alpha1.VirtualMachineInstanceSpec, it *v1alpha1.VirtualMachineInstancetypeSpec) field.ErrorList {
	if it.SchedulerName == "" {
		return nil
	}
	if spec.SchedulerName != "" {
		return field.ErrorList{conflict(templateSpecPath.Child("schedulerName"), "schedulerName")}
	}
	spec.SchedulerName = it.SchedulerName
	return nil
}

// applyCPU is KubeVirt's apply/cpu.go: the VM may set none of the CPU requests and limits, the
// topology, or the model when the instancetype names one; the instancetype's vCPUs are then laid
// out as the preference's preferredCPUTopology says.
func applyCPU(spec *v1alpha1.VirtualMachineInstanceSpec, it *v1alpha1.VirtualMachineInstancetypeSpec, pref *v1alpha1.VirtualMachinePreferenceSpec) field.ErrorList {
	d := &spec.Domain
	dp := templateSpecPath.Child("domain")
	sets := fmt.Sprintf("cpu.guest: %d", it.CPU.Guest)
	var errs field.ErrorList
	if _, ok := d.Resources.Requests[corev1.ResourceCPU]; ok {
		errs = append(errs, conflict(dp.Child("resources", "requests", "cpu"), sets))
	}
	if _, ok := d.Resources.Limits[corev1.ResourceCPU]; ok {
		errs = append(errs, conflict(dp.Child("resources", "limits", "cpu"), sets))
	}
	if c := d.CPU; c != nil {
		if c.Sockets != 0 {
			errs = append(errs, conflict(dp.Child("cpu", "sockets"), sets))
		}
		if c.Cores != 0 {
			errs = append(errs, conflict(dp.Child("cpu", "cores"), sets))
		}
		if c.Threads != 0 {
			errs = append(errs, conflict(dp.Child("cpu", "threads"), sets))
		}
		if c.Model != "" && it.CPU.Model != nil {
			errs = append(errs, conflict(dp.Child("cpu", "model"), "cpu.model: "+*it.CPU.Model))
		}
		if c.DedicatedCPUPlacement && it.CPU.DedicatedCPUPlacement != nil {
			errs = append(errs, conflict(dp.Child("cpu", "dedicatedCpuPlacement"), fmt.Sprintf("cpu.dedicatedCPUPlacement: %t", *it.CPU.DedicatedCPUPlacement)))
		}
		if c.IsolateEmulatorThread && it.CPU.IsolateEmulatorThread != nil {
			errs = append(errs, conflict(dp.Child("cpu", "isolateEmulatorThread"), fmt.Sprintf("cpu.isolateEmulatorThread: %t", *it.CPU.IsolateEmulatorThread)))
		}
		if c.MaxSockets != 0 && it.CPU.MaxSockets != nil {
			errs = append(errs, conflict(dp.Child("cpu", "maxSockets"), fmt.Sprintf("cpu.maxSockets: %d", *it.CPU.MaxSockets)))
		}
		if c.NUMA != nil && it.CPU.NUMA != nil {
			errs = append(errs, conflict(dp.Child("cpu", "numa"), "cpu.numa"))
		}
		if c.Realtime != nil && it.CPU.Realtime != nil {
			errs = append(errs, conflict(dp.Child("cpu", "realtime"), "cpu.realtime"))
		}
	}
	if len(errs) > 0 {
		return errs
	}
	if d.CPU == nil {
		d.CPU = &v1alpha1.CPU{}
	}
	if it.CPU.Model != nil {
		d.CPU.Model = *it.CPU.Model
	}
	if b := it.CPU.DedicatedCPUPlacement; b != nil {
		d.CPU.DedicatedCPUPlacement = *b
	}
	if b := it.CPU.IsolateEmulatorThread; b != nil {
		d.CPU.IsolateEmulatorThread = *b
	}
	if n := it.CPU.MaxSockets; n != nil {
		d.CPU.MaxSockets = *n
	}
	if it.CPU.NUMA != nil {
		d.CPU.NUMA = it.CPU.NUMA.DeepCopy()
	}
	if it.CPU.Realtime != nil {
		d.CPU.Realtime = it.CPU.Realtime.DeepCopy()
	}
	sockets, cores, threads, err := Topology(it.CPU.Guest, pref)
	if err != nil {
		return field.ErrorList{err}
	}
	d.CPU.Sockets, d.CPU.Cores, d.CPU.Threads = sockets, cores, threads
	return nil
}

// Topology lays vcpus out as the preference's preferredCPUTopology says (KubeVirt's
// applyGuestCPUTopology and CheckSpreadCPUTopology): all sockets by default (and for any), all
// cores, all threads, or a spread: SocketsCores puts ratio cores in each socket, CoresThreads two
// threads in each core, SocketsCoresThreads ratio cores of two threads in each socket. A spread
// that does not divide vcpus is refused rather than rounded.
func Topology(vcpus uint32, pref *v1alpha1.VirtualMachinePreferenceSpec) (sockets, cores, threads uint32, err *field.Error) {
	sockets, cores, threads = 1, 1, 1
	if vcpus <= 1 {
		return sockets, cores, threads, nil
	}
	switch preferredTopology(pref) {
	case v1alpha1.PreferCores, v1alpha1.DeprecatedPreferCores:
		cores = vcpus
	case v1alpha1.PreferThreads, v1alpha1.DeprecatedPreferThreads:
		threads = vcpus
	case v1alpha1.PreferSpread, v1alpha1.DeprecatedPreferSpread:
		ratio, across := spreadOptions(pref)
		fp := preferencePath.Child("cpu", "spreadOptions")
		switch across {
		case v1alpha1.SpreadAcrossCoresThreads:
			if ratio != 2 {
				return 0, 0, 0, field.Invalid(fp.Child("ratio"), ratio, "only a ratio of 2 threads per core is accepted across CoresThreads")
			}
			if vcpus%ratio != 0 {
				return 0, 0, 0, field.Invalid(instancetypePath, vcpus, fmt.Sprintf("the instancetype's %d vCPUs cannot be spread as %d threads per core", vcpus, ratio))
			}
			threads, cores = ratio, vcpus/ratio
		case v1alpha1.SpreadAcrossSocketsCoresThreads:
			if vcpus%(ratio*2) != 0 {
				return 0, 0, 0, field.Invalid(instancetypePath, vcpus, fmt.Sprintf("the instancetype's %d vCPUs cannot be spread as %d cores of 2 threads per socket", vcpus, ratio))
			}
			threads, cores, sockets = 2, ratio, vcpus/2/ratio
		default:
			if vcpus%ratio != 0 {
				return 0, 0, 0, field.Invalid(instancetypePath, vcpus, fmt.Sprintf("the instancetype's %d vCPUs cannot be spread as %d cores per socket", vcpus, ratio))
			}
			cores, sockets = ratio, vcpus/ratio
		}
	default: // sockets, any, or no preference
		sockets = vcpus
	}
	return sockets, cores, threads, nil
}

func preferredTopology(pref *v1alpha1.VirtualMachinePreferenceSpec) v1alpha1.PreferredCPUTopology {
	if pref != nil && pref.CPU != nil && pref.CPU.PreferredCPUTopology != nil {
		return *pref.CPU.PreferredCPUTopology
	}
	return v1alpha1.PreferSockets
}

// spreadOptions are KubeVirt's GetSpreadOptions: ratio 2 across SocketsCores unless the
// preference says otherwise (spreadOptions, else the deprecated preferSpreadSocketToCoreRatio).
func spreadOptions(pref *v1alpha1.VirtualMachinePreferenceSpec) (uint32, v1alpha1.SpreadAcross) {
	ratio, across := uint32(2), v1alpha1.SpreadAcrossSocketsCores
	if pref.PreferSpreadSocketToCoreRatio != 0 {
		ratio = pref.PreferSpreadSocketToCoreRatio
	}
	if so := pref.CPU.SpreadOptions; so != nil {
		if so.Ratio != nil && *so.Ratio != 0 {
			ratio = *so.Ratio
		}
		if so.Across != nil && *so.Across != "" {
			across = *so.Across
		}
	}
	return ratio, across
}

// applyMemory is KubeVirt's apply/memory.go: the VM may set neither memory.guest nor memory
// requests or limits; overcommitPercent lowers the pod's memory request below the guest memory.
func applyMemory(spec *v1alpha1.VirtualMachineInstanceSpec, it *v1alpha1.VirtualMachineInstancetypeSpec) field.ErrorList {
	d := &spec.Domain
	dp := templateSpecPath.Child("domain")
	sets := "memory.guest: " + it.Memory.Guest.String()
	var errs field.ErrorList
	if d.Memory != nil && d.Memory.Guest != nil {
		errs = append(errs, conflict(dp.Child("memory", "guest"), sets))
	}
	if _, ok := d.Resources.Requests[corev1.ResourceMemory]; ok {
		errs = append(errs, conflict(dp.Child("resources", "requests", "memory"), sets))
	}
	if _, ok := d.Resources.Limits[corev1.ResourceMemory]; ok {
		errs = append(errs, conflict(dp.Child("resources", "limits", "memory"), sets))
	}
	if hp := it.Memory.Hugepages; hp != nil && d.Memory != nil && d.Memory.Hugepages != nil {
		errs = append(errs, conflict(dp.Child("memory", "hugepages"), "memory.hugepages.pageSize: "+hp.PageSize))
	}
	if mg := it.Memory.MaxGuest; mg != nil && d.Memory != nil && d.Memory.MaxGuest != nil {
		errs = append(errs, conflict(dp.Child("memory", "maxGuest"), "memory.maxGuest: "+mg.String()))
	}
	if len(errs) > 0 {
		return errs
	}
	guest := it.Memory.Guest.DeepCopy()
	if d.Memory == nil {
		d.Memory = &v1alpha1.Memory{}
	}
	d.Memory.Guest = &guest
	if it.Memory.Hugepages != nil {
		d.Memory.Hugepages = it.Memory.Hugepages.DeepCopy()
	}
	if mg := it.Memory.MaxGuest; mg != nil {
		mg := mg.DeepCopy()
		d.Memory.MaxGuest = &mg
	}
	if pct := it.Memory.OvercommitPercent; pct > 0 {
		if d.Resources.Requests == nil {
			d.Resources.Requests = corev1.ResourceList{}
		}
		v, keep := guest.Value(), int64(100-pct)
		req := v/100*keep + v%100*keep/100 // v*keep/100 without overflow
		d.Resources.Requests[corev1.ResourceMemory] = *resource.NewQuantity(req, resource.BinarySI)
	}
	return nil
}

func applyIOThreadsPolicy(spec *v1alpha1.VirtualMachineInstanceSpec, it *v1alpha1.VirtualMachineInstancetypeSpec) field.ErrorList {
	if it.IOThreadsPolicy == nil {
		return nil
	}
	if spec.Domain.IOThreadsPolicy != nil {
		return field.ErrorList{conflict(templateSpecPath.Child("domain", "ioThreadsPolicy"), "ioThreadsPolicy: "+string(*it.IOThreadsPolicy))}
	}
	p := *it.IOThreadsPolicy
	spec.Domain.IOThreadsPolicy = &p
	return nil
}

// applyAnnotations is KubeVirt's apply/annotations.go: the instancetype's annotations are added;
// one the template sets to another value is a conflict.
func applyAnnotations(annotations *map[string]string, from map[string]string) field.ErrorList {
	if len(from) == 0 {
		return nil
	}
	if *annotations == nil {
		*annotations = map[string]string{}
	}
	var errs field.ErrorList
	for _, k := range sortedKeys(from) {
		if v, ok := (*annotations)[k]; ok {
			if v != from[k] {
				errs = append(errs, conflict(templateMetadataPath.Child("annotations").Key(k), fmt.Sprintf("annotation %s: %q", k, from[k])))
			}
			continue
		}
		(*annotations)[k] = from[k]
	}
	return errs
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// checkRequirements is KubeVirt's preference requirements check: the instancetype (or, without
// one, the VM itself) must give the guest at least the vCPUs and memory the preference requires.
func checkRequirements(spec *v1alpha1.VirtualMachineInstanceSpec, it *v1alpha1.VirtualMachineInstancetypeSpec, pref *v1alpha1.VirtualMachinePreferenceSpec) field.ErrorList {
	r := pref.Requirements
	if r == nil {
		return nil
	}
	var errs field.ErrorList
	if r.CPU != nil {
		if it != nil {
			if it.CPU.Guest < r.CPU.Guest {
				errs = append(errs, field.Invalid(instancetypePath, it.CPU.Guest, fmt.Sprintf(
					"insufficient CPU resources of %d vCPU provided by instance type, preference requires %d vCPU", it.CPU.Guest, r.CPU.Guest)))
			}
		} else if v := vcpusOf(spec); v < uint64(r.CPU.Guest) {
			errs = append(errs, field.Invalid(templateSpecPath.Child("domain", "cpu"), v, fmt.Sprintf(
				"insufficient CPU resources of %d vCPU provided by VirtualMachine, preference requires %d vCPU", v, r.CPU.Guest)))
		}
	}
	if r.Memory != nil {
		if it != nil {
			if it.Memory.Guest.Cmp(r.Memory.Guest) < 0 {
				errs = append(errs, field.Invalid(instancetypePath, it.Memory.Guest.String(), fmt.Sprintf(
					"insufficient Memory resources of %s provided by instance type, preference requires %s", it.Memory.Guest.String(), r.Memory.Guest.String())))
			}
		} else if m := v1alpha1.GuestMemory(&spec.Domain); m == nil || m.Cmp(r.Memory.Guest) < 0 {
			have := "none"
			if m != nil {
				have = m.String()
			}
			errs = append(errs, field.Invalid(templateSpecPath.Child("domain", "memory", "guest"), have, fmt.Sprintf(
				"insufficient Memory resources of %s provided by VirtualMachine, preference requires %s", have, r.Memory.Guest.String())))
		}
	}
	return errs
}

// vcpusOf is the vCPU count spec's instance gets, after the defaults derive a topology from
// resources when it sets none.
func vcpusOf(spec *v1alpha1.VirtualMachineInstanceSpec) uint64 {
	c := spec.DeepCopy()
	v1alpha1.SetDefaults(c)
	return v1alpha1.VCPUs(c.Domain.CPU)
}
