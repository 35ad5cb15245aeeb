package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The instancetype and preference kinds are KubeVirt's instancetype.kubevirt.io/v1beta1 kinds
// (staging/src/kubevirt.io/api/instancetype/v1beta1/types.go), with the same field names and JSON
// shapes, under qvirt.io/v1alpha1. A VirtualMachine refers to them with spec.instancetype and
// spec.preference; the VM controller expands them into each instance it creates
// (controllers/instancetype). Fields whose KubeVirt type qvirt has no counterpart for (gpus,
// hugepages, NUMA, ...) are kept schemaless so that a KubeVirt manifest reads as one, and refused
// by NotRealisedInstancetype and NotRealisedPreference naming the field.

// VirtualMachineInstancetype is a namespaced set of resource sizes (vCPUs, memory) and scheduling
// settings a VirtualMachine takes by reference (spec.instancetype).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=vminstancetype;vminstancetypes;vmf;vmfs,categories=all;qvirt
// +kubebuilder:printcolumn:name="vCPUs",type=integer,JSONPath=".spec.cpu.guest"
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=".spec.memory.guest"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type VirtualMachineInstancetype struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the instancetype.
	Spec VirtualMachineInstancetypeSpec `json:"spec"`
}

// VirtualMachineInstancetypeList is a list of VirtualMachineInstancetypes.
//
// +kubebuilder:object:root=true
type VirtualMachineInstancetypeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstancetype `json:"items"`
}

// VirtualMachineClusterInstancetype is the cluster-scoped VirtualMachineInstancetype, the kind a
// VirtualMachine's spec.instancetype names when it gives no kind.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vmclusterinstancetype;vmclusterinstancetypes;vmcf;vmcfs,categories=all;qvirt
// +kubebuilder:printcolumn:name="vCPUs",type=integer,JSONPath=".spec.cpu.guest"
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=".spec.memory.guest"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type VirtualMachineClusterInstancetype struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the instancetype.
	Spec VirtualMachineInstancetypeSpec `json:"spec"`
}

// VirtualMachineClusterInstancetypeList is a list of VirtualMachineClusterInstancetypes.
//
// +kubebuilder:object:root=true
type VirtualMachineClusterInstancetypeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineClusterInstancetype `json:"items"`
}

