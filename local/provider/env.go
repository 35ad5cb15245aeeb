package provider

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// defaultPath stands in for the PATH an image's config would give.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// envSources are what env resolution reads besides the pod.
type envSources struct {
	configMaps corev1listers.ConfigMapLister
	secrets    corev1listers.SecretLister
	// nodeAllocatable answers resourceFieldRef limits that the container leaves unset.
	nodeAllocatable corev1.ResourceList
	// extra is Options.Env.
	extra map[string]string
}

// resolveEnv is the container's environment as a kubelet would give it: PATH and HOSTNAME, the
// node's extra variables (sorted), then envFrom, then env in order with $(VAR) expanded against what precedes it. pod.Status carries the
// pod IP and host IP for the downward API.
func resolveEnv(pod *corev1.Pod, c *corev1.Container, src envSources) ([]string, error) {
	vals := map[string]string{"PATH": defaultPath, "HOSTNAME": podHostname(pod)}
	order := []string{"PATH", "HOSTNAME"}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, k := range slices.Sorted(maps.Keys(src.extra)) {
		set(k, src.extra[k])
	}
	for i, ef := range c.EnvFrom {
		data, err := envFromData(pod.Namespace, ef, src)
		if err != nil {
			return nil, fmt.Errorf("envFrom[%d]: %w", i, err)
		}
		for k, v := range data {
			set(ef.Prefix+k, v)
		}
	}
	lookup := func(k string) (string, bool) { v, ok := vals[k]; return v, ok }
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			set(e.Name, expandVars(e.Value, lookup))
			continue
		}
		v, ok, err := envValueFrom(pod, c, e.ValueFrom, src)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			set(e.Name, v)
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vals[k])
	}
	return out, nil
}

func podHostname(pod *corev1.Pod) string {
	if pod.Spec.Hostname != "" {
		return pod.Spec.Hostname
	}
	return pod.Name
}

func envFromData(ns string, ef corev1.EnvFromSource, src envSources) (map[string]string, error) {
	switch {
	case ef.ConfigMapRef != nil:
		cm, err := src.configMaps.ConfigMaps(ns).Get(ef.ConfigMapRef.Name)
		if err != nil {
			if optional(ef.ConfigMapRef.Optional) {
				return nil, nil
			}
			return nil, fmt.Errorf("configMap %s: %w", ef.ConfigMapRef.Name, err)
		}
		return cm.Data, nil
	case ef.SecretRef != nil:
		s, err := src.secrets.Secrets(ns).Get(ef.SecretRef.Name)
		if err != nil {
			if optional(ef.SecretRef.Optional) {
				return nil, nil
			}
			return nil, fmt.Errorf("secret %s: %w", ef.SecretRef.Name, err)
		}
		out := make(map[string]string, len(s.Data))
		for k, v := range s.Data {
			out[k] = string(v)
		}
		return out, nil
	}
	return nil, nil
}

func optional(b *bool) bool { return b != nil && *b }

// envValueFrom resolves one valueFrom; ok is false for an optional reference that is missing.
func envValueFrom(pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource, src envSources) (string, bool, error) {
	switch {
	case from.FieldRef != nil:
		v, err := podField(pod, from.FieldRef.FieldPath)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		v, err := containerResource(c, from.ResourceFieldRef, src.nodeAllocatable)
		return v, err == nil, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := src.configMaps.ConfigMaps(pod.Namespace).Get(ref.Name)
		if err != nil {
			return "", false, optionalErr(ref.Optional, fmt.Errorf("configMap %s: %w", ref.Name, err))
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			return "", false, optionalErr(ref.Optional, fmt.Errorf("configMap %s has no key %q", ref.Name, ref.Key))
		}
		return v, true, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := src.secrets.Secrets(pod.Namespace).Get(ref.Name)
		if err != nil {
			return "", false, optionalErr(ref.Optional, fmt.Errorf("secret %s: %w", ref.Name, err))
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			return "", false, optionalErr(ref.Optional, fmt.Errorf("secret %s has no key %q", ref.Name, ref.Key))
		}
		return string(v), true, nil
	}
	return "", false, fmt.Errorf("valueFrom names no source")
}

func optionalErr(opt *bool, err error) error {
	if optional(opt) {
		return nil
	}
	return err
}

// podField answers the downward API's fieldRef paths.
func podField(pod *corev1.Pod, path string) (string, error) {
	if k, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		return joinIPs(pod.Status.PodIPs), nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		ips := make([]string, 0, len(pod.Status.HostIPs))
		for _, ip := range pod.Status.HostIPs {
			ips = append(ips, ip.IP)
		}
		return strings.Join(ips, ","), nil
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

func joinIPs(ips []corev1.PodIP) string {
	s := make([]string, 0, len(ips))
	for _, ip := range ips {
		s = append(s, ip.IP)
	}
	return strings.Join(s, ",")
}

// subscript parses `prefix['key']`.
func subscript(path, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

// containerResource answers resourceFieldRef like the kubelet: a limit left unset is the node's
// allocatable, values are divided by the divisor and rounded up.
func containerResource(c *corev1.Container, ref *corev1.ResourceFieldSelector, node corev1.ResourceList) (string, error) {
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	var q resource.Quantity
	var set bool
	switch kind {
	case "limits":
		q, set = c.Resources.Limits[corev1.ResourceName(name)]
		if !set {
			q, set = node[corev1.ResourceName(name)]
		}
	case "requests":
		q, set = c.Resources.Requests[corev1.ResourceName(name)]
	default:
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	if !set {
		return "0", nil
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	return fmt.Sprint(int64(math.Ceil(q.AsApproximateFloat64() / div.AsApproximateFloat64()))), nil
}

// expandVars expands $(NAME) references the way Kubernetes does for env values, command and args:
// a defined NAME is replaced, an undefined one is left as written, and $$ is a literal $.
func expandVars(s string, lookup func(string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
			continue
		}
		b.WriteByte('$')
	}
	return b.String()
}

// envLookup makes a lookup over resolved "K=V" pairs.
func envLookup(env []string) func(string) (string, bool) {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}
