package migration

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
)

func policy(name string, vmi, ns v1alpha1.LabelSelector) v1alpha1.MigrationPolicy {
	return v1alpha1.MigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.MigrationPolicySpec{Selectors: &v1alpha1.Selectors{VirtualMachineInstanceSelector: vmi, NamespaceSelector: ns}}}
}

// TestMatchPolicies: KubeVirt's precedence: a policy applies only when every label of its
// selectors matches; more matched labels win, then more of the instance's own, then the name.
func TestMatchPolicies(t *testing.T) {
	vmiLabels := map[string]string{"workload": "db", "os": "linux"}
	nsLabels := map[string]string{"tier": "gold", "team": "a"}
	cases := []struct {
		name     string
		policies []v1alpha1.MigrationPolicy
		want     []string
	}{
		{"none match", []v1alpha1.MigrationPolicy{
			policy("wrong-value", v1alpha1.LabelSelector{"workload": "web"}, nil),
			policy("missing-label", v1alpha1.LabelSelector{"workload": "db", "zone": "x"}, nil),
			policy("wrong-namespace", nil, v1alpha1.LabelSelector{"tier": "bronze"}),
			{ObjectMeta: metav1.ObjectMeta{Name: "no-selectors"}},
		}, nil},
		{"empty selectors match everything, last", []v1alpha1.MigrationPolicy{
			policy("catch-all", nil, nil),
			policy("db", v1alpha1.LabelSelector{"workload": "db"}, nil),
		}, []string{"db", "catch-all"}},
		{"more labels win", []v1alpha1.MigrationPolicy{
			policy("one", v1alpha1.LabelSelector{"workload": "db"}, nil),
			policy("three", v1alpha1.LabelSelector{"workload": "db"}, v1alpha1.LabelSelector{"tier": "gold", "team": "a"}),
			policy("two", v1alpha1.LabelSelector{"workload": "db", "os": "linux"}, nil),
		}, []string{"three", "two", "one"}},
		{"on equal counts the instance's labels win", []v1alpha1.MigrationPolicy{
			policy("ns", nil, v1alpha1.LabelSelector{"tier": "gold"}),
			policy("vmi", v1alpha1.LabelSelector{"os": "linux"}, nil),
		}, []string{"vmi", "ns"}},
		{"then the name", []v1alpha1.MigrationPolicy{
			policy("b", v1alpha1.LabelSelector{"os": "linux"}, nil),
			policy("a", v1alpha1.LabelSelector{"workload": "db"}, nil),
		}, []string{"a", "b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, m := range matchPolicies(c.policies, vmiLabels, nsLabels) {
				got = append(got, m.policy.Name)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("policies in order = %v, want %v", got, c.want)
			}
		})
	}
}

// TestEffectiveConfiguration: a policy's settings replace the cluster's; what it leaves out stays
// the cluster's.
func TestEffectiveConfiguration(t *testing.T) {
	cluster := config.Default().Migrations
	cluster.BandwidthPerMigration = resource.MustParse("64Mi")
	got := effectiveConfiguration(cluster, nil)
	if got.BandwidthPerMigration.String() != "64Mi" || *got.CompletionTimeoutPerGiB != cluster.CompletionTimeoutPerGiB || *got.AllowAutoConverge || *got.AllowPostCopy {
		t.Errorf("without a policy: %+v, want the cluster's", got)
	}
	p := policy("p", nil, nil)
	p.Spec.AllowAutoConverge = ptr.To(true)
	p.Spec.CompletionTimeoutPerGiB = ptr.To[int64](7)
	p.Spec.ParallelMigrationThreads = ptr.To[int32](2)
	p.Spec.ParallelMigrationCompression = ptr.To(v1alpha1.MigrationCompressionZstd)
	got = effectiveConfiguration(cluster, &p)
	if got.BandwidthPerMigration.String() != "64Mi" || *got.CompletionTimeoutPerGiB != 7 || !*got.AllowAutoConverge ||
		*got.ParallelMigrationThreads != 2 || *got.ParallelMigrationCompression != v1alpha1.MigrationCompressionZstd {
		t.Errorf("with a policy setting autoConverge, the timeout and parallel streams: %+v", got)
	}
}

