package manifests

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// subject is a ServiceAccount.
type subject struct{ namespace, name string }

func (s subject) String() string { return fmt.Sprintf("ServiceAccount %s/%s", s.namespace, s.name) }

// rule is one PolicyRule, with the namespace it applies in ("" for every namespace).
type rule struct {
	namespace                              string
	groups, resources, verbs, resourceName []string
}

// rbac evaluates the rendered Roles, ClusterRoles and their bindings (no aggregation: qvirt's own
// roles use none).
type rbac struct {
	objs []*unstructured.Unstructured
}

func newRBAC(objs []*unstructured.Unstructured) rbac { return rbac{objs: objs} }

func (r rbac) rulesOf(kind, ns, name string) []rule {
	o := find(r.objs, kind, ns, name)
	if o == nil {
		return nil
	}
	raw, _, _ := unstructured.NestedSlice(o.Object, "rules")
	var out []rule
	for _, x := range raw {
		m := x.(map[string]any)
		str := func(k string) []string { v, _, _ := unstructured.NestedStringSlice(m, k); return v }
		out = append(out, rule{groups: str("apiGroups"), resources: str("resources"), verbs: str("verbs"), resourceName: str("resourceNames")})
	}
	return out
}

// rules are every rule granted to sa, each with the namespace where it applies.
func (r rbac) rules(sa subject) []rule {
	var out []rule
	for _, b := range ofKind(r.objs, "RoleBinding", "ClusterRoleBinding") {
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		bound := slices.ContainsFunc(subjects, func(x any) bool {
			m := x.(map[string]any)
			return m["kind"] == "ServiceAccount" && m["name"] == sa.name && m["namespace"] == sa.namespace
		})
		if !bound {
			continue
		}
		kind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		name, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		roleNS := ""
		if kind == "Role" {
			roleNS = b.GetNamespace()
		}
		for _, ru := range r.rulesOf(kind, roleNS, name) {
			ru.namespace = b.GetNamespace() // "" for a ClusterRoleBinding
			out = append(out, ru)
		}
	}
	return out
}

func matches(list []string, v string) bool {
	return slices.Contains(list, v) || slices.Contains(list, "*")
}

// allows reports whether sa may verb the named object (namespace "" for cluster-scoped ones).
func (r rbac) allows(sa subject, verb, group, resource, namespace, name string) bool {
	for _, ru := range r.rules(sa) {
		if ru.namespace != "" && ru.namespace != namespace {
			continue
		}
		if !matches(ru.groups, group) || !matches(ru.resources, resource) || !matches(ru.verbs, verb) {
			continue
		}
		if len(ru.resourceName) == 0 || slices.Contains(ru.resourceName, name) {
			return true
		}
	}
	return false
}
