package migration

import (
	"fmt"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
)

// limitHold says why the parallel-migration limits keep a migration Pending.
type limitHold struct {
	Reason  string
	Message string
}

// sourceNodeOf is the node a migration leaves, as recorded in its status when it left Pending.
func sourceNodeOf(m *v1alpha1.VirtualMachineInstanceMigration) string {
	if m.Status.MigrationState == nil {
		return ""
	}
	return m.Status.MigrationState.SourceNode
}

// checkLimits reports whether starting self, which leaves sourceNode, would exceed the cluster's
// or the source node's parallel-migration limit, counting the migrations in all that are in flight
// (Scheduling to Running). self itself never counts. A limit below 1 is treated as 1.
func checkLimits(self *v1alpha1.VirtualMachineInstanceMigration, sourceNode string,
	all []v1alpha1.VirtualMachineInstanceMigration, limits config.MigrationConfig) *limitHold {
	perCluster, perNode := max(limits.ParallelPerCluster, 1), max(limits.ParallelOutboundPerNode, 1)
	cluster, node := 0, 0
	for i := range all {
		m := &all[i]
		if m.UID == self.UID || !isInFlight(m.Status.Phase) {
			continue
		}
		cluster++
		if sourceNodeOf(m) == sourceNode {
			node++
		}
	}
	if cluster >= perCluster {
		return &limitHold{Reason: ReasonClusterLimitReached,
			Message: fmt.Sprintf("%d migrations are in flight in the cluster, the limit is %d (parallelMigrationsPerCluster)", cluster, perCluster)}
	}
	if node >= perNode {
		return &limitHold{Reason: ReasonNodeLimitReached,
			Message: fmt.Sprintf("%d migrations are leaving node %s, the limit is %d (parallelOutboundMigrationsPerNode)", node, sourceNode, perNode)}
	}
	return nil
}

// migrationAhead names another migration of the same instance that goes before self, or returns "".
// One migration per instance runs at a time: one in flight goes first, and among Pending ones the
// oldest (then the smallest name) does; the others fail with MigrationInProgress, as in KubeVirt.
// An open migration state on the instance that belongs to another migration also goes first.
func migrationAhead(self *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance,
	all []v1alpha1.VirtualMachineInstanceMigration) string {
	for i := range all {
		m := &all[i]
		if m.UID == self.UID || m.Namespace != self.Namespace || m.Spec.VMIName != self.Spec.VMIName || isTerminal(m.Status.Phase) {
			continue
		}
		if isInFlight(m.Status.Phase) {
			return m.Name
		}
		if m.DeletionTimestamp != nil {
			continue
		}
		older := m.CreationTimestamp.Before(&self.CreationTimestamp) ||
			(m.CreationTimestamp.Equal(&self.CreationTimestamp) && m.Name < self.Name)
		if older {
			return m.Name
		}
	}
	if vmi != nil && openState(vmi.Status.MigrationState) && vmi.Status.MigrationState.MigrationUID != self.UID {
		return "with UID " + string(vmi.Status.MigrationState.MigrationUID)
	}
	return ""
}
