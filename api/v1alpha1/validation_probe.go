package v1alpha1

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateProbe checks a readiness or liveness probe as KubeVirt's VMI admitter and Kubernetes'
// pod validation do together: the pod qvirt-controller renders carries the probe, and a probe the
// API server would refuse on the pod must be refused on the instance, naming the instance's field,
// rather than leave the instance without a launcher pod.
func validateProbe(pr *Probe, liveness bool, p *field.Path) field.ErrorList {
	if pr == nil {
		return nil
	}
	errs := validateProbeHandler(&pr.Handler, p)
	for _, f := range []struct {
		name string
		v    int32
	}{
		{"initialDelaySeconds", pr.InitialDelaySeconds}, {"timeoutSeconds", pr.TimeoutSeconds}, {"periodSeconds", pr.PeriodSeconds},
		{"successThreshold", pr.SuccessThreshold}, {"failureThreshold", pr.FailureThreshold},
	} {
		if f.v < 0 {
			errs = append(errs, field.Invalid(p.Child(f.name), f.v, "must be 0 or more"))
		}
	}
	if liveness && pr.SuccessThreshold > 1 {
		errs = append(errs, field.Invalid(p.Child("successThreshold"), pr.SuccessThreshold, "must be 1 for a liveness probe"))
	}
	return errs
}

// validateProbeHandler checks that exactly one action is set, and that action.
func validateProbeHandler(h *Handler, p *field.Path) field.ErrorList {
	var set []string
	var errs field.ErrorList
	if h.TCPSocket != nil {
		set = append(set, "tcpSocket")
		errs = append(errs, validateProbePort(h.TCPSocket.Port, p.Child("tcpSocket", "port"))...)
		errs = append(errs, validateProbeHost(h.TCPSocket.Host, p.Child("tcpSocket", "host"))...)
	}
	if g := h.HTTPGet; g != nil {
		set = append(set, "httpGet")
		errs = append(errs, validateHTTPGet(g, p.Child("httpGet"))...)
	}
	if h.Exec != nil {
		set = append(set, "exec")
		if len(h.Exec.Command) == 0 {
			errs = append(errs, field.Required(p.Child("exec", "command"), "the command to run in the guest"))
		}
	}
	if h.GuestAgentPing != nil {
		set = append(set, "guestAgentPing")
	}
	switch len(set) {
	case 0:
		errs = append(errs, field.Required(p, "set one of tcpSocket, httpGet, exec or guestAgentPing"))
	case 1:
	default:
		for _, name := range set[1:] {
			errs = append(errs, field.Forbidden(p.Child(name), fmt.Sprintf("a probe has one action: %s is set already", set[0])))
		}
	}
	return errs
}

func validateHTTPGet(g *corev1.HTTPGetAction, p *field.Path) field.ErrorList {
	errs := validateProbePort(g.Port, p.Child("port"))
	errs = append(errs, validateProbeHost(g.Host, p.Child("host"))...)
	if g.Scheme != "" {
		errs = append(errs, validateEnum(p.Child("scheme"), string(g.Scheme), string(corev1.URISchemeHTTP), string(corev1.URISchemeHTTPS))...)
	}
	if g.Path != "" && g.Path[0] != '/' {
		errs = append(errs, field.Invalid(p.Child("path"), g.Path, "must be an absolute path (start with /)"))
	}
	for i, hdr := range g.HTTPHeaders {
		for _, msg := range validation.IsHTTPHeaderName(hdr.Name) {
			errs = append(errs, field.Invalid(p.Child("httpHeaders").Index(i).Child("name"), hdr.Name, msg))
		}
	}
	return errs
}

// validateProbePort accepts a port number (1-65535) or a port name (an IANA service name), as
// Kubernetes does for a container's probe.
func validateProbePort(port intstr.IntOrString, p *field.Path) field.ErrorList {
	if port.Type == intstr.String {
		var errs field.ErrorList
		for _, msg := range validation.IsValidPortName(port.StrVal) {
			errs = append(errs, field.Invalid(p, port.StrVal, msg))
		}
		return errs
	}
	var errs field.ErrorList
	for _, msg := range validation.IsValidPortNum(int(port.IntVal)) {
		errs = append(errs, field.Invalid(p, port.IntVal, msg))
	}
	return errs
}

// validateProbeHost accepts an empty host (the pod IP, which is the guest's) or an IP address or
// DNS name.
func validateProbeHost(host string, p *field.Path) field.ErrorList {
	if host == "" || len(validation.IsValidIP(p, host)) == 0 || len(validation.IsDNS1123Subdomain(host)) == 0 {
		return nil
	}
	return field.ErrorList{field.Invalid(p, host, "must be an IP address or a DNS name; leave it empty to probe the guest at the pod IP")}
}

// validatePortName checks an interface port's name: the launcher pod's compute container declares
// the ports (as KubeVirt's does), and the API server refuses a container port name that is no IANA
// service name or that another port of the pod has already.
func validatePortName(p *field.Path, name string, seen map[string]bool) field.ErrorList {
	if name == "" {
		return nil
	}
	var errs field.ErrorList
	for _, msg := range validation.IsValidPortName(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	if seen[name] {
		errs = append(errs, field.Duplicate(p, name))
	}
	seen[name] = true
	return errs
}

// validateProbePortNames checks that a probe's named port is one of the interfaces' ports: the
// kubelet resolves it against the compute container's ports, which are those, and would fail
// every run of the probe otherwise.
func validateProbePortNames(spec *VirtualMachineInstanceSpec, pr *Probe, p *field.Path) field.ErrorList {
	if pr == nil {
		return nil
	}
	var errs field.ErrorList
	check := func(port intstr.IntOrString, fp *field.Path) {
		if port.Type != intstr.String || port.StrVal == "" || len(validation.IsValidPortName(port.StrVal)) > 0 {
			return
		}
		for _, in := range spec.Domain.Devices.Interfaces {
			for _, ip := range in.Ports {
				if ip.Name == port.StrVal {
					return
				}
			}
		}
		errs = append(errs, field.Invalid(fp, port.StrVal,
			"no port of spec.domain.devices.interfaces[].ports has this name; name the port there or give its number"))
	}
	if pr.TCPSocket != nil {
		check(pr.TCPSocket.Port, p.Child("tcpSocket", "port"))
	}
	if pr.HTTPGet != nil {
		check(pr.HTTPGet.Port, p.Child("httpGet", "port"))
	}
	return errs
}
