package v1alpha1

import "fmt"

// Reasons for the LiveMigratable condition.
const (
	MigratableReason             = "Migratable"
	BridgeOnPodNetworkReason     = "InterfaceNotLiveMigratable"
	HostDiskNotSharedReason      = "HostDiskNotLiveMigratable"
	DisksNotLiveMigratableReason = "DisksNotLiveMigratable"
)

// LiveMigratable says whether an instance with this spec can live-migrate, and if not the reason
// (one of the constants above) and a message for people. The controller sets the LiveMigratable
// condition from it and a migration of a non-migratable instance fails at once with it.
func LiveMigratable(spec *VirtualMachineInstanceSpec) (ok bool, reason, message string) {
	pod := map[string]bool{}
	for _, n := range spec.Networks {
		if n.Pod != nil {
			pod[n.Name] = true
		}
	}
	for _, in := range spec.Domain.Devices.Interfaces {
		if in.Bridge != nil && pod[in.Name] {
			return false, BridgeOnPodNetworkReason, fmt.Sprintf("interface %q uses the bridge binding on the pod network, which gives the guest the pod's address", in.Name)
		}
	}
	for _, v := range spec.Volumes {
		if v.HostDisk != nil && (v.HostDisk.Shared == nil || !*v.HostDisk.Shared) {
			return false, HostDiskNotSharedReason, fmt.Sprintf("volume %q is a host disk that is not marked shared", v.Name)
		}
	}
	return true, MigratableReason, "the instance can be live-migrated"
}
