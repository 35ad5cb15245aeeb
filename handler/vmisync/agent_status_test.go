package vmisync

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// TestGuestAgentStatus: the guest agent's report becomes AgentConnected, guestOSInfo and the
// guest's names and addresses in status.interfaces, matched by MAC; a masquerade NIC keeps the
// pod's address; an agent that went away removes AgentConnected and keeps the OS info.
func TestGuestAgentStatus(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC))
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}}}}
	agent := &protocol.GuestAgent{Connected: true, Version: "7.2.22",
		OS: &protocol.GuestOSInfo{ID: "debian", PrettyName: "Debian GNU/Linux 12 (bookworm)", KernelRelease: "6.1.0-57-amd64", VersionID: "12"},
		Interfaces: []protocol.GuestInterface{
			{Name: "eth0", MAC: "02:00:00:00:00:01", IPs: []string{"10.0.2.2", "fd10:0:2::2", "fe80::1"}},
			{Name: "docker0", MAC: "02:42:00:00:00:09", IPs: []string{"172.17.0.1"}},
		}}
	st := protocol.Status{Phase: protocol.PhaseRunning, RunState: "running",
		NICs: []protocol.NICStatus{{Name: "default", MAC: "02:00:00:00:00:01"}}, GuestAgent: agent}

	newVMI := func(bridge bool) *v1alpha1.VirtualMachineInstance {
		v := &v1alpha1.VirtualMachineInstance{}
		v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
		in := v1alpha1.Interface{Name: "default"}
		if bridge {
			in.Bridge = &v1alpha1.InterfaceBridge{}
		}
		v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{in}
		v.Status.Phase = v1alpha1.Running
		return v
	}

	t.Run("masquerade keeps the pod's address", func(t *testing.T) {
		v := newVMI(false)
		applyLauncherStatus(v, pod, &st, nil, now)
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonAgentConnected {
			t.Errorf("AgentConnected %+v", c)
		}
		if o := v.Status.GuestOSInfo; o.ID != "debian" || o.PrettyName != "Debian GNU/Linux 12 (bookworm)" || o.VersionID != "12" || o.KernelRelease != "6.1.0-57-amd64" {
			t.Errorf("guestOSInfo %+v", o)
		}
		want := []v1alpha1.VirtualMachineInstanceNetworkInterface{
			{Name: "default", MAC: "02:00:00:00:00:01", IP: "10.0.0.7", IPs: []string{"10.0.0.7"}, InterfaceName: "eth0", InfoSource: "domain, guest-agent"},
			{MAC: "02:42:00:00:00:09", IP: "172.17.0.1", IPs: []string{"172.17.0.1"}, InterfaceName: "docker0", InfoSource: "guest-agent"},
		}
		if !reflect.DeepEqual(v.Status.Interfaces, want) {
			t.Errorf("interfaces\n%+v\nwant\n%+v", v.Status.Interfaces, want)
		}
	})

	t.Run("bridge adds the guest's addresses after the pod's", func(t *testing.T) {
		v := newVMI(true)
		applyLauncherStatus(v, pod, &st, nil, now)
		in := v.Status.Interfaces[0]
		if in.IP != "10.0.0.7" || !reflect.DeepEqual(in.IPs, []string{"10.0.0.7", "10.0.2.2", "fd10:0:2::2", "fe80::1"}) || in.InterfaceName != "eth0" {
			t.Errorf("interface %+v", in)
		}
	})

	t.Run("a NIC off the pod network takes the guest's addresses", func(t *testing.T) {
		v := newVMI(false)
		applyLauncherStatus(v, nil, &st, nil, now)
		in := v.Status.Interfaces[0]
		if in.IP != "10.0.2.2" || !reflect.DeepEqual(in.IPs, []string{"10.0.2.2", "fd10:0:2::2", "fe80::1"}) || in.InfoSource != "domain, guest-agent" {
			t.Errorf("interface %+v", in)
		}
	})

	t.Run("a disconnected agent removes AgentConnected and keeps the OS", func(t *testing.T) {
		v := newVMI(false)
		applyLauncherStatus(v, pod, &st, nil, now)
		gone := st
		gone.GuestAgent = &protocol.GuestAgent{Connected: false, OS: agent.OS, Interfaces: agent.Interfaces}
		applyLauncherStatus(v, pod, &gone, nil, now)
		if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected); c != nil {
			t.Errorf("AgentConnected still there: %+v", c)
		}
		if v.Status.GuestOSInfo.ID != "debian" {
			t.Errorf("guestOSInfo lost: %+v", v.Status.GuestOSInfo)
		}
	})

	t.Run("no agent: the NIC alone", func(t *testing.T) {
		v := newVMI(false)
		none := st
		none.GuestAgent = nil
		applyLauncherStatus(v, pod, &none, nil, now)
		want := []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "default", MAC: "02:00:00:00:00:01", IP: "10.0.0.7", IPs: []string{"10.0.0.7"}, InfoSource: "domain"}}
		if !reflect.DeepEqual(v.Status.Interfaces, want) || meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected) != nil {
			t.Errorf("interfaces %+v, conditions %+v", v.Status.Interfaces, v.Status.Conditions)
		}
	})
}