// VirtualMachineInstancetypeSpec is what an instancetype sets in the instance: its vCPUs and memory
// are required, the rest optional. A VirtualMachine that sets any of these itself is refused
// (KubeVirt's conflict rules), naming the field.
type VirtualMachineInstancetypeSpec struct {
	// NodeSelector must match a node's labels for the instance to be scheduled there.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// SchedulerName is the scheduler that places the launcher pod.
	// +optional
	SchedulerName string `json:"schedulerName,omitempty"`

	// CPU is the guest's vCPU count and model.
	CPU CPUInstancetype `json:"cpu"`

	// Memory is the guest's memory.
	Memory MemoryInstancetype `json:"memory"`

	// GPUs are KubeVirt's GPU devices; not supported by this version of qvirt (refused).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	GPUs *runtime.RawExtension `json:"gpus,omitempty"`

	// HostDevices are KubeVirt's host devices; not supported by this version of qvirt (refused).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	HostDevices *runtime.RawExtension `json:"hostDevices,omitempty"`

	// IOThreadsPolicy is the instance's domain.ioThreadsPolicy: shared or auto (supplementalPool is
	// refused, as on an instance).
	// +optional
	IOThreadsPolicy *IOThreadsPolicy `json:"ioThreadsPolicy,omitempty"`

	// IOThreads is KubeVirt's supplementalPool I/O thread setting; not supported by this version
	// of qvirt (refused).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	IOThreads *runtime.RawExtension `json:"ioThreads,omitempty"`

	// LaunchSecurity is KubeVirt's confidential computing setting (SEV); not supported by this
	// version of qvirt (refused).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	LaunchSecurity *runtime.RawExtension `json:"launchSecurity,omitempty"`

	// Annotations are added to the instance's annotations; the VirtualMachine's template wins
	// where both set one.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// CPUInstancetype is the CPU of an instancetype.
type CPUInstancetype struct {
	// Guest is the number of vCPUs; the preference's preferredCPUTopology lays them out as sockets
	// (the default), cores, threads or a spread.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	Guest uint32 `json:"guest"`

	// Model is the CPU model, as the instance's domain.cpu.model.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9_.]*$`
	Model *string `json:"model,omitempty"`

	// DedicatedCPUPlacement is the instance's domain.cpu.dedicatedCpuPlacement: each vCPU pinned
	// to a host CPU of its own.
	// +optional
	DedicatedCPUPlacement *bool `json:"dedicatedCPUPlacement,omitempty"`

	// NUMA is the instance's domain.cpu.numa.
	// +optional
	NUMA *NUMA `json:"numa,omitempty"`

	// IsolateEmulatorThread is the instance's domain.cpu.isolateEmulatorThread: QEMU's other
	// threads on one more dedicated host CPU.
	// +optional
	IsolateEmulatorThread *bool `json:"isolateEmulatorThread,omitempty"`

	// Realtime is the instance's domain.cpu.realtime.
	// +optional
	Realtime *Realtime `json:"realtime,omitempty"`

	// MaxSockets is the instance's domain.cpu.maxSockets: the most sockets CPU hotplug may reach.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxSockets *uint32 `json:"maxSockets,omitempty"`
}

// MemoryInstancetype is the memory of an instancetype.
type MemoryInstancetype struct {
	// Guest is the memory the guest sees, as the instance's domain.memory.guest.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="memory.guest must be a positive quantity"
	Guest resource.Quantity `json:"guest"`

	// Hugepages is the instance's domain.memory.hugepages: the guest's RAM on huge pages.
	// +optional
	Hugepages *Hugepages `json:"hugepages,omitempty"`

	// OvercommitPercent lowers the launcher pod's memory request below the guest memory by this
	// percentage (resources.requests.memory = guest * (100 - overcommitPercent) / 100), as KubeVirt
	// does. Defaults to 0.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	OvercommitPercent int `json:"overcommitPercent,omitempty"`

	// MaxGuest is the instance's domain.memory.maxGuest: the most memory hotplug may reach.
	// +optional
	MaxGuest *resource.Quantity `json:"maxGuest,omitempty"`
}

// VirtualMachinePreference is a namespaced set of preferred settings a VirtualMachine takes by
// reference (spec.preference): each fills only what the VirtualMachine leaves unset.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=vmpref;vmprefs;vmp;vmps,categories=all;qvirt
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type VirtualMachinePreference struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the preference.
	Spec VirtualMachinePreferenceSpec `json:"spec"`
}

// VirtualMachinePreferenceList is a list of VirtualMachinePreferences.
//
// +kubebuilder:object:root=true
type VirtualMachinePreferenceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachinePreference `json:"items"`
}

// VirtualMachineClusterPreference is the cluster-scoped VirtualMachinePreference, the kind a
// VirtualMachine's spec.preference names when it gives no kind.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vmcp;vmcps,categories=all;qvirt
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type VirtualMachineClusterPreference struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the preference.
	Spec VirtualMachinePreferenceSpec `json:"spec"`
}

// VirtualMachineClusterPreferenceList is a list of VirtualMachineClusterPreferences.
//
// +kubebuilder:object:root=true
type VirtualMachineClusterPreferenceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineClusterPreference `json:"items"`
}

