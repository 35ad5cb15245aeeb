package v1alpha1

import "fmt"

// Reasons for the LiveMigratable condition.
const (
	MigratableReason                 = "Migratable"
	InterfaceNotLiveMigratableReason = "InterfaceNotLiveMigratable"
	HostDiskNotSharedReason          = "HostDiskNotLiveMigratable"
	DisksNotLiveMigratableReason     = "DisksNotLiveMigratable"
	// HypervPassthroughReason is KubeVirt's VirtualMachineInstanceReasonHypervPassthroughNotMigratable.
	HypervPassthroughReason = "HypervPassthroughNotLiveMigratable"
	// VirtIOFSReason is KubeVirt's VirtualMachineInstanceReasonVirtIOFSNotMigratable.
	VirtIOFSReason = "VirtIOFSNotLiveMigratable"
	// PersistentStateReason: the instance keeps a persistent TPM or EFI variables on a
	// backend-storage claim (backendstorage.go) that a migration target cannot share: one that is
	// not ReadWriteMany (the VMI controller judges the claim, as it judges disk claims).
	PersistentStateReason = "PersistentStateNotLiveMigratable"
	// HugepagesUnderEmulationReason: the instance's RAM is of huge pages and the cluster runs its
	// guests under emulation (TCG), where QEMU 7.2 cannot migrate such RAM safely.
	HugepagesUnderEmulationReason = "HugepagesNotLiveMigratableUnderEmulation"
	// MemoryHotplugUnderEmulationReason: the instance has memory hotplug room (maxGuest) and the
	// cluster runs its guests under emulation (TCG), where QEMU 7.2 cannot migrate it safely.
	MemoryHotplugUnderEmulationReason = "MemoryHotplugNotLiveMigratableUnderEmulation"
)

// ClaimVolume is a volume of spec backed by a PersistentVolumeClaim (persistentVolumeClaim,
// ephemeral, or dataVolume: CDI's claim of a DataVolume has the DataVolume's name), with the claim's name and whether the instance only reads it. Not an API type.
// +kubebuilder:object:generate=false
type ClaimVolume struct {
	Volume, Claim string
	ReadOnly      bool
	// DataVolume is set for a dataVolume volume: Claim is then the DataVolume's name too.
	DataVolume bool
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
		case v.DataVolume != nil:
			out = append(out, ClaimVolume{Volume: v.Name, Claim: v.DataVolume.Name, DataVolume: true})
		}
	}
	return out
}

// LiveMigratable says whether an instance with this spec can live-migrate, and if not the reason
// (one of the constants above) and a message for people. The controller sets the LiveMigratable
// condition from it and a migration of a non-migratable instance fails at once with it. EFI
// firmware does not stand in the way: QEMU migrates the variable store's content with the guest
// and the target writes it to its own store. Nor do disks whose contents live on the node only
// (LocalDisks): a migration copies them to the target (block migration).
func LiveMigratable(spec *VirtualMachineInstanceSpec) (ok bool, reason, message string) {
	for _, in := range spec.Domain.Devices.Interfaces {
		if in.IsPasst() {
			// As KubeVirt's passt plugin unless registered with a migration method: the guest
			// keeps the source pod's address, which the target's passt would not serve.
			return false, InterfaceNotLiveMigratableReason, fmt.Sprintf("interface %q uses the passt binding, which gives the guest the pod's address", in.Name)
		}
		if in.IsSlirp() {
			// As KubeVirt's slirp plugin, registered with no migration method.
			return false, InterfaceNotLiveMigratableReason, fmt.Sprintf("interface %q uses the slirp binding, whose connections live in the source QEMU's own network stack", in.Name)
		}
		if in.Bridge == nil {
			continue
		}
		if n := spec.Network(in.Name); n != nil && n.IsSecondary() {
			// KubeVirt migrates these; here the target pod's interface would have another MAC and,
			// with IPAM, another address than the one the guest keeps.
			return false, InterfaceNotLiveMigratableReason, fmt.Sprintf("interface %q uses the bridge binding on its multus network, which gives the guest the pod interface's MAC and address; the target pod's would differ", in.Name)
		}
		return false, InterfaceNotLiveMigratableReason, fmt.Sprintf("interface %q uses the bridge binding on the pod network, which gives the guest the pod's address", in.Name)
	}
	if f := spec.Domain.Features; f != nil && f.HypervPassthrough != nil && (f.HypervPassthrough.Enabled == nil || *f.HypervPassthrough.Enabled) {
		return false, HypervPassthroughReason, "features.hypervPassthrough gives the guest the Hyper-V enlightenments of this node's KVM, which another node's may not offer"
	}
	if fss := spec.Domain.Devices.Filesystems; len(fss) > 0 {
		// virtiofsd's state (the guest's open files, its inode numbers) does not migrate with QEMU
		// 7.2's vhost-user-fs device, which blocks migration; KubeVirt refuses it the same way.
		return false, VirtIOFSReason, fmt.Sprintf("filesystem %q is shared with virtiofs, whose state does not migrate", fss[0].Name)
	}
	for _, v := range spec.Volumes {
		if v.HostDisk != nil && (v.HostDisk.Shared == nil || !*v.HostDisk.Shared) {
			return false, HostDiskNotSharedReason, fmt.Sprintf("volume %q is a host disk that is not marked shared", v.Name)
		}
	}
	return true, MigratableReason, "the instance can be live-migrated"
}

// LocalDisks names, in spec order, the volumes whose written data exists only in a file on the
// instance's node: writable emptyDisks, and the overlays of writable containerDisks and ephemeral
// volumes. A migration copies them to the target (the node agents tunnel the copy as they do the
// memory): the target starts such a disk afresh (a blank emptyDisk, a new overlay over the same
// image) and the source mirrors its contents into it before the switch-over.
func LocalDisks(spec *VirtualMachineInstanceSpec) []string {
	readOnly := map[string]bool{}
	for _, d := range spec.Domain.Devices.Disks {
		readOnly[d.Name] = d.CDRom != nil || (d.Disk != nil && d.Disk.ReadOnly) || (d.LUN != nil && d.LUN.ReadOnly)
	}
	var out []string
	for _, v := range spec.Volumes {
		if !readOnly[v.Name] && (v.EmptyDisk != nil || v.ContainerDisk != nil || v.Ephemeral != nil) {
			out = append(out, v.Name)
		}
	}
	return out
}
