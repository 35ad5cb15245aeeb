package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// VirtualMachineInstancePhase is where an instance is in its life.
// +kubebuilder:validation:Enum=Pending;Scheduling;Scheduled;Running;Succeeded;Failed;Unknown
type VirtualMachineInstancePhase string

// Instance phases, as in KubeVirt.
const (
	// Pending: accepted, no launcher pod yet.
	Pending VirtualMachineInstancePhase = "Pending"
	// Scheduling: the launcher pod exists and waits for a node.
	Scheduling VirtualMachineInstancePhase = "Scheduling"
	// Scheduled: the launcher pod runs on a node; the node agent has not started the guest yet.
	Scheduled VirtualMachineInstancePhase = "Scheduled"
	// Running: the guest runs (or is paused); set by the node agent.
	Running VirtualMachineInstancePhase = "Running"
	// Succeeded: the guest powered off cleanly.
	Succeeded VirtualMachineInstancePhase = "Succeeded"
	// Failed: the guest or its launcher ended abnormally; status.reason says why.
	Failed VirtualMachineInstancePhase = "Failed"
	// Unknown: the node agent lost track of the instance.
	Unknown VirtualMachineInstancePhase = "Unknown"
)

// Final reports whether the phase is an end: Succeeded or Failed, never left again.
func (p VirtualMachineInstancePhase) Final() bool { return p == Succeeded || p == Failed }

// Condition types of an instance.
const (
	// VirtualMachineInstanceReady is true while the guest runs and is not paused.
	VirtualMachineInstanceReady = "Ready"
	// VirtualMachineInstancePaused is true while the guest's vCPUs are stopped on request.
	VirtualMachineInstancePaused = "Paused"
	// VirtualMachineInstanceIsMigratable says whether the instance can live-migrate, and why not.
	VirtualMachineInstanceIsMigratable = "LiveMigratable"
	// VirtualMachineInstanceSynchronized is false while the instance cannot be brought to its
	// spec: its launcher pod's images cannot be pulled (reasons ErrImagePull and
	// ImagePullBackOff, set by qvirt-controller as KubeVirt's virt-controller does), a Secret its
	// cloud-init or secret volumes need does not exist (SecretNotFound, before it is scheduled), a
	// PersistentVolumeClaim its volumes name does not exist (PVCNotFoundReason, before it has a
	// launcher pod), or the node agent
	// cannot start or reach its launcher (the node agent's reasons). A VirtualMachine shows it
	// while False.
	VirtualMachineInstanceSynchronized = "Synchronized"
	// VirtualMachineInstancePodScheduled mirrors the launcher pod's PodScheduled condition while
	// the scheduler cannot place the pod (reason Unschedulable, its message saying why), as
	// KubeVirt's virt-controller does; a VirtualMachine then shows Unschedulable.
	VirtualMachineInstancePodScheduled = "PodScheduled"
	// VirtualMachineInstanceAgentConnected is present (True) while the guest agent (qemu-ga on
	// the org.qemu.guest_agent.0 channel) answers the launcher, and removed when it stops, as in
	// KubeVirt.
	VirtualMachineInstanceAgentConnected = "AgentConnected"
)

// ReasonUnschedulable is the scheduler's reason of a false PodScheduled condition.
const ReasonUnschedulable = "Unschedulable"

// Reasons of a false Synchronized condition from the launcher pod's images, the kubelet's waiting
// reasons for a container whose image (or image volume) cannot be pulled. A VirtualMachine prints
// them as its status.
const (
	ReasonErrImagePull     = "ErrImagePull"
	ReasonImagePullBackOff = "ImagePullBackOff"
)

// PVCNotFoundReason is the Synchronized condition's reason while a claim of the instance is
// missing: no launcher pod is made until it exists (KubeVirt's reason).
const PVCNotFoundReason = "FailedPvcNotFound"

// BackendStorageReason is the Synchronized condition's reason while the instance's backend-storage
// claim (BackendStorageClaim) exists but cannot hold its state: it is being deleted, another
// object controls it, or it is a block volume. No launcher pod is made until that changes.
const BackendStorageReason = "BackendStorageNotReady"

