package e2e

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// TestMemoryHotplug is KubeVirt's memory hotplug as a user drives it: a VM with memory.maxGuest
// runs, and `kubectl patch vm` raises its template's memory.guest; the running guest plugs the
// memory (no restart: it booted once) and counts 512 MiB more, the VMI's status.memory shows it,
// and the VM asks for no restart.
func TestMemoryHotplug(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	vm := demoVM(t, ns, "mem", v1alpha1.RunStrategyAlways)
	one, two := resource.MustParse("1Gi"), resource.MustParse("2Gi")
	vm.Spec.Template.Spec.Domain.Memory = &v1alpha1.Memory{Guest: &one, MaxGuest: &two}
	vmi, con := bootVM(t, vm)
	before := con.Number(t, `echo online > /sys/devices/system/memory/auto_online_blocks; modprobe virtio_mem; `+
		`echo "BEFORE-$(awk '/^MemTotal/ {print $2}' /proc/meminfo)-E""ND"`, "BEFORE")

	run(t, nil, kubectl, "patch", "vm", "mem", "-n", ns, "--type", "merge",
		"-p", `{"spec":{"template":{"spec":{"domain":{"memory":{"guest":"1536Mi"}}}}}}`)
	more := resource.MustParse("1536Mi")
	got := waitVMI(t, ns, "mem", time.Minute, "1536Mi in status.memory.guestCurrent", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && v.Status.Memory != nil && v.Status.Memory.GuestCurrent != nil && v.Status.Memory.GuestCurrent.Equal(more)
	})
	if got.UID != vmi.UID {
		t.Fatalf("the VM was restarted (VMI %s, was %s): want the memory plugged into the running guest", got.UID, vmi.UID)
	}
	if after := con.Number(t, `echo "AFTER-$(awk '/^MemTotal/ {print $2}' /proc/meminfo)-E""ND"`, "AFTER"); after-before != 512<<10 {
		t.Errorf("the guest's MemTotal went from %d to %d KiB, want 512 MiB more", before, after)
	}
	if strings.Count(con.Text(), "QVIRT-GUEST-READY") != 1 {
		t.Errorf("the guest booted again:\n%s", tail(con.Text()))
	}
	out := run(t, nil, kubectl, "get", "vm", "mem", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="RestartRequired")].status}`)
	if strings.TrimSpace(out) != "" {
		t.Errorf("the VM's RestartRequired condition is %q, want none", out)
	}
}
