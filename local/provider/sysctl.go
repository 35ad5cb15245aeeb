package provider

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
)

// safeSysctls are the kubelet's safe sysctls of the network namespace (k8s.io/kubernetes
// pkg/kubelet/sysctl safe_sysctls.go): a pod may set them without an allowlist, since they touch
// only its own namespace. A kubelet refuses a pod with any other (SysctlForbidden), as here.
var safeSysctls = map[string]bool{
	"net.ipv4.ip_local_port_range":        true,
	"net.ipv4.tcp_syncookies":             true,
	"net.ipv4.ping_group_range":           true,
	"net.ipv4.ip_unprivileged_port_start": true,
	"net.ipv4.ip_local_reserved_ports":    true,
	"net.ipv4.tcp_keepalive_time":         true,
	"net.ipv4.tcp_fin_timeout":            true,
	"net.ipv4.tcp_keepalive_intvl":        true,
	"net.ipv4.tcp_keepalive_probes":       true,
}

// checkSysctls refuses a pod's sysctls other than safeSysctls, naming the first.
func checkSysctls(p *corev1.Pod) error {
	if p.Spec.SecurityContext == nil {
		return nil
	}
	for i, s := range p.Spec.SecurityContext.Sysctls {
		if !safeSysctls[dotted(s.Name)] {
			return fmt.Errorf("spec.securityContext.sysctls[%d]: %q is not a safe sysctl of the pod's network namespace, which is all a virtual node sets (SysctlForbidden)", i, s.Name)
		}
	}
	return nil
}

// dotted is a sysctl's name with dots between its parts, as the kubelet normalises one written
// with slashes (net/ipv4/ping_group_range): there, a dot is part of a part (an interface's name)
// and swaps with the slash.
func dotted(name string) string {
	if i := strings.IndexAny(name, "./"); i < 0 || name[i] == '.' {
		return name
	}
	return strings.Map(func(r rune) rune {
		switch r {
		case '/':
			return '.'
		case '.':
			return '/'
		}
		return r
	}, name)
}

// setSysctls writes the pod's sysctls (checked by checkSysctls) in its network namespace at nsPath.
func setSysctls(nsPath string, p *corev1.Pod) error {
	if p.Spec.SecurityContext == nil || len(p.Spec.SecurityContext.Sysctls) == 0 {
		return nil
	}
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		for _, s := range p.Spec.SecurityContext.Sysctls {
			path := filepath.Join("/proc/sys", strings.ReplaceAll(dotted(s.Name), ".", "/"))
			if err := os.WriteFile(path, []byte(s.Value), 0o644); err != nil {
				return fmt.Errorf("sysctl %s=%q: %w", s.Name, s.Value, err)
			}
		}
		return nil
	})
}