// VirtualMachineInstanceStatus is the observed state of an instance.
type VirtualMachineInstanceStatus struct {
	// Phase is where the instance is in its life.
	// +optional
	Phase VirtualMachineInstancePhase `json:"phase,omitempty"`

	// PhaseTransitionTimestamps records when each phase was entered.
	// +optional
	// +listType=atomic
	PhaseTransitionTimestamps []VirtualMachineInstancePhaseTransitionTimestamp `json:"phaseTransitionTimestamps,omitempty"`

	// NodeName is the node the instance runs on.
	// +optional
	NodeName string `json:"nodeName,omitempty"`

	// EvacuationNodeName is set to the instance's node when an eviction of its launcher pod (a
	// node drain) asked it to leave that node, as in KubeVirt: for evictionStrategy LiveMigrate and
	// LiveMigrateIfPossible qvirt-controller then migrates it away, for External an outside
	// controller acts on it. A successful migration off that node clears it.
	// +optional
	EvacuationNodeName string `json:"evacuationNodeName,omitempty"`

	// Reason is a short machine-readable reason for the phase, for example GuestShutdown or Killed.
	// +optional
	Reason string `json:"reason,omitempty"`

	// Conditions are Ready, Paused, LiveMigratable and the like.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Interfaces are the guest's network interfaces and their addresses. With the masquerade binding
	// the address is the pod's, since that is where the guest is reached.
	// +optional
	// +listType=atomic
	Interfaces []VirtualMachineInstanceNetworkInterface `json:"interfaces,omitempty"`

	// GuestOSInfo is the guest's operating system as its guest agent reports it; kept when the
	// agent disconnects.
	// +optional
	GuestOSInfo VirtualMachineInstanceGuestOSInfo `json:"guestOSInfo,omitempty"`

	// MigrationState is the state of the current or last live migration.
	// +optional
	MigrationState *VirtualMachineInstanceMigrationState `json:"migrationState,omitempty"`

	// MigrationMethod is how a live migration of the instance moves it, as KubeVirt's:
	// BlockMigration when disks whose contents live on the node only (emptyDisks, containerDisk
	// overlays) are copied before the memory, LiveMigration when only the memory moves.
	// +optional
	MigrationMethod VirtualMachineInstanceMigrationMethod `json:"migrationMethod,omitempty"`

	// LauncherContainerImageVersion is the launcher image the instance runs in.
	// +optional
	LauncherContainerImageVersion string `json:"launcherContainerImageVersion,omitempty"`

	// QEMUVersion is the version of the QEMU running the guest.
	// +optional
	QEMUVersion string `json:"qemuVersion,omitempty"`

	// CurrentCPUTopology is the guest's CPU topology now: more sockets than it started with once
	// vCPUs were hot-plugged (KubeVirt's field).
	// +optional
	CurrentCPUTopology *CPUTopology `json:"currentCPUTopology,omitempty"`

	// Memory is the guest's memory under memory hotplug (memory.maxGuest; KubeVirt's field): what it
	// booted with, what it was asked to have and what it has plugged so far.
	// +optional
	Memory *MemoryStatus `json:"memory,omitempty"`

	// VolumeStatus is the state of each volume.
	// +optional
	// +listType=atomic
	VolumeStatus []VolumeStatus `json:"volumeStatus,omitempty"`

	// ActivePods maps the UIDs of the instance's launcher pods to their nodes.
	// +optional
	ActivePods map[types.UID]string `json:"activePods,omitempty"`

	// KernelBootStatus is the kernelBoot container's image as the launcher pod pulled it. The name
	// is KubeVirt's; imageRef is qvirt's. Only the VMI reconciler writes it.
	// +optional
	KernelBootStatus *KernelBootStatus `json:"kernelBootStatus,omitempty"`

	// ContainerDiskStatus is each containerDisk volume's image as the launcher pod pulled it. It is
	// a list of its own rather than KubeVirt's volumeStatus[].containerDiskVolume because the node
	// agent rewrites volumeStatus whole on every sync: a second writer there would see its entries
	// dropped. Only the VMI reconciler writes it.
	// +optional
	// +listType=map
	// +listMapKey=name
	ContainerDiskStatus []ContainerDiskStatus `json:"containerDiskStatus,omitempty"`
}

