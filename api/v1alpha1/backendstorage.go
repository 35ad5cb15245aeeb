package v1alpha1

// Backend storage, as KubeVirt's (pkg/storage/backend-storage): an instance with a persistent TPM
// or persistent EFI variables keeps them on a PersistentVolumeClaim of its own, which the VMI
// controller creates (BackendStorageClaim) in the instance's namespace, controlled by the
// VirtualMachine when one owns the instance (so the state lasts as long as the VM) and by the
// instance otherwise. The launcher pod mounts it; the launcher keeps the EFI variable store and
// the TPM's state in it.

// BackendStorageClaimPrefix starts the name of an instance's backend-storage claim, as KubeVirt's.
const BackendStorageClaimPrefix = "persistent-state-for-"

// BackendStorageSize is the size the claim asks for, as KubeVirt's.
const BackendStorageSize = "10Mi"

// BackendStorageClaim is the name of the backend-storage claim of the instance called name (a
// VM's instance is called as the VM, so a VM keeps one claim across its instances).
func BackendStorageClaim(name string) string { return BackendStorageClaimPrefix + name }

// PersistentTPM says whether spec's TPM keeps its state across instances.
func PersistentTPM(spec *VirtualMachineInstanceSpec) bool {
	t := spec.Domain.Devices.TPM
	return TPMEnabled(&spec.Domain.Devices) && t.Persistent != nil && *t.Persistent
}

// PersistentEFI says whether spec's EFI variable store lasts across instances.
func PersistentEFI(spec *VirtualMachineInstanceSpec) bool {
	efi := EFIBootloader(&spec.Domain)
	return efi != nil && efi.Persistent != nil && *efi.Persistent
}

// NeedsBackendStorage says whether an instance of spec needs a backend-storage claim.
func NeedsBackendStorage(spec *VirtualMachineInstanceSpec) bool {
	return PersistentTPM(spec) || PersistentEFI(spec)
}