// TestMigrationPolicyApplies: the migration of an instance takes the best matching
// MigrationPolicy's settings, recorded in the instance's migrationState for the node agent, and
// the policy's completion timeout is the one that aborts it. Two policies that match equally are
// reported in an Event; a policy asking for what qvirt cannot do is refused naming the field.
func TestMigrationPolicyApplies(t *testing.T) {
	e := setup(t, nil)
	ns := &corev1.Namespace{}
	if err := cp.Client.Get(e.ctx, client.ObjectKey{Name: e.ns}, ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels["policy-test"] = e.ns
	if err := cp.Client.Update(e.ctx, ns); err != nil {
		t.Fatal(err)
	}
	inNS := v1alpha1.LabelSelector{"policy-test": e.ns}
	nsOnly := policy(e.ns+"-a-ns-only", nil, inNS)
	nsOnly.Spec.BandwidthPerMigration = ptr.To(resource.MustParse("1Mi"))
	best := policy(e.ns+"-b-web", v1alpha1.LabelSelector{"app": "web"}, inNS)
	best.Spec.BandwidthPerMigration = ptr.To(resource.MustParse("2Mi"))
	best.Spec.AllowAutoConverge = ptr.To(true)
	best.Spec.CompletionTimeoutPerGiB = ptr.To[int64](1) // a 512Mi guest may migrate for a second
	tie := policy(e.ns+"-c-web-too", v1alpha1.LabelSelector{"app": "web"}, inNS)
	other := policy(e.ns+"-d-db", v1alpha1.LabelSelector{"app": "db"}, inNS)
	for _, p := range []v1alpha1.MigrationPolicy{nsOnly, best, tie, other} {
		if err := cp.Client.Create(e.ctx, &p); err != nil {
			t.Fatalf("create policy %s: %v", p.Name, err)
		}
		t.Cleanup(func() { _ = cp.Client.Delete(e.ctx, &p) })
	}

	vmi, _ := e.runningVMI("vm1", "node-a", false)
	m := e.migrate("mig", vmi.Name)
	e.driveToRunning(m, vmi, "node-b")
	ms := e.getVMI(vmi).Status.MigrationState
	if ms.MigrationPolicyName != best.Name {
		t.Fatalf("migrationState.migrationPolicyName = %q, want %q", ms.MigrationPolicyName, best.Name)
	}
	c := ms.MigrationConfiguration
	if c == nil || c.BandwidthPerMigration.String() != "2Mi" || !*c.AllowAutoConverge || *c.CompletionTimeoutPerGiB != 1 || *c.AllowPostCopy {
		t.Fatalf("migrationState.migrationConfiguration = %+v, want policy %s's", c, best.Name)
	}
	e.eventually("abortRequested by the policy's completion timeout", func() (bool, string) {
		got, err := e.getMigration(m)
		if err != nil {
			return false, err.Error()
		}
		c := condition(got, ConditionAbortRequested)
		return c != nil && c.Reason == ReasonCompletionTimeout, fmt.Sprintf("%+v", c)
	})
	e.eventually("an Event naming the tied policies", func() (bool, string) {
		var events corev1.EventList
		if err := cp.Client.List(e.ctx, &events, client.InNamespace(e.ns)); err != nil {
			return false, err.Error()
		}
		for _, ev := range events.Items {
			if ev.Reason == ReasonPolicyTie && strings.Contains(ev.Message, best.Name) && strings.Contains(ev.Message, tie.Name) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(events.Items))
	})

	for _, c := range []struct {
		field string
		set   func(*v1alpha1.MigrationPolicySpec)
	}{
		{"allowPostCopy", func(s *v1alpha1.MigrationPolicySpec) { // with parallel streams
			s.AllowPostCopy, s.ParallelMigrationThreads = ptr.To(true), ptr.To[int32](2)
		}},
		{"allowWorkloadDisruption", func(s *v1alpha1.MigrationPolicySpec) { s.AllowWorkloadDisruption = ptr.To(true) }},
		{"bandwidthPerMigration", func(s *v1alpha1.MigrationPolicySpec) { s.BandwidthPerMigration = ptr.To(resource.MustParse("-1Mi")) }},
		{"completionTimeoutPerGiB", func(s *v1alpha1.MigrationPolicySpec) { s.CompletionTimeoutPerGiB = ptr.To[int64](-5) }},
		{"parallelMigrationThreads", func(s *v1alpha1.MigrationPolicySpec) { s.ParallelMigrationThreads = ptr.To[int32](17) }},
		{"parallelMigrationCompression", func(s *v1alpha1.MigrationPolicySpec) {
			s.ParallelMigrationCompression = ptr.To(v1alpha1.MigrationCompression("zlib"))
		}},
		{"parallelMigrationCompression", func(s *v1alpha1.MigrationPolicySpec) {
			s.ParallelMigrationCompression = ptr.To(v1alpha1.MigrationCompressionZstd) // without parallel streams
		}},
	} {
		p := policy(e.ns+"-bad", nil, nil)
		c.set(&p.Spec)
		err := cp.Client.Create(e.ctx, &p)
		if err == nil {
			_ = cp.Client.Delete(e.ctx, &p)
			t.Errorf("a policy with a bad %s was accepted", c.field)
			continue
		}
		if !strings.Contains(err.Error(), c.field) {
			t.Errorf("refusal of a bad %s does not name it: %v", c.field, err)
		}
	}
	postCopy := policy(e.ns+"-postcopy", nil, nil)
	postCopy.Spec.AllowPostCopy = ptr.To(true)
	if err := cp.Client.Create(e.ctx, &postCopy); err != nil {
		t.Errorf("a policy allowing post-copy was refused: %v", err)
	} else {
		_ = cp.Client.Delete(e.ctx, &postCopy)
	}
}