// KernelBootStatus is what was pulled for spec.domain.firmware.kernelBoot.container.
type KernelBootStatus struct {
	// ImageRef is the image by digest (repo@sha256:...) as the node reported it for the launcher
	// pod's image volume. A migration target pulls this digest, not the spec's tag, so both sides
	// boot the same bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	ImageRef string `json:"imageRef,omitempty"`
}

// ContainerDiskStatus is what was pulled for one containerDisk volume.
type ContainerDiskStatus struct {
	// Name is the volume's name in spec.volumes.
	Name string `json:"name"`
	// ImageRef is the image by digest, as KernelBootStatus.ImageRef.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	ImageRef string `json:"imageRef,omitempty"`
}

// VirtualMachineInstancePhaseTransitionTimestamp is when a phase was entered.
type VirtualMachineInstancePhaseTransitionTimestamp struct {
	// Phase is the phase entered.
	Phase VirtualMachineInstancePhase `json:"phase,omitempty"`
	// PhaseTransitionTimestamp is when.
	PhaseTransitionTimestamp metav1.Time `json:"phaseTransitionTimestamp,omitempty"`
}

// VirtualMachineInstanceNetworkInterface is a guest interface as observed.
type VirtualMachineInstanceNetworkInterface struct {
	// Name is the interface's name in the spec.
	// +optional
	Name string `json:"name,omitempty"`
	// MAC is the guest MAC address.
	// +optional
	MAC string `json:"mac,omitempty"`
	// IP is the interface's primary address.
	// +optional
	IP string `json:"ipAddress,omitempty"`
	// IPs are all of the interface's addresses.
	// +optional
	// +listType=atomic
	IPs []string `json:"ipAddresses,omitempty"`
	// InterfaceName is the interface's name inside the guest, when known.
	// +optional
	InterfaceName string `json:"interfaceName,omitempty"`
	// Hotplugged is true for an interface the node agent attached while the guest ran (added to
	// spec.domain.devices.interfaces after creation), as volumeStatus[].hotplugged is for disks.
	// Only such interfaces can be removed from the spec; the guest booted with the others.
	// +optional
	Hotplugged bool `json:"hotplugged,omitempty"`
	// RootPort is the pcie-root-port a hot-plugged interface sits on in the guest, set by the node
	// agent; a migration target starts the interface on the same port, since QEMU migrates only
	// between identical device layouts.
	// +optional
	RootPort string `json:"rootPort,omitempty"`
	// InfoSource says where the entry comes from: "domain" (a NIC of the VM), "guest-agent"
	// (an interface only the guest reports), or both, comma-separated ("domain, guest-agent"),
	// as in KubeVirt.
	// +optional
	InfoSource string `json:"infoSource,omitempty"`
}

// Sources of a status.interfaces entry (InfoSource), KubeVirt's names.
const (
	InfoSourceDomain     = "domain"
	InfoSourceGuestAgent = "guest-agent"
)

// VirtualMachineInstanceGuestOSInfo is the guest's operating system as its guest agent reports it
// (guest-get-osinfo: os-release and uname). Every field comes from the guest.
type VirtualMachineInstanceGuestOSInfo struct {
	// Name is os-release's NAME.
	// +optional
	Name string `json:"name,omitempty"`
	// KernelRelease is uname -r.
	// +optional
	KernelRelease string `json:"kernelRelease,omitempty"`
	// Version is os-release's VERSION.
	// +optional
	Version string `json:"version,omitempty"`
	// PrettyName is os-release's PRETTY_NAME.
	// +optional
	PrettyName string `json:"prettyName,omitempty"`
	// VersionID is os-release's VERSION_ID.
	// +optional
	VersionID string `json:"versionId,omitempty"`
	// KernelVersion is uname -v.
	// +optional
	KernelVersion string `json:"kernelVersion,omitempty"`
	// Machine is uname -m.
	// +optional
	Machine string `json:"machine,omitempty"`
	// ID is os-release's ID.
	// +optional
	ID string `json:"id,omitempty"`
}