// VirtualMachinePreferenceSpec is what a preference fills in where the VirtualMachine leaves a
// field unset.
type VirtualMachinePreferenceSpec struct {
	// Clock is the preferred clock offset and timers.
	// +optional
	Clock *ClockPreferences `json:"clock,omitempty"`

	// CPU holds the preferred topology of the instancetype's vCPUs.
	// +optional
	CPU *CPUPreferences `json:"cpu,omitempty"`

	// Devices holds the preferred device settings.
	// +optional
	Devices *DevicePreferences `json:"devices,omitempty"`

	// Features holds the preferred platform features.
	// +optional
	Features *FeaturePreferences `json:"features,omitempty"`

	// Firmware holds the preferred bootloader.
	// +optional
	Firmware *FirmwarePreferences `json:"firmware,omitempty"`

	// Machine holds the preferred machine type.
	// +optional
	Machine *MachinePreferences `json:"machine,omitempty"`

	// Volumes holds the preferred storage class of dataVolumeTemplates; not supported by this
	// version of qvirt, which has no DataVolumes (refused).
	// +optional
	Volumes *VolumePreferences `json:"volumes,omitempty"`

	// PreferredSubdomain is the instance's subdomain when it sets none.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	PreferredSubdomain *string `json:"preferredSubdomain,omitempty"`

	// PreferredTerminationGracePeriodSeconds is the instance's terminationGracePeriodSeconds when
	// it sets none.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PreferredTerminationGracePeriodSeconds *int64 `json:"preferredTerminationGracePeriodSeconds,omitempty"`

	// Requirements are the least vCPUs and memory the instancetype (or the VirtualMachine itself)
	// must provide.
	// +optional
	Requirements *PreferenceRequirements `json:"requirements,omitempty"`

	// Annotations are added to the instance's annotations where neither the VirtualMachine's
	// template nor the instancetype sets them.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// PreferSpreadSocketToCoreRatio is the deprecated place of cpu.spreadOptions.ratio.
	// +optional
	PreferSpreadSocketToCoreRatio uint32 `json:"preferSpreadSocketToCoreRatio,omitempty"`

	// PreferredArchitecture is the guest architecture; qvirt runs amd64 guests only, so any other
	// is refused.
	// +optional
	PreferredArchitecture *string `json:"preferredArchitecture,omitempty"`
}

// PreferredCPUTopology is how an instancetype's vCPUs are laid out.
// +kubebuilder:validation:Enum=preferCores;preferSockets;preferThreads;preferSpread;preferAny;cores;sockets;threads;spread;any
type PreferredCPUTopology string

// Preferred CPU topologies, as KubeVirt's (the prefer* spellings are its deprecated ones).
const (
	PreferCores             PreferredCPUTopology = "cores"
	PreferSockets           PreferredCPUTopology = "sockets"
	PreferThreads           PreferredCPUTopology = "threads"
	PreferSpread            PreferredCPUTopology = "spread"
	PreferAny               PreferredCPUTopology = "any"
	DeprecatedPreferCores   PreferredCPUTopology = "preferCores"
	DeprecatedPreferSockets PreferredCPUTopology = "preferSockets"
	DeprecatedPreferThreads PreferredCPUTopology = "preferThreads"
	DeprecatedPreferSpread  PreferredCPUTopology = "preferSpread"
	DeprecatedPreferAny     PreferredCPUTopology = "preferAny"
)

// CPUPreferences are the preferred CPU settings.
type CPUPreferences struct {
	// PreferredCPUTopology lays the instancetype's vCPUs out as sockets (the default), cores,
	// threads, or a spread over sockets and cores (spreadOptions).
	// +optional
	PreferredCPUTopology *PreferredCPUTopology `json:"preferredCPUTopology,omitempty"`

	// SpreadOptions shape the spread topology.
	// +optional
	SpreadOptions *SpreadOptions `json:"spreadOptions,omitempty"`

	// PreferredCPUFeatures are added to domain.cpu.features, each unless the VirtualMachine names
	// the same feature.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	PreferredCPUFeatures []CPUFeature `json:"preferredCPUFeatures,omitempty"`
}

// SpreadAcross is what a spread topology spreads vCPUs across.
// +kubebuilder:validation:Enum=SocketsCoresThreads;SocketsCores;CoresThreads
type SpreadAcross string

// Spreads, as KubeVirt's.
const (
	SpreadAcrossSocketsCoresThreads SpreadAcross = "SocketsCoresThreads"
	SpreadAcrossSocketsCores        SpreadAcross = "SocketsCores"
	SpreadAcrossCoresThreads        SpreadAcross = "CoresThreads"
)

