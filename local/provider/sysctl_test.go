package provider_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/local/provider"
)

// A virtual node sets a pod's safe sysctls, as a kubelet does, and refuses the others, naming
// the field: they could reach past the pod's own network namespace.
func TestPodSysctls(t *testing.T) {
	pod := func(names ...string) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: &corev1.PodSecurityContext{}}}
		for _, n := range names {
			p.Spec.SecurityContext.Sysctls = append(p.Spec.SecurityContext.Sysctls, corev1.Sysctl{Name: n, Value: "0"})
		}
		return p
	}
	if err := provider.CheckSysctls(pod("net.ipv4.ip_unprivileged_port_start", "net/ipv4/ping_group_range")); err != nil {
		t.Errorf("the passt binding's sysctls: %v", err)
	}
	if err := provider.CheckSysctls(&corev1.Pod{}); err != nil {
		t.Errorf("no security context: %v", err)
	}
	err := provider.CheckSysctls(pod("net.ipv4.ping_group_range", "net.core.somaxconn"))
	if err == nil || !strings.Contains(err.Error(), "spec.securityContext.sysctls[1]") || !strings.Contains(err.Error(), "net.core.somaxconn") {
		t.Errorf("an unsafe sysctl: %v, want a refusal naming spec.securityContext.sysctls[1]", err)
	}
}
