package e2e

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// TestGuestAgent: the demo guest starts qemu-ga at boot; its VMI gets AgentConnected,
// status.guestOSInfo and the guest's name for its interface (matched by MAC, the address still
// the pod's under masquerade); `qvirtctl guestosinfo` prints the agent's report. Killing qemu-ga
// in the guest removes AgentConnected and qvirtctl then says the agent is not connected.
func TestGuestAgent(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const name = "agent"
	_, con := startDemo(t, ns, name, v1alpha1.RunStrategyAlways)
	start := time.Now()
	vmi := waitVMI(t, ns, name, time.Minute, "AgentConnected, guestOSInfo and the guest's interface", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected)
		return c != nil && c.Status == metav1.ConditionTrue && v.Status.GuestOSInfo.ID != "" &&
			len(v.Status.Interfaces) > 0 && v.Status.Interfaces[0].InterfaceName != ""
	})
	t.Logf("guest agent report in the VMI %v after the guest's banner", time.Since(start).Round(time.Millisecond))
	if o := vmi.Status.GuestOSInfo; o.ID != "qvirt-test" || o.PrettyName != "qvirt test guest (busybox)" || o.Machine != "x86_64" ||
		!strings.HasPrefix(o.KernelRelease, "6.") {
		t.Errorf("guestOSInfo %+v", o)
	}
	in := vmi.Status.Interfaces[0]
	if in.Name != "default" || in.InterfaceName != "eth0" || in.InfoSource != "domain, guest-agent" || in.IP == "" {
		t.Errorf("interface %+v, want default as eth0 from domain and guest agent, with the pod's address", in)
	}

	out := mustQvirtctl(t, "-n", ns, "guestosinfo", name)
	for _, want := range []string{`"guestAgentVersion": "7.`, `"hostname": "` + name + `"`, `"prettyName": "qvirt test guest (busybox)"`, `"fsFreezeStatus": "thawed"`} {
		if !strings.Contains(out, want) {
			t.Errorf("qvirtctl guestosinfo printed no %s:\n%s", want, out)
		}
	}
	if out := mustQvirtctl(t, "-n", ns, "userlist", name); !strings.Contains(out, `"items": []`) {
		t.Errorf("qvirtctl userlist printed\n%s\nwant no users", out)
	}
	mustQvirtctl(t, "-n", ns, "filesystemlist", name)

	con.Send(t, "kill $(pidof qemu-ga)")
	waitVMI(t, ns, name, time.Minute, "AgentConnected removed", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected) == nil
	})
	if _, errOut, code := qvirtctl(t, "-n", ns, "guestosinfo", name); code == 0 || !strings.Contains(errOut, "the guest agent is not connected") {
		t.Errorf("qvirtctl guestosinfo without an agent: exit %d, stderr %q", code, errOut)
	}
}