// SpreadOptions shape the spread topology.
type SpreadOptions struct {
	// Across is SocketsCores (the default), SocketsCoresThreads or CoresThreads.
	// +optional
	Across *SpreadAcross `json:"across,omitempty"`

	// Ratio is cores per socket (SocketsCores, SocketsCoresThreads) or threads per core
	// (CoresThreads, where only 2 is accepted). Defaults to 2.
	// +optional
	// +kubebuilder:validation:Minimum=1
	Ratio *uint32 `json:"ratio,omitempty"`
}

// DevicePreferences are the preferred device settings, each applied where the VirtualMachine
// leaves the field unset.
type DevicePreferences struct {
	// PreferredAutoattachGraphicsDevice is domain.devices.autoattachGraphicsDevice.
	// +optional
	PreferredAutoattachGraphicsDevice *bool `json:"preferredAutoattachGraphicsDevice,omitempty"`
	// PreferredAutoattachMemBalloon is domain.devices.autoattachMemBalloon.
	// +optional
	PreferredAutoattachMemBalloon *bool `json:"preferredAutoattachMemBalloon,omitempty"`
	// PreferredAutoattachPodInterface is domain.devices.autoattachPodInterface.
	// +optional
	PreferredAutoattachPodInterface *bool `json:"preferredAutoattachPodInterface,omitempty"`
	// PreferredAutoattachSerialConsole is domain.devices.autoattachSerialConsole.
	// +optional
	PreferredAutoattachSerialConsole *bool `json:"preferredAutoattachSerialConsole,omitempty"`
	// PreferredAutoattachInputDevice is domain.devices.autoattachInputDevice.
	// +optional
	PreferredAutoattachInputDevice *bool `json:"preferredAutoattachInputDevice,omitempty"`
	// PreferredDisableHotplug is domain.devices.disableHotplug when the VirtualMachine leaves it
	// false.
	// +optional
	PreferredDisableHotplug *bool `json:"preferredDisableHotplug,omitempty"`
	// PreferredVirtualGPUOptions: not supported by this version of qvirt (refused).
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	PreferredVirtualGPUOptions *runtime.RawExtension `json:"preferredVirtualGPUOptions,omitempty"`
	// PreferredSoundModel is the model of a sound card that names none.
	// +optional
	// +kubebuilder:validation:Enum=ich9;ac97
	PreferredSoundModel string `json:"preferredSoundModel,omitempty"`
	// PreferredUseVirtioTransitional is domain.devices.useVirtioTransitional when the VM leaves it
	// unset.
	// +optional
	PreferredUseVirtioTransitional *bool `json:"preferredUseVirtioTransitional,omitempty"`
	// PreferredInputBus is the bus of inputs that set none.
	// +optional
	PreferredInputBus InputBus `json:"preferredInputBus,omitempty"`
	// PreferredInputType is the type of inputs that set none.
	// +optional
	PreferredInputType InputType `json:"preferredInputType,omitempty"`
	// PreferredDiskBus is the bus of hard disks that set none (a disk with neither disk nor cdrom
	// is a hard disk).
	// +optional
	PreferredDiskBus DiskBus `json:"preferredDiskBus,omitempty"`
	// PreferredLunBus is the bus of luns that set none; scsi is the only bus a LUN can be passed
	// through on.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == 'scsi'",message="a lun is passed through on the scsi bus; virtio and sata cannot carry SCSI commands"
	PreferredLunBus DiskBus `json:"preferredLunBus,omitempty"`
	// PreferredCdromBus is the bus of cdroms that set none.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self != 'virtio'",message="a cdrom cannot use the virtio bus; use sata or scsi"
	PreferredCdromBus DiskBus `json:"preferredCdromBus,omitempty"`
	// PreferredDiskDedicatedIoThread is dedicatedIOThread of virtio hard disks that set none.
	// +optional
	PreferredDiskDedicatedIoThread *bool `json:"preferredDiskDedicatedIoThread,omitempty"`
	// PreferredDiskCache is the cache mode of disks that set none.
	// +optional
	PreferredDiskCache DriverCache `json:"preferredDiskCache,omitempty"`
	// PreferredDiskIO is the I/O mode of disks that set none.
	// +optional
	PreferredDiskIO DriverIO `json:"preferredDiskIO,omitempty"`
	// PreferredDiskBlockSize is the block size of hard disks that set none.
	// +optional
	PreferredDiskBlockSize *BlockSize `json:"preferredDiskBlockSize,omitempty"`
	// PreferredInterfaceModel is the model of interfaces that set none.
	// +optional
	// +kubebuilder:validation:Enum=virtio;e1000;e1000e;rtl8139
	PreferredInterfaceModel string `json:"preferredInterfaceModel,omitempty"`
	// PreferredRng gives the guest a virtio-rng device when the VirtualMachine has none.
	// +optional
	PreferredRng *Rng `json:"preferredRng,omitempty"`
	// PreferredBlockMultiQueue is domain.devices.blockMultiQueue.
	// +optional
	PreferredBlockMultiQueue *bool `json:"preferredBlockMultiQueue,omitempty"`
	// PreferredNetworkInterfaceMultiQueue is domain.devices.networkInterfaceMultiqueue.
	// +optional
	PreferredNetworkInterfaceMultiQueue *bool `json:"preferredNetworkInterfaceMultiQueue,omitempty"`
	// PreferredTPM is domain.devices.tpm when the VirtualMachine has none.
	// +optional
	PreferredTPM *TPMDevice `json:"preferredTPM,omitempty"`
	// PreferredInterfaceMasquerade gives interfaces that name no binding the masquerade binding.
	// +optional
	PreferredInterfaceMasquerade *InterfaceMasquerade `json:"preferredInterfaceMasquerade,omitempty"`
	// PreferredPanicDeviceModel is the model of panic devices that name none.
	// +optional
	PreferredPanicDeviceModel *PanicDeviceModel `json:"preferredPanicDeviceModel,omitempty"`
	// PreferredVideoType is domain.devices.video's type when the VirtualMachine names none.
	// +optional
	PreferredVideoType *string `json:"preferredVideoType,omitempty"`
}

