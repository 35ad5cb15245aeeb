package v1alpha1

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestRealtimeVCPUs(t *testing.T) {
	four := func(mask string) *CPU { return &CPU{Sockets: 4, Cores: 1, Threads: 1, Realtime: &Realtime{Mask: mask}} }
	for _, tc := range []struct {
		mask string
		want []uint32
		err  string
	}{
		{"", []uint32{0, 1, 2, 3}, ""},
		{"0-3,^1", []uint32{0, 2, 3}, ""},
		{"^1,0-3", []uint32{0, 2, 3}, ""}, // an exclusion wins wherever it stands, as KubeVirt's
		{"0,2,3", []uint32{0, 2, 3}, ""},
		{" 2-3 ", []uint32{2, 3}, ""},
		{"3,3", []uint32{3}, ""},
		{"0-4", nil, "does not have: it has 4"},
		{"4", nil, "does not have"},
		{"3-1", nil, "ends before it starts"},
		{"^1", nil, "selects no vCPU"},
		{"0,,1", nil, "is not a vCPU index"},
		{"a", nil, "is not a vCPU index"},
		{"^0-2", nil, "is not a vCPU index"},
		{"-1", nil, "is not a vCPU index"},
		{"99999999999999999999", nil, "does not have"},
	} {
		got, err := RealtimeVCPUs(four(tc.mask))
		if tc.err == "" && (err != nil || !slices.Equal(got, tc.want)) || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("mask %q: %v, %v; want %v, error containing %q", tc.mask, got, err, tc.want, tc.err)
		}
	}
	if got, err := RealtimeVCPUs(&CPU{}); got != nil || err != nil {
		t.Errorf("without realtime: %v, %v; want none", got, err)
	}
}

func TestValidateRealtime(t *testing.T) {
	domain := func(edit func(*DomainSpec)) *DomainSpec {
		// KubeVirt's user guide's real-time example: dedicated CPUs, the NUMA mapping, huge pages.
		d := &DomainSpec{CPU: &CPU{Sockets: 2, Cores: 1, Threads: 1, DedicatedCPUPlacement: true, IsolateEmulatorThread: true,
			NUMA: &NUMA{GuestMappingPassthrough: &NUMAGuestMappingPassthrough{}}, Realtime: &Realtime{Mask: "0"}},
			Memory: &Memory{Hugepages: &Hugepages{PageSize: "2Mi"}}}
		edit(d)
		return d
	}
	for _, tc := range []struct {
		name string
		d    *DomainSpec
		path string
	}{
		{"KubeVirt's example", domain(func(*DomainSpec) {}), ""},
		{"NUMA without real-time", domain(func(d *DomainSpec) { d.CPU.Realtime = nil }), ""},
		{"real-time without dedicated CPUs", domain(func(d *DomainSpec) { d.CPU.DedicatedCPUPlacement, d.CPU.IsolateEmulatorThread = false, false }),
			"spec.domain.cpu.dedicatedCpuPlacement"},
		{"real-time without the NUMA mapping", domain(func(d *DomainSpec) { d.CPU.NUMA = nil }), "spec.domain.cpu.numa.guestMappingPassthrough"},
		{"NUMA with no strategy", domain(func(d *DomainSpec) { d.CPU.NUMA.GuestMappingPassthrough = nil }), "spec.domain.cpu.numa.guestMappingPassthrough"},
		{"NUMA without huge pages", domain(func(d *DomainSpec) { d.Memory = nil }), "spec.domain.memory.hugepages"},
		{"NUMA without dedicated CPUs", domain(func(d *DomainSpec) {
			d.CPU.Realtime, d.CPU.DedicatedCPUPlacement, d.CPU.IsolateEmulatorThread = nil, false, false
		}), "spec.domain.cpu.dedicatedCpuPlacement"},
		{"a mask beyond the vCPUs", domain(func(d *DomainSpec) { d.CPU.Realtime.Mask = "0-2" }), "spec.domain.cpu.realtime.mask"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := validateRealtime(tc.d, field.NewPath("spec", "domain"))
			if tc.path == "" && len(errs) != 0 || tc.path != "" && !hasPath(errs, tc.path) {
				t.Errorf("errors %v, want %s", errs, map[bool]string{true: "none", false: "one at " + tc.path}[tc.path == ""])
			}
		})
	}
}

// FuzzRealtimeMask: any mask gives vCPUs of the guest in ascending order, each once, or an error.
func FuzzRealtimeMask(f *testing.F) {
	for _, m := range []string{"", "0-3,^1", "^1,0-3", "3-1", "0,,1", "4294967295", "0-4294967295"} {
		f.Add(m, uint32(4))
	}
	f.Fuzz(func(t *testing.T, mask string, sockets uint32) {
		cpu := &CPU{Sockets: sockets, Cores: 1, Threads: 1, Realtime: &Realtime{Mask: mask}}
		got, err := RealtimeVCPUs(cpu)
		if err != nil {
			return
		}
		if len(got) == 0 {
			t.Fatalf("mask %q: no vCPU and no error", mask)
		}
		for i, v := range got {
			if uint64(v) >= VCPUs(cpu) || i > 0 && v <= got[i-1] {
				t.Fatalf("mask %q with %d vCPUs: %v", mask, VCPUs(cpu), got)
			}
		}
	})
}