// VirtualMachineInstanceMigrationState is the state of a live migration as the instance sees it.
type VirtualMachineInstanceMigrationState struct {
	// MigrationUID is the VirtualMachineInstanceMigration driving it.
	// +optional
	MigrationUID types.UID `json:"migrationUid,omitempty"`
	// StartTimestamp is when the source started sending.
	// +optional
	StartTimestamp *metav1.Time `json:"startTimestamp,omitempty"`
	// EndTimestamp is when it finished.
	// +optional
	EndTimestamp *metav1.Time `json:"endTimestamp,omitempty"`
	// SourceNode is the node it leaves.
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// SourcePod is the launcher pod it leaves.
	// +optional
	SourcePod string `json:"sourcePod,omitempty"`
	// TargetNode is the node it moves to.
	// +optional
	TargetNode string `json:"targetNode,omitempty"`
	// TargetPod is the launcher pod it moves to.
	// +optional
	TargetPod string `json:"targetPod,omitempty"`
	// TargetNodeAddress is the address the source sends to.
	// +optional
	TargetNodeAddress string `json:"targetNodeAddress,omitempty"`
	// TargetReady is set by the target node agent once QEMU waits for the incoming migration.
	// +optional
	TargetReady bool `json:"targetReady,omitempty"`
	// SourceHandedOver is set by the source node agent once QEMU has moved the guest's whole state
	// and the target acknowledged loading it. From then on the source holds the guest paused, and
	// only the target node agent decides: the target runs it (completed), or the target cannot and
	// the source takes it back (failed).
	// +optional
	SourceHandedOver bool `json:"sourceHandedOver,omitempty"`
	// HandedOverPaused is set with SourceHandedOver when the guest was not running on the source
	// (paused, or started paused and never run): the target keeps it so.
	// +optional
	HandedOverPaused bool `json:"handedOverPaused,omitempty"`
	// Completed is true once the target runs the guest (set by the target node agent).
	// +optional
	Completed bool `json:"completed,omitempty"`
	// Failed is true when the migration failed; the source keeps running the guest.
	// +optional
	Failed bool `json:"failed,omitempty"`
	// FailureReason says why it failed.
	// +optional
	FailureReason string `json:"failureReason,omitempty"`
	// AbortRequested is true once cancellation was asked for.
	// +optional
	AbortRequested bool `json:"abortRequested,omitempty"`
	// DataTotalBytes is the guest memory to transfer.
	// +optional
	DataTotalBytes *int64 `json:"dataTotalBytes,omitempty"`
	// DataProcessedBytes is what was sent so far.
	// +optional
	DataProcessedBytes *int64 `json:"dataProcessedBytes,omitempty"`
	// DataRemainingBytes is what is left to send.
	// +optional
	DataRemainingBytes *int64 `json:"dataRemainingBytes,omitempty"`
	// DataParallelBytes is what the parallel streams carried (migrationConfiguration's
	// parallelMigrationThreads), counted as pages before compression.
	// +optional
	DataParallelBytes *int64 `json:"dataParallelBytes,omitempty"`
	// Mode is PostCopy once the migration switched to post-copy (its migrationConfiguration's
	// allowPostCopy, at the completion timeout): the guest runs on the target from then on, and
	// the migration can no longer be cancelled; PreCopy before.
	// +optional
	Mode MigrationMode `json:"mode,omitempty"`
	// TargetRecoveryReady is set by the target node agent once the target listens again for a
	// migration in PostCopy mode whose link broke (a node agent restarted, say: the migration
	// stream runs through the agents), and cleared by the source node agent once it sent the
	// source on. Both sides wait a few minutes for that recovery before the guest is lost.
	// +optional
	TargetRecoveryReady bool `json:"targetRecoveryReady,omitempty"`
	// DowntimeMilliseconds is the guest pause at switch-over.
	// +optional
	DowntimeMilliseconds *int64 `json:"downtimeMs,omitempty"`
	// TotalTimeMilliseconds is how long the migration took, as the source QEMU measured it. The
	// timestamps above have whole seconds only (the API's time format), too coarse for a
	// migration that takes a fraction of one.
	// +optional
	TotalTimeMilliseconds *int64 `json:"totalTimeMs,omitempty"`
	// MigrationPolicyName is the MigrationPolicy chosen for this migration, if any matched.
	// +optional
	MigrationPolicyName string `json:"migrationPolicyName,omitempty"`
	// MigrationConfiguration is the settings in force for this migration: the cluster's, with
	// those of MigrationPolicyName over them.
	// +optional
	MigrationConfiguration *MigrationConfiguration `json:"migrationConfiguration,omitempty"`
}

