package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// TestCPUHotplug is KubeVirt's CPU hotplug as a user drives it: a VM with maxSockets runs, and
// `kubectl patch vm` raises its template's sockets; the running guest gets the vCPU (no restart:
// the console's counter goes on), the VMI's status shows the new topology, and the VM asks for no
// restart.
func TestCPUHotplug(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	vm := demoVM(t, ns, "cpus", v1alpha1.RunStrategyAlways)
	vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 1, Threads: 1, MaxSockets: 2}
	vmi, con := bootVM(t, vm)

	run(t, nil, kubectl, "patch", "vm", "cpus", "-n", ns, "--type", "merge",
		"-p", `{"spec":{"template":{"spec":{"domain":{"cpu":{"sockets":2}}}}}}`)
	got := waitVMI(t, ns, "cpus", time.Minute, "two sockets in status.currentCPUTopology", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && v.Status.CurrentCPUTopology != nil && v.Status.CurrentCPUTopology.Sockets == 2
	})
	if got.UID != vmi.UID {
		t.Fatalf("the VM was restarted (VMI %s, was %s): want the vCPU plugged into the running guest", got.UID, vmi.UID)
	}
	from := len(con.Text())
	con.Send(t, `for i in $(seq 30); do [ -e /sys/devices/system/cpu/cpu1/online ] && break; sleep 1; done; `+
		`echo 1 > /sys/devices/system/cpu/cpu1/online; echo "PLUGGED-$(grep -c ^processor /proc/cpuinfo)-END"`)
	con.Expect(t, from, "PLUGGED-2-END", time.Minute)
	if strings.Count(con.Text(), "QVIRT-GUEST-READY") != 1 {
		t.Errorf("the guest booted again:\n%s", tail(con.Text()))
	}
	out := run(t, nil, kubectl, "get", "vm", "cpus", "-n", ns, "-o", `jsonpath={.status.conditions[?(@.type=="RestartRequired")].status}`)
	if strings.TrimSpace(out) != "" {
		t.Errorf("the VM's RestartRequired condition is %q, want none", out)
	}
}