// ClockPreferences are the preferred clock offset and timers, as KubeVirt's: each applies whole,
// and only where the VirtualMachine's domain.clock sets no offset (or no timer).
type ClockPreferences struct {
	// PreferredClockOffset is domain.clock's utc or timezone.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!(has(self.utc) && has(self.timezone))",message="utc and timezone are mutually exclusive: set at most one"
	PreferredClockOffset *ClockOffset `json:"preferredClockOffset,omitempty"`
	// PreferredTimer is domain.clock.timer.
	// +optional
	PreferredTimer *Timer `json:"preferredTimer,omitempty"`
}

// FeaturePreferences are the preferred platform features, each applied where the
// VirtualMachine's domain.features leaves the feature unset.
type FeaturePreferences struct {
	// PreferredAcpi is features.acpi.
	// +optional
	PreferredAcpi *FeatureState `json:"preferredAcpi,omitempty"`
	// PreferredApic is features.apic.
	// +optional
	PreferredApic *FeatureAPIC `json:"preferredApic,omitempty"`
	// PreferredHyperv are features.hyperv's enlightenments, each where the VirtualMachine leaves
	// it unset (not when hypervPassthrough is enabled).
	// +optional
	PreferredHyperv *FeatureHyperv `json:"preferredHyperv,omitempty"`
	// PreferredKvm is features.kvm.
	// +optional
	PreferredKvm *FeatureKVM `json:"preferredKvm,omitempty"`
	// PreferredPvspinlock is features.pvspinlock.
	// +optional
	PreferredPvspinlock *FeatureState `json:"preferredPvspinlock,omitempty"`
	// PreferredSmm is features.smm.
	// +optional
	PreferredSmm *FeatureState `json:"preferredSmm,omitempty"`
}

