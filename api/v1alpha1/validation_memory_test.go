package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// TestMaxGuest: memory hotplug's bound is accepted as KubeVirt accepts it (at least the guest
// memory, whole 2Mi blocks, guest at least 1Gi) and refused, naming the field, where qvirt's
// in-place plug could not hold it (huge pages, a Guaranteed pod of dedicated CPUs, a memory limit
// below maxGuest).
func TestMaxGuest(t *testing.T) {
	domain := func(guest, maxGuest string, edit ...func(*DomainSpec)) *DomainSpec {
		d := &DomainSpec{Memory: &Memory{Guest: ptr.To(resource.MustParse(guest)), MaxGuest: ptr.To(resource.MustParse(maxGuest))}}
		for _, e := range edit {
			e(d)
		}
		return d
	}
	for _, tc := range []struct {
		name string
		d    *DomainSpec
		path string
	}{
		{"room above the guest", domain("1Gi", "4Gi"), ""},
		{"no room", domain("2Gi", "2Gi"), ""},
		{"a limit covering maxGuest", domain("1Gi", "2Gi", func(d *DomainSpec) {
			d.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}
		}), ""},
		{"below the guest", domain("2Gi", "1Gi"), "spec.domain.memory.maxGuest"},
		{"beyond an int64 of bytes", domain("1Gi", "8Ei"), "spec.domain.memory.maxGuest"},
		{"part of a block", domain("1Gi", "2049Mi"), "spec.domain.memory.maxGuest"},
		{"guest below 1Gi", domain("512Mi", "2Gi"), "spec.domain.memory.guest"},
		{"guest in part of a block", domain("1025Mi", "2Gi"), "spec.domain.memory.guest"},
		{"huge pages", domain("1Gi", "2Gi", func(d *DomainSpec) { d.Memory.Hugepages = &Hugepages{PageSize: "2Mi"} }), "spec.domain.memory.maxGuest"},
		{"dedicated CPUs", domain("1Gi", "2Gi", func(d *DomainSpec) { d.CPU = &CPU{DedicatedCPUPlacement: true} }), "spec.domain.memory.maxGuest"},
		{"a limit below maxGuest", domain("1Gi", "2Gi", func(d *DomainSpec) {
			d.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
		}), "spec.domain.resources.limits.memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := validateMaxGuest(tc.d, field.NewPath("spec", "domain"))
			if tc.path == "" && len(errs) != 0 || tc.path != "" && !hasPath(errs, tc.path) {
				t.Errorf("errors %v, want %s", errs, map[bool]string{true: "none", false: "one at " + tc.path}[tc.path == ""])
			}
		})
	}
}
