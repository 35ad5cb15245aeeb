package migration

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
)

func mig(name, vmi string, phase v1alpha1.VirtualMachineInstanceMigrationPhase, source string, age time.Duration) v1alpha1.VirtualMachineInstanceMigration {
	m := v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.Time{Time: t0.Add(-age)}},
		Spec:   v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
		Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase},
	}
	if source != "" {
		m.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{SourceNode: source}
	}
	return m
}

func TestCheckLimits(t *testing.T) {
	limits := config.MigrationConfig{ParallelPerCluster: 3, ParallelOutboundPerNode: 2}
	self := mig("self", "vm0", v1alpha1.MigrationPending, "", 0)
	cases := []struct {
		name   string
		others []v1alpha1.VirtualMachineInstanceMigration
		limits config.MigrationConfig
		want   string
	}{
		{"nothing in flight", nil, limits, ""},
		{"one leaving the node", []v1alpha1.VirtualMachineInstanceMigration{
			mig("a", "vm1", v1alpha1.MigrationRunning, "node-a", time.Minute)}, limits, ""},
		{"node full", []v1alpha1.VirtualMachineInstanceMigration{
			mig("a", "vm1", v1alpha1.MigrationScheduling, "node-a", time.Minute),
			mig("b", "vm2", v1alpha1.MigrationTargetReady, "node-a", time.Minute)}, limits, ReasonNodeLimitReached},
		{"terminal and pending ones do not count", []v1alpha1.VirtualMachineInstanceMigration{
			mig("a", "vm1", v1alpha1.MigrationSucceeded, "node-a", time.Minute),
			mig("b", "vm2", v1alpha1.MigrationFailed, "node-a", time.Minute),
			mig("c", "vm3", v1alpha1.MigrationPending, "", time.Minute),
			mig("d", "vm4", v1alpha1.MigrationRunning, "node-a", time.Minute)}, limits, ""},
		{"cluster full from other nodes", []v1alpha1.VirtualMachineInstanceMigration{
			mig("a", "vm1", v1alpha1.MigrationRunning, "node-b", time.Minute),
			mig("b", "vm2", v1alpha1.MigrationRunning, "node-c", time.Minute),
			mig("c", "vm3", v1alpha1.MigrationRunning, "node-d", time.Minute)}, limits, ReasonClusterLimitReached},
		{"self does not count", []v1alpha1.VirtualMachineInstanceMigration{
			mig("self", "vm0", v1alpha1.MigrationRunning, "node-a", 0)},
			config.MigrationConfig{ParallelPerCluster: 1, ParallelOutboundPerNode: 1}, ""},
		{"zero limits mean one", []v1alpha1.VirtualMachineInstanceMigration{
			mig("a", "vm1", v1alpha1.MigrationRunning, "node-b", time.Minute)}, config.MigrationConfig{}, ReasonClusterLimitReached},
	}
	for _, tc := range cases {
		got := checkLimits(&self, "node-a", tc.others, tc.limits)
		reason := ""
		if got != nil {
			reason = got.Reason
		}
		if reason != tc.want {
			t.Errorf("%s: checkLimits = %q, want %q", tc.name, reason, tc.want)
		}
	}
}

func TestMigrationAhead(t *testing.T) {
	self := mig("self", "vm1", v1alpha1.MigrationPending, "", time.Minute)
	vmi := runningVMI()
	vmi.Name = "vm1"
	openVMI := vmi.DeepCopy()
	openVMI.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "gone"}
	closedVMI := vmi.DeepCopy()
	closedVMI.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationUID: "gone", Completed: true}
	deletingOld := mig("old", "vm1", v1alpha1.MigrationPending, "", time.Hour)
	deletingOld.DeletionTimestamp = &metav1.Time{Time: t0}
	cases := []struct {
		name   string
		vmi    *v1alpha1.VirtualMachineInstance
		others []v1alpha1.VirtualMachineInstanceMigration
		want   string
	}{
		{"alone", vmi, nil, ""},
		{"other instance", vmi, []v1alpha1.VirtualMachineInstanceMigration{mig("a", "vm2", v1alpha1.MigrationRunning, "", time.Hour)}, ""},
		{"in flight goes first", vmi, []v1alpha1.VirtualMachineInstanceMigration{mig("a", "vm1", v1alpha1.MigrationScheduling, "", 0)}, "a"},
		{"older pending goes first", vmi, []v1alpha1.VirtualMachineInstanceMigration{mig("a", "vm1", v1alpha1.MigrationPending, "", time.Hour)}, "a"},
		{"newer pending waits for self", vmi, []v1alpha1.VirtualMachineInstanceMigration{mig("a", "vm1", v1alpha1.MigrationPending, "", 0)}, ""},
		{"same age: the smaller name", vmi, []v1alpha1.VirtualMachineInstanceMigration{mig("a", "vm1", "", "", time.Minute)}, "a"},
		{"finished ones do not count", vmi, []v1alpha1.VirtualMachineInstanceMigration{mig("a", "vm1", v1alpha1.MigrationFailed, "", time.Hour)}, ""},
		{"deleted pending one does not count", vmi, []v1alpha1.VirtualMachineInstanceMigration{deletingOld}, ""},
		{"open state of another migration", openVMI, nil, "with UID gone"},
		{"closed state of another migration", closedVMI, nil, ""},
	}
	for _, tc := range cases {
		if got := migrationAhead(&self, tc.vmi, tc.others); got != tc.want {
			t.Errorf("%s: migrationAhead = %q, want %q", tc.name, got, tc.want)
		}
	}
}
