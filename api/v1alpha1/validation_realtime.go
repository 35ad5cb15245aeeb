package v1alpha1

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateRealtime holds real-time vCPUs and the guest NUMA mapping to KubeVirt's rules
// (validateRealtime, validateNUMA in its VMI admitter): real-time needs dedicated CPUs and the NUMA
// mapping, the mapping needs dedicated CPUs (it follows their host nodes) and huge pages. Unlike
// KubeVirt, whose virt-handler only fails on a bad mask once the instance runs, the mask is checked
// here.
func validateRealtime(d *DomainSpec, p *field.Path) field.ErrorList {
	cpu, cp := d.CPU, p.Child("cpu")
	if cpu == nil {
		return nil
	}
	var errs field.ErrorList
	numa := cpu.NUMA != nil && cpu.NUMA.GuestMappingPassthrough != nil
	if cpu.NUMA != nil && !numa {
		errs = append(errs, field.Required(cp.Child("numa", "guestMappingPassthrough"), "the only NUMA topology strategy"))
	}
	if numa && !cpu.DedicatedCPUPlacement {
		errs = append(errs, field.Required(cp.Child("dedicatedCpuPlacement"),
			"must be set to true when spec.domain.cpu.numa.guestMappingPassthrough is used: the guest's NUMA nodes are those of its dedicated host CPUs"))
	}
	if numa && (d.Memory == nil || d.Memory.Hugepages == nil) {
		errs = append(errs, field.Required(p.Child("memory", "hugepages"),
			"must be requested when NUMA topology strategy is set in spec.domain.cpu.numa.guestMappingPassthrough"))
	}
	if cpu.Realtime == nil {
		return errs
	}
	if !cpu.DedicatedCPUPlacement {
		errs = append(errs, field.Required(cp.Child("dedicatedCpuPlacement"), "must be set to true when spec.domain.cpu.realtime is used"))
	}
	if !numa {
		errs = append(errs, field.Required(cp.Child("numa", "guestMappingPassthrough"), "must be defined when spec.domain.cpu.realtime is used"))
	}
	if _, err := RealtimeVCPUs(cpu); err != nil {
		errs = append(errs, field.Invalid(cp.Child("realtime", "mask"), cpu.Realtime.Mask, err.Error()))
	}
	return errs
}

var maskToken = regexp.MustCompile(`^(\^)?(\d+)(?:-(\d+))?$`)

// RealtimeVCPUs are the vCPUs cpu.realtime's mask selects, in ascending order: every vCPU when the
// mask is empty; else the indexes and ranges it lists less those it excludes (^N), whatever their
// order, as KubeVirt's parseCPUMask. A mask that names a vCPU the guest does not have, or selects
// none, is an error. None without realtime.
func RealtimeVCPUs(cpu *CPU) ([]uint32, error) {
	if cpu == nil || cpu.Realtime == nil {
		return nil, nil
	}
	// Past MaxVCPUs validation refuses the topology; the bound keeps a huge one from sizing the set.
	n := min(VCPUs(cpu), MaxVCPUs)
	mask := strings.TrimSpace(cpu.Realtime.Mask)
	if mask == "" {
		all := make([]uint32, n)
		for i := range all {
			all[i] = uint32(i)
		}
		return all, nil
	}
	in, out := map[uint64]bool{}, map[uint64]bool{}
	for _, tok := range strings.Split(mask, ",") {
		tok = strings.TrimSpace(tok)
		m := maskToken.FindStringSubmatch(tok)
		if m == nil || (m[1] != "" && m[3] != "") {
			return nil, fmt.Errorf("%q is not a vCPU index (N), a range (N-M) or an exclusion (^N): want a mask such as 0-3,^1", tok)
		}
		from, err := strconv.ParseUint(m[2], 10, 32)
		to := from
		if err == nil && m[3] != "" {
			to, err = strconv.ParseUint(m[3], 10, 32)
		}
		switch {
		case err != nil || to >= n:
			return nil, fmt.Errorf("%q names a vCPU the guest does not have: it has %d (0 to %d)", tok, n, n-1)
		case from > to:
			return nil, fmt.Errorf("range %q ends before it starts", tok)
		}
		for v := from; v <= to; v++ {
			if m[1] != "" {
				out[v] = true
			} else {
				in[v] = true
			}
		}
	}
	var vcpus []uint32
	for v := uint64(0); v < n; v++ {
		if in[v] && !out[v] {
			vcpus = append(vcpus, uint32(v))
		}
	}
	if len(vcpus) == 0 {
		return nil, fmt.Errorf("selects no vCPU: list the real-time vCPUs, or leave the mask empty for all of them")
	}
	return vcpus, nil
}
