package migration

import (
	"context"
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
)

// +kubebuilder:rbac:groups=qvirt.io,resources=migrationpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get

// policyMatch is a policy that applies to an instance and how closely: the labels of its
// selectors that the instance and its namespace carry.
type policyMatch struct {
	policy              *v1alpha1.MigrationPolicy
	vmiLabels, nsLabels int
}

// better is KubeVirt's precedence (pkg/virt-controller/watch/migrationpolicy.go): more matched
// labels in all; on a tie, more of the instance's own; then the first policy by name, so that the
// choice never depends on list order.
func (m policyMatch) better(o policyMatch) bool {
	if a, b := m.vmiLabels+m.nsLabels, o.vmiLabels+o.nsLabels; a != b {
		return a > b
	}
	if m.vmiLabels != o.vmiLabels {
		return m.vmiLabels > o.vmiLabels
	}
	return m.policy.Name < o.policy.Name
}

// matchPolicies is the policies that apply to an instance with vmiLabels in a namespace with
// nsLabels, best first: a policy applies when the instance carries every label of its
// virtualMachineInstanceSelector and the namespace every label of its namespaceSelector.
func matchPolicies(policies []v1alpha1.MigrationPolicy, vmiLabels, nsLabels map[string]string) []policyMatch {
	var out []policyMatch
	for i := range policies {
		p := &policies[i]
		if p.Spec.Selectors == nil {
			continue
		}
		nv, okV := countLabels(p.Spec.Selectors.VirtualMachineInstanceSelector, vmiLabels)
		nn, okN := countLabels(p.Spec.Selectors.NamespaceSelector, nsLabels)
		if okV && okN {
			out = append(out, policyMatch{policy: p, vmiLabels: nv, nsLabels: nn})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].better(out[j]) })
	return out
}

// countLabels is how many of want's labels have carries, and whether all of them do.
func countLabels(want v1alpha1.LabelSelector, has map[string]string) (int, bool) {
	for k, v := range want {
		if got, ok := has[k]; !ok || got != v {
			return 0, false
		}
	}
	return len(want), true
}

// effectiveConfiguration is the cluster's migration settings with policy's over them (nil: none).
func effectiveConfiguration(cluster config.MigrationConfig, policy *v1alpha1.MigrationPolicy) *v1alpha1.MigrationConfiguration {
	bw := cluster.BandwidthPerMigration.DeepCopy()
	timeout := cluster.CompletionTimeoutPerGiB
	no := false
	c := &v1alpha1.MigrationConfiguration{
		BandwidthPerMigration: &bw, CompletionTimeoutPerGiB: &timeout, AllowAutoConverge: &no, AllowPostCopy: &no,
	}
	if policy == nil {
		return c
	}
	s := policy.Spec
	if s.BandwidthPerMigration != nil {
		q := s.BandwidthPerMigration.DeepCopy()
		c.BandwidthPerMigration = &q
	}
	if s.CompletionTimeoutPerGiB != nil {
		t := *s.CompletionTimeoutPerGiB
		c.CompletionTimeoutPerGiB = &t
	}
	if s.AllowAutoConverge != nil {
		b := *s.AllowAutoConverge
		c.AllowAutoConverge = &b
	}
	if s.AllowPostCopy != nil {
		b := *s.AllowPostCopy
		c.AllowPostCopy = &b
	}
	if s.ParallelMigrationThreads != nil {
		n := *s.ParallelMigrationThreads
		c.ParallelMigrationThreads = &n
	}
	if s.ParallelMigrationCompression != nil {
		z := *s.ParallelMigrationCompression
		c.ParallelMigrationCompression = &z
	}
	return c
}

// chooseConfiguration picks the policy for vmi's migration and the settings in force. A tie
// between the best policies is reported (tie non-empty) with the names of those left out.
func (r *Reconciler) chooseConfiguration(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (name string, cfg *v1alpha1.MigrationConfiguration, tie string, err error) {
	var list v1alpha1.MigrationPolicyList
	if err := r.apiReader().List(ctx, &list); err != nil {
		return "", nil, "", fmt.Errorf("list migration policies: %w", err)
	}
	cluster := r.Config.Get().Migrations
	if len(list.Items) == 0 {
		return "", effectiveConfiguration(cluster, nil), "", nil
	}
	ns := &corev1.Namespace{}
	if err := r.apiReader().Get(ctx, types.NamespacedName{Name: vmi.Namespace}, ns); err != nil {
		return "", nil, "", fmt.Errorf("read namespace %s for its labels: %w", vmi.Namespace, err)
	}
	matches := matchPolicies(list.Items, vmi.Labels, ns.Labels)
	if len(matches) == 0 {
		return "", effectiveConfiguration(cluster, nil), "", nil
	}
	best := matches[0]
	var same []string
	for _, m := range matches[1:] {
		if m.vmiLabels == best.vmiLabels && m.nsLabels == best.nsLabels {
			same = append(same, m.policy.Name)
		}
	}
	return best.policy.Name, effectiveConfiguration(cluster, best.policy), strings.Join(same, ", "), nil
}