// FirmwarePreferences are the preferred bootloader, applied when the VirtualMachine names none.
type FirmwarePreferences struct {
	// PreferredUseBios boots through BIOS.
	// +optional
	PreferredUseBios *bool `json:"preferredUseBios,omitempty"`
	// PreferredUseBiosSerial shows the BIOS's output on the serial console (bios.useSerial).
	// +optional
	PreferredUseBiosSerial *bool `json:"preferredUseBiosSerial,omitempty"`
	// DeprecatedPreferredUseEfi boots through EFI (KubeVirt's deprecated form of preferredEfi).
	// +optional
	DeprecatedPreferredUseEfi *bool `json:"preferredUseEfi,omitempty"`
	// DeprecatedPreferredUseSecureBoot sets efi.secureBoot (deprecated with preferredUseEfi).
	// +optional
	DeprecatedPreferredUseSecureBoot *bool `json:"preferredUseSecureBoot,omitempty"`
	// PreferredEfi is the EFI bootloader.
	// +optional
	PreferredEfi *EFI `json:"preferredEfi,omitempty"`
}

// MachinePreferences are the preferred machine settings.
type MachinePreferences struct {
	// PreferredMachineType is the machine type when the VirtualMachine names none.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(q35|pc-q35-[0-9.]+)$`
	PreferredMachineType string `json:"preferredMachineType,omitempty"`
}

// VolumePreferences are the preferred storage settings.
type VolumePreferences struct {
	// PreferredStorageClassName is the storage class of dataVolumeTemplates whose pvc or storage
	// names none, recorded in the VM when it is created or updated.
	// +optional
	PreferredStorageClassName string `json:"preferredStorageClassName,omitempty"`
}

// PreferenceRequirements are the least resources a preference needs.
type PreferenceRequirements struct {
	// CPU is the least vCPU count.
	// +optional
	CPU *CPUPreferenceRequirement `json:"cpu,omitempty"`
	// Memory is the least guest memory.
	// +optional
	Memory *MemoryPreferenceRequirement `json:"memory,omitempty"`
	// Architecture is the required guest architecture; only amd64 is accepted.
	// +optional
	Architecture *string `json:"architecture,omitempty"`
}

// CPUPreferenceRequirement is the least vCPU count.
type CPUPreferenceRequirement struct {
	// Guest is the least number of vCPUs.
	Guest uint32 `json:"guest"`
}

// MemoryPreferenceRequirement is the least guest memory.
type MemoryPreferenceRequirement struct {
	// Guest is the least guest memory.
	Guest resource.Quantity `json:"guest"`
}

// Kinds a VirtualMachine's spec.instancetype.kind and spec.preference.kind may name, in KubeVirt's
// lower-case singular spelling (pkg/instancetype/find accepts the plural and the cluster forms).
const (
	InstancetypeKind                = "VirtualMachineInstancetype"
	ClusterInstancetypeKind         = "VirtualMachineClusterInstancetype"
	SingularInstancetypeKind        = "virtualmachineinstancetype"
	PluralInstancetypeKind          = "virtualmachineinstancetypes"
	SingularClusterInstancetypeKind = "virtualmachineclusterinstancetype"
	PluralClusterInstancetypeKind   = "virtualmachineclusterinstancetypes"
	PreferenceKind                  = "VirtualMachinePreference"
	ClusterPreferenceKind           = "VirtualMachineClusterPreference"
	SingularPreferenceKind          = "virtualmachinepreference"
	PluralPreferenceKind            = "virtualmachinepreferences"
	SingularClusterPreferenceKind   = "virtualmachineclusterpreference"
	PluralClusterPreferenceKind     = "virtualmachineclusterpreferences"
)

// DefaultInstancetypeLabel and DefaultPreferenceLabel on a PersistentVolumeClaim name the
// instancetype and preference a VirtualMachine infers from it (inferFromVolume); the -kind labels
// name their kinds (cluster-scoped when absent). KubeVirt's labels, unchanged.
const (
	DefaultInstancetypeLabel     = "instancetype.kubevirt.io/default-instancetype"
	DefaultInstancetypeKindLabel = "instancetype.kubevirt.io/default-instancetype-kind"
	DefaultPreferenceLabel       = "instancetype.kubevirt.io/default-preference"
	DefaultPreferenceKindLabel   = "instancetype.kubevirt.io/default-preference-kind"
)
