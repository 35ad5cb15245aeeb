package migration

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// evacMigration is a migration of "vm" created at t0+created; node names the evacuated node ("" for
// a user's migration); a Failed one failed at t0+created+10s.
func evacMigration(name, node string, created time.Duration, phase v1alpha1.VirtualMachineInstanceMigrationPhase) v1alpha1.VirtualMachineInstanceMigration {
	m := v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(created))},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"},
		Status:     v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase},
	}
	if node != "" {
		m.Annotations = map[string]string{v1alpha1.EvacuationMigrationAnnotation: node}
	}
	if phase == v1alpha1.MigrationFailed {
		m.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstanceMigrationPhaseTransitionTimestamp{
			{Phase: phase, PhaseTransitionTimestamp: metav1.NewTime(t0.Add(created + 10*time.Second))}}
		m.Status.Conditions = []metav1.Condition{{Type: ConditionFailed, Status: metav1.ConditionTrue, Reason: ReasonTargetPodFailed, Message: name + " broke"}}
	}
	return m
}

// TestPlanEvacuation: one migration at a time; after failures the next waits 20 s, then 40 s, ...
// (KubeVirt's evacuation backoff), counted since the last success off the same node; and the
// description names the failures and the last reason.
func TestPlanEvacuation(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm"}}
	vmi.Status.EvacuationNodeName = "n1"
	m := evacMigration
	const F, S, R = v1alpha1.MigrationFailed, v1alpha1.MigrationSucceeded, v1alpha1.MigrationRunning
	cases := []struct {
		name     string
		migs     []v1alpha1.VirtualMachineInstanceMigration
		now      time.Duration
		active   string
		failed   int
		wait     time.Duration
		describe string
	}{
		{"first attempt", nil, 0, "", 0, 0, "a migration off node n1 is being created"},
		{"one under way", []v1alpha1.VirtualMachineInstanceMigration{m("a", "n1", 0, R)}, time.Minute, "a", 0, 0, "migration a is Running"},
		{"a user's migration under way counts", []v1alpha1.VirtualMachineInstanceMigration{m("u", "", 0, "")}, time.Minute, "u", 0, 0, "migration u is Pending"},
		{"one failure: 20 s after it", []v1alpha1.VirtualMachineInstanceMigration{m("a", "n1", 0, F)}, 15 * time.Second, "", 1, 15 * time.Second,
			"next migration off node n1 in 15s; 1 migration(s) off node n1 failed before, the last: a (TargetPodFailed: a broke)"},
		{"two failures: 40 s after the last", []v1alpha1.VirtualMachineInstanceMigration{m("b", "n1", time.Minute, F), m("a", "n1", 0, F)},
			time.Minute + 20*time.Second, "", 2, 30 * time.Second, "2 migration(s) off node n1 failed before, the last: b (TargetPodFailed: b broke)"},
		{"backoff over", []v1alpha1.VirtualMachineInstanceMigration{m("a", "n1", 0, F)}, time.Minute, "", 1, 0, "a migration off node n1 is being created"},
		{"failures before a success do not count", []v1alpha1.VirtualMachineInstanceMigration{m("c", "n1", 2*time.Minute, F), m("b", "n1", time.Minute, S), m("a", "n1", 0, F)},
			2*time.Minute + 10*time.Second, "", 1, 20 * time.Second, "1 migration(s)"},
		{"failures off another node do not count", []v1alpha1.VirtualMachineInstanceMigration{m("a", "n0", 0, F)}, time.Second, "", 0, 0, "being created"},
		{"the backoff is capped", []v1alpha1.VirtualMachineInstanceMigration{m("f", "n1", 50*time.Minute, F), m("e", "n1", 40*time.Minute, F), m("d", "n1", 30*time.Minute, F),
			m("c", "n1", 20*time.Minute, F), m("b", "n1", 10*time.Minute, F), m("a", "n1", 0, F)}, 50*time.Minute + 10*time.Second, "", 6, EvacuationMaxBackoff, "6 migration(s)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ev := PlanEvacuation(vmi, c.migs, t0.Add(c.now))
			active := ""
			if ev.Active != nil {
				active = ev.Active.Name
			}
			if active != c.active || ev.Failed != c.failed || ev.Wait != c.wait {
				t.Fatalf("active %q failed %d wait %s; want %q, %d, %s", active, ev.Failed, ev.Wait, c.active, c.failed, c.wait)
			}
			if d := ev.Describe(); !strings.Contains(d, c.describe) {
				t.Fatalf("Describe() = %q, want it to contain %q", d, c.describe)
			}
		})
	}
}
