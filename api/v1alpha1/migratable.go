package v1alpha1

import "fmt"

// Reasons for the LiveMigratable condition.
const (
	MigratableReason             = "Migratable"
	BridgeOnPodNetworkReason     = "InterfaceNotLiveMigratable"
	HostDiskNotSharedReason      = "HostDiskNotLiveMigratable"
	DisksNotLiveMigratableReason = "DisksNotLiveMigratable"
)

// ClaimVolume is a volume of spec backed by a PersistentVolumeClaim (persistentVolumeClaim or
// ephemeral), with the claim's name and whether the instance only reads it. Not an API type.
// +kubebuilder:object:generate=false
type ClaimVolume struct {
	Volume, Claim string
	ReadOnly      bool
}

// ClaimVolumes are spec's volumes backed by claims, in spec order.
func ClaimVolumes(spec *VirtualMachineInstanceSpec) []ClaimVolume {
	var out []ClaimVolume
	for _, v := range spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			out = append(out, ClaimVolume{Volume: v.Name, Claim: v.PersistentVolumeClaim.ClaimName, ReadOnly: v.PersistentVolumeClaim.ReadOnly})
		case v.Ephemeral != nil && v.Ephemeral.PersistentVolumeClaim != nil:
			out = append(out, ClaimVolume{Volume: v.Name, Claim: v.Ephemeral.PersistentVolumeClaim.ClaimName, ReadOnly: true})
		}
	}
	return out
}

// LiveMigratable says whether an instance with this spec can live-migrate, and if not the reason
// (one of the constants above) and a message for people. The controller sets the LiveMigratable
// condition from it and a migration of a non-migratable instance fails at once with it. EFI
// firmware does not stand in the way: QEMU migrates the variable store's content with the guest
// and the target writes it to its own store.
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
	if name, kind := localWritableVolume(spec); name != "" {
		return false, DisksNotLiveMigratableReason, fmt.Sprintf("volume %q is %s written on this node only and qvirt does not migrate disk contents yet: "+
			"the guest would find it blank or stale on the target (attach it read-only, or use a persistentVolumeClaim)", name, kind)
	}
	return true, MigratableReason, "the instance can be live-migrated"
}

// localWritableVolume names the first volume whose written data exists only in a file on the
// instance's node, and what kind of volume it is; "" when there is none. Without block migration
// the target starts such a disk afresh (a blank emptyDisk, a new overlay on the image), so the
// guest would lose what it wrote while it keeps running.
func localWritableVolume(spec *VirtualMachineInstanceSpec) (name, kind string) {
	readOnly := map[string]bool{}
	for _, d := range spec.Domain.Devices.Disks {
		readOnly[d.Name] = d.CDRom != nil || (d.Disk != nil && d.Disk.ReadOnly)
	}
	for _, v := range spec.Volumes {
		if readOnly[v.Name] {
			continue
		}
		switch {
		case v.EmptyDisk != nil:
			return v.Name, "an emptyDisk,"
		case v.ContainerDisk != nil:
			return v.Name, "a writable containerDisk, whose overlay is"
		case v.Ephemeral != nil:
			return v.Name, "a writable ephemeral volume, whose overlay is"
		}
	}
	return "", ""
}
