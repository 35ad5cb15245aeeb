package uninstall

import (
	"testing"

	"k8s.io/utils/ptr"
)

func TestDescribeCountsALimitedList(t *testing.T) {
	three := []string{"ns/a", "ns/b", "ns/c"}
	for _, tc := range []struct {
		names     []string
		remaining *int64
		limited   bool
		want      string
	}{
		{three, ptr.To[int64](4997), true, "5000 VirtualMachineInstance: ns/a, ns/b, ns/c and 4997 more"},
		{three, nil, true, "3 or more VirtualMachineInstance: ns/a, ns/b, ns/c"},
		{three, ptr.To[int64](0), true, "3 VirtualMachineInstance: ns/a, ns/b, ns/c"},
		{three[:2], nil, true, "2 VirtualMachineInstance: ns/a, ns/b"},
		{append(three, "ns/d"), nil, false, "4 VirtualMachineInstance: ns/a, ns/b, ns/c and 1 more"},
	} {
		if got := describe("VirtualMachineInstance", tc.names, tc.remaining, tc.limited); got != tc.want {
			t.Errorf("describe(%v, remaining %v, limited %v) = %q, want %q", tc.names, tc.remaining, tc.limited, got, tc.want)
		}
	}
}