// MigrationMode is how a migration sends the guest's memory, as KubeVirt names it.
// +kubebuilder:validation:Enum=PreCopy;PostCopy
type MigrationMode string

// Migration modes.
const (
	MigrationPreCopy  MigrationMode = "PreCopy"
	MigrationPostCopy MigrationMode = "PostCopy"
)

// VolumePhase is where a volume is in being attached.
type VolumePhase string

// Volume phases.
const (
	VolumePending  VolumePhase = "Pending"
	VolumeReady    VolumePhase = "Ready"
	VolumeDetached VolumePhase = "Detaching"
	VolumeFailed   VolumePhase = "Failed"
)

// VolumeStatus is the state of one volume.
type VolumeStatus struct {
	// Name is the volume's name.
	Name string `json:"name"`
	// Target is the device name in the guest (vda, sda, ...), when known.
	// +optional
	Target string `json:"target,omitempty"`
	// Phase is Pending, Ready, Detaching or Failed.
	// +optional
	Phase VolumePhase `json:"phase,omitempty"`
	// Reason is a short machine-readable reason for the phase.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message explains the phase to a person.
	// +optional
	Message string `json:"message,omitempty"`
	// Hotplugged is true for a volume attached while the guest runs.
	// +optional
	Hotplugged bool `json:"hotplugged,omitempty"`
	// Size is the volume's size, when known.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`
	// BlockSize is what the guest sees of a disk whose block sizes come from its volume
	// (blockSize.matchVolume), as read from the storage where the instance started: a live
	// migration target gives the guest the same. A qvirt field.
	// +optional
	BlockSize *CustomBlockSize `json:"blockSize,omitempty"`
}

// SetPhase moves the instance to phase, recording when. Every writer of the phase uses it (the
// cluster controllers and the node agent), so the transitions read the same whoever wrote them. An
// empty phase or the current one changes nothing.
func (st *VirtualMachineInstanceStatus) SetPhase(phase VirtualMachineInstancePhase, now metav1.Time) {
	if st.Phase == phase || phase == "" {
		return
	}
	st.Phase = phase
	st.PhaseTransitionTimestamps = append(st.PhaseTransitionTimestamps,
		VirtualMachineInstancePhaseTransitionTimestamp{Phase: phase, PhaseTransitionTimestamp: now})
}

// VirtualMachineInstanceMigrationMethod is how an instance migrates.
type VirtualMachineInstanceMigrationMethod string

// Migration methods, as KubeVirt names them.
const (
	BlockMigration VirtualMachineInstanceMigrationMethod = "BlockMigration"
	LiveMigration  VirtualMachineInstanceMigrationMethod = "LiveMigration"
)

// CPUTopology is a guest's sockets, cores per socket and threads per core.
type CPUTopology struct {
	Sockets uint32 `json:"sockets,omitempty"`
	Cores   uint32 `json:"cores,omitempty"`
	Threads uint32 `json:"threads,omitempty"`
}

// MemoryStatus is the guest's memory under memory hotplug, each figure the whole guest memory.
type MemoryStatus struct {
	// GuestAtBoot is the memory the guest booted with.
	// +optional
	GuestAtBoot *resource.Quantity `json:"guestAtBoot,omitempty"`
	// GuestCurrent is the memory the guest has now: at boot plus what its virtio_mem driver plugged.
	// +optional
	GuestCurrent *resource.Quantity `json:"guestCurrent,omitempty"`
	// GuestRequested is the memory the guest was asked to have.
	// +optional
	GuestRequested *resource.Quantity `json:"guestRequested,omitempty"`
}
