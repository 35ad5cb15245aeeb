package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Limits on list sizes keep the CEL rules below within the API server's cost budget; they are far
// above what QEMU can attach to one machine anyway.
const (
	MaxDisks      = 64
	MaxInterfaces = 32
	MaxInputs     = 8
)

// VirtualMachineInstance is one running virtual machine: a QEMU process in a launcher pod. It is usually
// created and owned by a VirtualMachine; its spec cannot change after creation, except for the
// disks and volumes and the interfaces and networks, which can be hot-plugged.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmi;vmis,categories=all;qvirt
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=".status.interfaces[0].ipAddress"
// +kubebuilder:printcolumn:name="NodeName",type=string,JSONPath=".status.nodeName"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=".status.conditions[?(@.type=='Ready')].status"
// +kubebuilder:printcolumn:name="Live-Migratable",type=string,JSONPath=".status.conditions[?(@.type=='LiveMigratable')].status",priority=1
// The node agent's cache holds only its node's instances (and those migrating to it): it lists and
// watches with a field selector on these.
// +kubebuilder:selectablefield:JSONPath=".status.nodeName"
// +kubebuilder:selectablefield:JSONPath=".status.migrationState.targetNode"
type VirtualMachineInstance struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired virtual machine. Only spec.volumes and spec.domain.devices.disks (disk
	// hotplug, as `qvirtctl addvolume` does) and spec.domain.devices.interfaces and spec.networks
	// (NIC hotplug, as KubeVirt's `virtctl addinterface` does) can change once the instance exists;
	// for anything else change the owning VirtualMachine's template and restart. The rules below freeze
	// every other field, one rule per field of spec, spec.domain and spec.domain.devices
	// (HotplugImmutableFields; a test keeps the two lists equal). Optional fields compare presence
	// too: a transition rule placed on an optional field itself would be skipped when the field is
	// absent on either side.
	// Attached interfaces and their networks cannot change (the webhook adds the rest of the NIC
	// hotplug rules, which need the status); the lists are maps keyed by name, of at most 32 items.
	// +kubebuilder:validation:XValidation:rule="!has(oldSelf.domain.devices.interfaces) || !has(self.domain.devices.interfaces) || oldSelf.domain.devices.interfaces.all(o, self.domain.devices.interfaces.all(i, i.name != o.name || i == o))",message="an attached interface cannot change; remove it and add it again",fieldPath=".domain.devices.interfaces"
	// +kubebuilder:validation:XValidation:rule="!has(oldSelf.networks) || !has(self.networks) || oldSelf.networks.all(o, self.networks.all(n, n.name != o.name || n == o))",message="the network of an attached interface cannot change; remove both and add them again",fieldPath=".networks"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.resources) == has(oldSelf.domain.resources) && (!has(self.domain.resources) || self.domain.resources == oldSelf.domain.resources)",message="spec.domain.resources is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.resources"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.cpu) == has(oldSelf.domain.cpu) && (!has(self.domain.cpu) || self.domain.cpu == oldSelf.domain.cpu || has(oldSelf.domain.cpu.maxSockets) && has(self.domain.cpu.maxSockets) && self.domain.cpu.maxSockets == oldSelf.domain.cpu.maxSockets)",message="spec.domain.cpu is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.cpu"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.memory) == has(oldSelf.domain.memory) && (!has(self.domain.memory) || self.domain.memory == oldSelf.domain.memory || has(oldSelf.domain.memory.maxGuest) && has(self.domain.memory.maxGuest) && self.domain.memory.maxGuest == oldSelf.domain.memory.maxGuest)",message="spec.domain.memory is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.memory"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.machine) == has(oldSelf.domain.machine) && (!has(self.domain.machine) || self.domain.machine == oldSelf.domain.machine)",message="spec.domain.machine is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.machine"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.firmware) == has(oldSelf.domain.firmware) && (!has(self.domain.firmware) || self.domain.firmware == oldSelf.domain.firmware)",message="spec.domain.firmware is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.firmware"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.features) == has(oldSelf.domain.features) && (!has(self.domain.features) || self.domain.features == oldSelf.domain.features)",message="spec.domain.features is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.features"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.clock) == has(oldSelf.domain.clock) && (!has(self.domain.clock) || self.domain.clock == oldSelf.domain.clock)",message="spec.domain.clock is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.clock"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.autoattachSerialConsole) == has(oldSelf.domain.devices.autoattachSerialConsole) && (!has(self.domain.devices.autoattachSerialConsole) || self.domain.devices.autoattachSerialConsole == oldSelf.domain.devices.autoattachSerialConsole)",message="spec.domain.devices.autoattachSerialConsole is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.autoattachSerialConsole"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.autoattachGraphicsDevice) == has(oldSelf.domain.devices.autoattachGraphicsDevice) && (!has(self.domain.devices.autoattachGraphicsDevice) || self.domain.devices.autoattachGraphicsDevice == oldSelf.domain.devices.autoattachGraphicsDevice)",message="spec.domain.devices.autoattachGraphicsDevice is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.autoattachGraphicsDevice"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.autoattachPodInterface) == has(oldSelf.domain.devices.autoattachPodInterface) && (!has(self.domain.devices.autoattachPodInterface) || self.domain.devices.autoattachPodInterface == oldSelf.domain.devices.autoattachPodInterface)",message="spec.domain.devices.autoattachPodInterface is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.autoattachPodInterface"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.rng) == has(oldSelf.domain.devices.rng) && (!has(self.domain.devices.rng) || self.domain.devices.rng == oldSelf.domain.devices.rng)",message="spec.domain.devices.rng is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.rng"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.autoattachMemBalloon) == has(oldSelf.domain.devices.autoattachMemBalloon) && (!has(self.domain.devices.autoattachMemBalloon) || self.domain.devices.autoattachMemBalloon == oldSelf.domain.devices.autoattachMemBalloon)",message="spec.domain.devices.autoattachMemBalloon is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.autoattachMemBalloon"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.autoattachInputDevice) == has(oldSelf.domain.devices.autoattachInputDevice) && (!has(self.domain.devices.autoattachInputDevice) || self.domain.devices.autoattachInputDevice == oldSelf.domain.devices.autoattachInputDevice)",message="spec.domain.devices.autoattachInputDevice is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.autoattachInputDevice"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.sound) == has(oldSelf.domain.devices.sound) && (!has(self.domain.devices.sound) || self.domain.devices.sound == oldSelf.domain.devices.sound)",message="spec.domain.devices.sound is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.sound"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.tpm) == has(oldSelf.domain.devices.tpm) && (!has(self.domain.devices.tpm) || self.domain.devices.tpm == oldSelf.domain.devices.tpm)",message="spec.domain.devices.tpm is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.tpm"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.video) == has(oldSelf.domain.devices.video) && (!has(self.domain.devices.video) || self.domain.devices.video == oldSelf.domain.devices.video)",message="spec.domain.devices.video is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.video"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.disableHotplug) == has(oldSelf.domain.devices.disableHotplug) && (!has(self.domain.devices.disableHotplug) || self.domain.devices.disableHotplug == oldSelf.domain.devices.disableHotplug)",message="spec.domain.devices.disableHotplug is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.disableHotplug"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.autoattachVSOCK) == has(oldSelf.domain.devices.autoattachVSOCK) && (!has(self.domain.devices.autoattachVSOCK) || self.domain.devices.autoattachVSOCK == oldSelf.domain.devices.autoattachVSOCK)",message="spec.domain.devices.autoattachVSOCK is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.autoattachVSOCK"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.clientPassthrough) == has(oldSelf.domain.devices.clientPassthrough) && (!has(self.domain.devices.clientPassthrough) || self.domain.devices.clientPassthrough == oldSelf.domain.devices.clientPassthrough)",message="spec.domain.devices.clientPassthrough is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.clientPassthrough"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.gpus) == has(oldSelf.domain.devices.gpus) && (!has(self.domain.devices.gpus) || self.domain.devices.gpus == oldSelf.domain.devices.gpus)",message="spec.domain.devices.gpus is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.gpus"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.hostDevices) == has(oldSelf.domain.devices.hostDevices) && (!has(self.domain.devices.hostDevices) || self.domain.devices.hostDevices == oldSelf.domain.devices.hostDevices)",message="spec.domain.devices.hostDevices is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.hostDevices"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.downwardMetrics) == has(oldSelf.domain.devices.downwardMetrics) && (!has(self.domain.devices.downwardMetrics) || self.domain.devices.downwardMetrics == oldSelf.domain.devices.downwardMetrics)",message="spec.domain.devices.downwardMetrics is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.downwardMetrics"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.useVirtioTransitional) == has(oldSelf.domain.devices.useVirtioTransitional) && (!has(self.domain.devices.useVirtioTransitional) || self.domain.devices.useVirtioTransitional == oldSelf.domain.devices.useVirtioTransitional)",message="spec.domain.devices.useVirtioTransitional is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.useVirtioTransitional"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.inputs) == has(oldSelf.domain.devices.inputs) && (!has(self.domain.devices.inputs) || self.domain.devices.inputs == oldSelf.domain.devices.inputs)",message="spec.domain.devices.inputs is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.inputs"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.watchdog) == has(oldSelf.domain.devices.watchdog) && (!has(self.domain.devices.watchdog) || self.domain.devices.watchdog == oldSelf.domain.devices.watchdog)",message="spec.domain.devices.watchdog is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.watchdog"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.panicDevices) == has(oldSelf.domain.devices.panicDevices) && (!has(self.domain.devices.panicDevices) || self.domain.devices.panicDevices == oldSelf.domain.devices.panicDevices)",message="spec.domain.devices.panicDevices is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.panicDevices"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.blockMultiQueue) == has(oldSelf.domain.devices.blockMultiQueue) && (!has(self.domain.devices.blockMultiQueue) || self.domain.devices.blockMultiQueue == oldSelf.domain.devices.blockMultiQueue)",message="spec.domain.devices.blockMultiQueue is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.blockMultiQueue"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.networkInterfaceMultiqueue) == has(oldSelf.domain.devices.networkInterfaceMultiqueue) && (!has(self.domain.devices.networkInterfaceMultiqueue) || self.domain.devices.networkInterfaceMultiqueue == oldSelf.domain.devices.networkInterfaceMultiqueue)",message="spec.domain.devices.networkInterfaceMultiqueue is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.networkInterfaceMultiqueue"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.devices.filesystems) == has(oldSelf.domain.devices.filesystems) && (!has(self.domain.devices.filesystems) || self.domain.devices.filesystems == oldSelf.domain.devices.filesystems)",message="spec.domain.devices.filesystems is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.devices.filesystems"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.ioThreadsPolicy) == has(oldSelf.domain.ioThreadsPolicy) && (!has(self.domain.ioThreadsPolicy) || self.domain.ioThreadsPolicy == oldSelf.domain.ioThreadsPolicy)",message="spec.domain.ioThreadsPolicy is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.ioThreadsPolicy"
	// +kubebuilder:validation:XValidation:rule="has(self.domain.ioThreads) == has(oldSelf.domain.ioThreads) && (!has(self.domain.ioThreads) || self.domain.ioThreads == oldSelf.domain.ioThreads)",message="spec.domain.ioThreads is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".domain.ioThreads"
	// +kubebuilder:validation:XValidation:rule="has(self.nodeSelector) == has(oldSelf.nodeSelector) && (!has(self.nodeSelector) || self.nodeSelector == oldSelf.nodeSelector)",message="spec.nodeSelector is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".nodeSelector"
	// +kubebuilder:validation:XValidation:rule="has(self.affinity) == has(oldSelf.affinity) && (!has(self.affinity) || self.affinity == oldSelf.affinity)",message="spec.affinity is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".affinity"
	// +kubebuilder:validation:XValidation:rule="has(self.tolerations) == has(oldSelf.tolerations) && (!has(self.tolerations) || self.tolerations == oldSelf.tolerations)",message="spec.tolerations is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".tolerations"
	// +kubebuilder:validation:XValidation:rule="has(self.priorityClassName) == has(oldSelf.priorityClassName) && (!has(self.priorityClassName) || self.priorityClassName == oldSelf.priorityClassName)",message="spec.priorityClassName is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".priorityClassName"
	// +kubebuilder:validation:XValidation:rule="has(self.schedulerName) == has(oldSelf.schedulerName) && (!has(self.schedulerName) || self.schedulerName == oldSelf.schedulerName)",message="spec.schedulerName is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".schedulerName"
	// +kubebuilder:validation:XValidation:rule="has(self.evictionStrategy) == has(oldSelf.evictionStrategy) && (!has(self.evictionStrategy) || self.evictionStrategy == oldSelf.evictionStrategy)",message="spec.evictionStrategy is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".evictionStrategy"
	// +kubebuilder:validation:XValidation:rule="has(self.startStrategy) == has(oldSelf.startStrategy) && (!has(self.startStrategy) || self.startStrategy == oldSelf.startStrategy)",message="spec.startStrategy is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".startStrategy"
	// +kubebuilder:validation:XValidation:rule="has(self.terminationGracePeriodSeconds) == has(oldSelf.terminationGracePeriodSeconds) && (!has(self.terminationGracePeriodSeconds) || self.terminationGracePeriodSeconds == oldSelf.terminationGracePeriodSeconds)",message="spec.terminationGracePeriodSeconds is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".terminationGracePeriodSeconds"
	// +kubebuilder:validation:XValidation:rule="has(self.hostname) == has(oldSelf.hostname) && (!has(self.hostname) || self.hostname == oldSelf.hostname)",message="spec.hostname is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".hostname"
	// Every volume is attached by a disk or shared by a filesystem: admission gives a disk to a
	// volume without either, so only an instance's spec, not a VirtualMachine's template, carries
	// this rule.
	// +kubebuilder:validation:XValidation:rule="!has(self.volumes) || self.volumes.all(v, (has(self.domain.devices.disks) && self.domain.devices.disks.exists(d, d.name == v.name)) || (has(self.domain.devices.filesystems) && self.domain.devices.filesystems.exists(f, f.name == v.name)))",message="every volume must be attached by a disk of the same name in domain.devices.disks, or shared by a filesystem of the same name in domain.devices.filesystems",fieldPath=".volumes"
	// +kubebuilder:validation:XValidation:rule="has(self.subdomain) == has(oldSelf.subdomain) && (!has(self.subdomain) || self.subdomain == oldSelf.subdomain)",message="spec.subdomain is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".subdomain"
	// +kubebuilder:validation:XValidation:rule="has(self.readinessProbe) == has(oldSelf.readinessProbe) && (!has(self.readinessProbe) || self.readinessProbe == oldSelf.readinessProbe)",message="spec.readinessProbe is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".readinessProbe"
	// +kubebuilder:validation:XValidation:rule="has(self.livenessProbe) == has(oldSelf.livenessProbe) && (!has(self.livenessProbe) || self.livenessProbe == oldSelf.livenessProbe)",message="spec.livenessProbe is immutable; only volumes, disks, interfaces and networks can be hot-plugged",fieldPath=".livenessProbe"
	Spec VirtualMachineInstanceSpec `json:"spec"`

	// Status is what the controller and the node agent observe.
	// +optional
	Status VirtualMachineInstanceStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceList is a list of VirtualMachineInstances.
//
// +kubebuilder:object:root=true
type VirtualMachineInstanceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstance `json:"items"`
}

// VirtualMachineInstanceSpec describes the machine (domain), its storage (volumes), its networks and
// where it may be scheduled.
//
// +kubebuilder:validation:XValidation:rule="!has(self.domain.devices.disks) || self.domain.devices.disks.all(d, has(self.volumes) && self.volumes.exists(v, v.name == d.name))",message="every disk in domain.devices.disks must name a volume in volumes",fieldPath=".domain.devices.disks"
// +kubebuilder:validation:XValidation:rule="!has(self.domain.devices.interfaces) || self.domain.devices.interfaces.all(i, has(self.networks) && self.networks.exists(n, n.name == i.name))",message="every interface in domain.devices.interfaces must name a network in networks",fieldPath=".domain.devices.interfaces"
// +kubebuilder:validation:XValidation:rule="!has(self.networks) || self.networks.all(n, has(self.domain.devices.interfaces) && self.domain.devices.interfaces.exists(i, i.name == n.name))",message="every network needs exactly one interface of the same name in domain.devices.interfaces",fieldPath=".networks"
type VirtualMachineInstanceSpec struct {
	// Domain is the virtual hardware: CPU, memory, firmware, machine type and devices.
	Domain DomainSpec `json:"domain"`

	// NodeSelector must match a node's labels for the instance to be scheduled there.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// Affinity holds the launcher pod's scheduling constraints, as for a pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// Tolerations let the launcher pod schedule onto nodes with matching taints.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// PriorityClassName is the launcher pod's priority class.
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// SchedulerName is the scheduler that places the launcher pod; the default scheduler when empty.
	// +optional
	SchedulerName string `json:"schedulerName,omitempty"`

	// EvictionStrategy says what happens when the node is drained: None (the instance stops),
	// LiveMigrate (migrate, and block the eviction if the instance cannot migrate),
	// LiveMigrateIfPossible (migrate when possible, otherwise stop) or External (an outside
	// controller handles it).
	// +optional
	EvictionStrategy *EvictionStrategy `json:"evictionStrategy,omitempty"`

	// StartStrategy Paused starts the guest with its vCPUs stopped (QEMU's prelaunch state); it
	// runs once unpaused. `qvirtctl start --paused` sets it on the instance it creates.
	// +optional
	StartStrategy *StartStrategy `json:"startStrategy,omitempty"`

	// TerminationGracePeriodSeconds is how long a graceful shutdown (ACPI power button) may take
	// before QEMU is told to quit. Defaults to 180 seconds, as in KubeVirt.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`

	// Volumes are the storage sources the disks attach. Every volume is attached by the disk of the
	// same name; a volume without one gets a hard disk (virtio) when the instance is created, as in
	// KubeVirt.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Volumes []Volume `json:"volumes,omitempty"`

	// Hostname is the guest's hostname; defaults to the instance name.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Hostname string `json:"hostname,omitempty"`

	// Subdomain makes the guest reachable as <hostname>.<subdomain>.<namespace>.svc when a headless
	// Service of that name selects it.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Subdomain string `json:"subdomain,omitempty"`

	// Networks are the networks the guest's interfaces connect to. Every network is used by the
	// interface of the same name.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Networks []Network `json:"networks,omitempty"`

	// ReadinessProbe tells when the guest can take traffic: while it fails, the instance and its
	// launcher pod are not Ready, so Services leave the VM out of their endpoints.
	// +optional
	ReadinessProbe *Probe `json:"readinessProbe,omitempty"`

	// LivenessProbe tells whether the guest still works: once it fails, the instance is stopped,
	// and the VirtualMachine's runStrategy decides whether it starts again.
	// +optional
	LivenessProbe *Probe `json:"livenessProbe,omitempty"`
}

// StartStrategy says how the guest starts.
// +kubebuilder:validation:Enum=Paused
type StartStrategy string

// StartStrategyPaused starts the guest paused, as KubeVirt's startStrategy Paused does.
const StartStrategyPaused StartStrategy = "Paused"

// EvictionStrategy says what happens to an instance when its node is drained.
// +kubebuilder:validation:Enum=None;LiveMigrate;LiveMigrateIfPossible;External
type EvictionStrategy string

// Eviction strategies, as in KubeVirt.
const (
	EvictionStrategyNone                  EvictionStrategy = "None"
	EvictionStrategyLiveMigrate           EvictionStrategy = "LiveMigrate"
	EvictionStrategyLiveMigrateIfPossible EvictionStrategy = "LiveMigrateIfPossible"
	EvictionStrategyExternal              EvictionStrategy = "External"
)

// DomainSpec is the virtual hardware of the machine.
// +kubebuilder:validation:XValidation:rule="!has(self.firmware) || !has(self.firmware.bootloader) || !has(self.firmware.bootloader.efi) || (has(self.firmware.bootloader.efi.secureBoot) && !self.firmware.bootloader.efi.secureBoot) || (has(self.features) && has(self.features.smm) && (!has(self.features.smm.enabled) || self.features.smm.enabled))",message="EFI secure boot (firmware.bootloader.efi.secureBoot, true unless set to false) needs SMM: set features.smm: {} or secureBoot: false",fieldPath=".features.smm"
type DomainSpec struct {
	// Resources are the launcher pod's compute requests and limits. When memory.guest is not set,
	// the guest gets requests.memory.
	// +optional
	Resources ResourceRequirements `json:"resources,omitempty"`

	// CPU is the guest's CPU model and topology. When it sets no sockets, cores or threads, the
	// instance gets 1 core and 1 thread per socket and a socket per CPU of resources.limits.cpu,
	// else of resources.requests.cpu (rounded up), else 1 socket, as in KubeVirt.
	// +optional
	CPU *CPU `json:"cpu,omitempty"`

	// Memory is the guest's memory.
	// +optional
	Memory *Memory `json:"memory,omitempty"`

	// Machine is the emulated machine type.
	// +optional
	Machine *Machine `json:"machine,omitempty"`

	// Firmware holds the bootloader (BIOS or EFI), the SMBIOS UUID and serial and an optional
	// direct kernel boot.
	// +optional
	Firmware *Firmware `json:"firmware,omitempty"`

	// Clock is the guest's real-time clock (UTC, an offset from it or a time zone) and its timers.
	// +optional
	Clock *Clock `json:"clock,omitempty"`

	// Features are optional platform features such as ACPI, SMM and the Hyper-V enlightenments.
	// +optional
	Features *Features `json:"features,omitempty"`

	// Devices are the disks, network interfaces and consoles of the guest.
	Devices Devices `json:"devices"`

	// IOThreadsPolicy gives the virtio disks I/O threads of their own, off QEMU's main loop:
	// shared (one thread for all of them) or auto (a pool of up to twice the vCPUs, the disks
	// spread over it). A disk with dedicatedIOThread gets a thread to itself under either. None
	// when unset.
	// supplementalPool is not supported by this version of qvirt (refused): it spreads each
	// disk's queues over a pool of threads, which QEMU 7.2 cannot do (its virtio-blk takes one
	// iothread; iothread-vq-mapping came in QEMU 9.0).
	// +optional
	IOThreadsPolicy *IOThreadsPolicy `json:"ioThreadsPolicy,omitempty"`

	// IOThreads sizes the supplementalPool policy's pool; not supported by this version of qvirt
	// (refused), as that policy.
	// +optional
	IOThreads *DiskIOThreads `json:"ioThreads,omitempty"`
}

// DiskIOThreads is the supplemental I/O thread pool (KubeVirt's DiskIOThreads).
type DiskIOThreads struct {
	// SupplementalPoolThreadCount is the pool's size.
	// +optional
	SupplementalPoolThreadCount *uint32 `json:"supplementalPoolThreadCount,omitempty"`
}

// IOThreadsPolicy is how disks share I/O threads.
// +kubebuilder:validation:Enum=shared;auto;supplementalPool
type IOThreadsPolicy string

// I/O thread policies.
const (
	IOThreadsPolicyShared           IOThreadsPolicy = "shared"
	IOThreadsPolicyAuto             IOThreadsPolicy = "auto"
	IOThreadsPolicySupplementalPool IOThreadsPolicy = "supplementalPool"
)

// ResourceRequirements are the compute resources of the launcher pod.
type ResourceRequirements struct {
	// Requests is the minimum of each resource the instance needs, as in a pod. requests.memory is
	// the guest memory when memory.guest is unset.
	// +optional
	Requests corev1.ResourceList `json:"requests,omitempty"`

	// Limits is the maximum of each resource, as in a pod.
	// +optional
	Limits corev1.ResourceList `json:"limits,omitempty"`

	// OvercommitGuestOverhead leaves the launcher's memory overhead out of the pod's memory request
	// (the limit keeps it), trading a safety margin for density.
	// +optional
	OvercommitGuestOverhead bool `json:"overcommitGuestOverhead,omitempty"`
}

// CPU is the guest CPU model and topology; vCPUs = sockets * cores * threads.
type CPU struct {
	// Cores is the number of cores per socket. Defaults to 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	Cores uint32 `json:"cores,omitempty"`

	// Sockets is the number of sockets. Defaults to 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	Sockets uint32 `json:"sockets,omitempty"`

	// Threads is the number of threads per core. Defaults to 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	Threads uint32 `json:"threads,omitempty"`

	// Model is the CPU model: host-passthrough (the default with KVM), host-model, or a QEMU model
	// name such as Haswell-noTSX or qemu64 (the default under emulation).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9_.]*$`
	Model string `json:"model,omitempty"`

	// Features turn CPU features (CPUID flags, QEMU's names such as vmx, svm, pcid, sse4.2) on or
	// off beyond the model's.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Features []CPUFeature `json:"features,omitempty"`

	// DedicatedCPUPlacement pins each vCPU to a host CPU of its own (KubeVirt's
	// dedicatedCpuPlacement): the launcher pod is Guaranteed, with as many whole CPUs as the guest
	// has vCPUs, scheduled to a node whose kubelet runs the static CPU manager (label
	// cpumanager=true), and the launcher pins each vCPU thread to one of the CPUs the CPU manager
	// gave its container.
	// +optional
	DedicatedCPUPlacement bool `json:"dedicatedCpuPlacement,omitempty"`

	// IsolateEmulatorThread asks for one more whole CPU, to which QEMU's other threads (its main
	// loop, I/O threads, workers) are pinned, away from the vCPUs. Needs dedicatedCpuPlacement.
	// +optional
	IsolateEmulatorThread bool `json:"isolateEmulatorThread,omitempty"`

	// NUMA is KubeVirt's guest NUMA topology: with guestMappingPassthrough the guest gets the NUMA
	// layout of the host CPUs its vCPUs are pinned to. Needs dedicatedCpuPlacement and huge pages.
	// +optional
	NUMA *NUMA `json:"numa,omitempty"`

	// Realtime runs vCPU threads real-time (SCHED_FIFO, priority 1) and turns the guest's PMU off,
	// as KubeVirt's. Needs dedicatedCpuPlacement and numa.guestMappingPassthrough.
	// +optional
	Realtime *Realtime `json:"realtime,omitempty"`

	// MaxSockets is the most sockets CPU hotplug may reach: the guest starts with sockets and a
	// running instance's sockets may be raised up to this (KubeVirt's CPU hotplug); unset, no
	// hotplug.
	// +optional
	MaxSockets uint32 `json:"maxSockets,omitempty"`
}

// NUMA is KubeVirt's guest NUMA topology.
type NUMA struct {
	// GuestMappingPassthrough gives each host NUMA node of the vCPUs' dedicated CPUs a guest NUMA
	// node with those vCPUs and its share of the memory.
	// +optional
	GuestMappingPassthrough *NUMAGuestMappingPassthrough `json:"guestMappingPassthrough,omitempty"`
}

// NUMAGuestMappingPassthrough has no settings: its presence asks for the mapping.
type NUMAGuestMappingPassthrough struct{}

// Realtime is KubeVirt's real-time tuning of the vCPUs.
type Realtime struct {
	// Mask is which vCPUs run real-time, in libvirt's syntax: indexes and ranges separated by
	// commas, ^N leaving vCPU N out ("0-3,^1"). Empty, all of them.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Mask string `json:"mask,omitempty"`
}

// CPUFeaturePolicy is how a CPU feature is given to the guest (KubeVirt's and libvirt's policies).
// +kubebuilder:validation:Enum=force;require;optional;disable;forbid
type CPUFeaturePolicy string

// CPU feature policies.
const (
	// CPUFeatureForce claims the feature whatever the host offers (QEMU drops what the
	// accelerator cannot give, with a warning in the launcher's log).
	CPUFeatureForce CPUFeaturePolicy = "force"
	// CPUFeatureRequire gives the feature and fails the start when the host cannot (the default).
	CPUFeatureRequire CPUFeaturePolicy = "require"
	// CPUFeatureOptional gives the feature when the host can.
	CPUFeatureOptional CPUFeaturePolicy = "optional"
	// CPUFeatureDisable hides the feature.
	CPUFeatureDisable CPUFeaturePolicy = "disable"
	// CPUFeatureForbid hides the feature and fails the start when the host has it.
	CPUFeatureForbid CPUFeaturePolicy = "forbid"
)

// CPUFeature is one CPU feature and its policy (KubeVirt's CPUFeature).
type CPUFeature struct {
	// Name is the feature's name as QEMU spells it (its -cpu help lists them).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[a-z0-9][-a-z0-9_.]*$`
	Name string `json:"name"`
	// Policy is force, require (the default), optional, disable or forbid.
	// +optional
	Policy CPUFeaturePolicy `json:"policy,omitempty"`
}

// Memory is the guest memory.
type Memory struct {
	// Guest is the memory the guest sees, for example 512Mi. Defaults to resources.requests.memory,
	// else resources.limits.memory.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="memory.guest must be a positive quantity"
	Guest *resource.Quantity `json:"guest,omitempty"`

	// Hugepages backs the guest's RAM with huge pages of the node (KubeVirt's memory.hugepages):
	// the launcher pod asks for the guest memory as hugepages-<pageSize> and QEMU takes it from the
	// kernel's huge page pool. The node must have such pages reserved.
	// +optional
	Hugepages *Hugepages `json:"hugepages,omitempty"`

	// MaxGuest is the most memory hotplug may reach (KubeVirt's memory hotplug): the guest boots
	// with guest and QEMU holds a virtio-mem device of the room up to maxGuest; raising guest on
	// the running instance (up to maxGuest, never down) plugs memory, which the guest's
	// virtio_mem driver takes. A whole number of 2Mi blocks, with guest at least 1Gi.
	// +optional
	MaxGuest *resource.Quantity `json:"maxGuest,omitempty"`
}

// Hugepages is the size of the huge pages that back the guest's RAM.
type Hugepages struct {
	// PageSize is 2Mi or 1Gi, the x86 huge page sizes. The guest memory must be a multiple of it.
	// +kubebuilder:validation:Enum="2Mi";"1Gi"
	PageSize string `json:"pageSize"`
}

// PageBytes is the huge page size in bytes, 0 when PageSize is none of the x86 sizes.
func (h *Hugepages) PageBytes() int64 {
	switch h.PageSize {
	case "2Mi":
		return 2 << 20
	case "1Gi":
		return 1 << 30
	}
	return 0
}

// Machine is the emulated machine type.
type Machine struct {
	// Type is the QEMU machine type, q35 by default. pc-q35-* versions pin a machine ABI.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(q35|pc-q35-[0-9.]+)$`
	Type string `json:"type,omitempty"`
}

// Firmware holds the bootloader, SMBIOS identity and direct kernel boot.
type Firmware struct {
	// UUID is the SMBIOS system UUID the guest reads. Defaults to one derived from the
	// VirtualMachine, stable across restarts.
	// +optional
	UUID types.UID `json:"uuid,omitempty"`

	// Bootloader is the guest's firmware: BIOS (SeaBIOS, the default) or EFI (OVMF).
	// +optional
	Bootloader *Bootloader `json:"bootloader,omitempty"`

	// Serial is the SMBIOS system serial number.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.+-]+$`
	Serial string `json:"serial,omitempty"`

	// KernelBoot boots a kernel and initrd directly instead of a disk's bootloader.
	// +optional
	KernelBoot *KernelBoot `json:"kernelBoot,omitempty"`
}

// Bootloader selects the guest's firmware; at most one of bios and efi is set.
// +kubebuilder:validation:XValidation:rule="!(has(self.bios) && has(self.efi))",message="bios and efi are mutually exclusive: set at most one"
type Bootloader struct {
	// BIOS boots the disks through a legacy BIOS (SeaBIOS); the default.
	// +optional
	BIOS *BIOS `json:"bios,omitempty"`

	// EFI boots through UEFI (OVMF) instead of BIOS, with variables (NVRAM) of the instance's
	// own that last as long as the instance.
	// +optional
	EFI *EFI `json:"efi,omitempty"`
}

// BIOS is the legacy BIOS firmware (SeaBIOS).
type BIOS struct {
	// UseSerial shows the BIOS's own output (boot messages, boot menu) on the serial console too.
	// +optional
	UseSerial *bool `json:"useSerial,omitempty"`
}

// EFI is the UEFI firmware (OVMF).
type EFI struct {
	// SecureBoot runs OVMF's Secure Boot build with Microsoft's keys enrolled: it boots only
	// signed bootloaders (a distribution's shim). Requires features.smm. Defaults to true, as in
	// KubeVirt.
	// +optional
	SecureBoot *bool `json:"secureBoot,omitempty"`

	// Persistent keeps the EFI variables across restarts of the VirtualMachine, on its
	// backend-storage claim persistent-state-for-<name> (KubeVirt's backend storage); such an
	// instance does not live-migrate. Defaults to false: the variables live as long as the instance.
	// +optional
	Persistent *bool `json:"persistent,omitempty"`
}

// KernelBoot boots the guest from a kernel and initrd taken from a container image.
// +kubebuilder:validation:XValidation:rule="has(self.container) || !has(self.kernelArgs)",message="kernelArgs needs a container with the kernel"
type KernelBoot struct {
	// KernelArgs is the kernel command line.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	KernelArgs string `json:"kernelArgs,omitempty"`

	// Container is the image holding the kernel and initrd.
	// +optional
	Container *KernelBootContainer `json:"container,omitempty"`
}

// KernelBootContainer is a container image holding a kernel and an initrd.
// +kubebuilder:validation:XValidation:rule="has(self.kernelPath) || has(self.initrdPath)",message="at least one of kernelPath and initrdPath must be set"
type KernelBootContainer struct {
	// Image is the container image that holds the kernel and initrd.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`

	// ImagePullSecret is the name of a Secret used to pull the image.
	// +optional
	ImagePullSecret string `json:"imagePullSecret,omitempty"`

	// ImagePullPolicy is when to pull the image: Always, Never or IfNotPresent.
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// KernelPath is the absolute path of the kernel inside the image.
	// +optional
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	KernelPath string `json:"kernelPath,omitempty"`

	// InitrdPath is the absolute path of the initrd inside the image.
	// +optional
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	InitrdPath string `json:"initrdPath,omitempty"`
}

// Features are optional platform features.
type Features struct {
	// ACPI gives the guest an ACPI table and power button; on by default. Without it a graceful
	// shutdown cannot reach the guest.
	// +optional
	ACPI *FeatureState `json:"acpi,omitempty"`

	// SMM turns on System Management Mode, which EFI Secure Boot needs to protect its variables.
	// Off when absent; on when present unless enabled is false.
	// +optional
	SMM *FeatureState `json:"smm,omitempty"`

	// APIC is the guest's local APIC, which its CPUs always have; endOfInterrupt adds KVM's
	// paravirtual end-of-interrupt. enabled: false has no effect (as under KubeVirt), with a
	// warning.
	// +optional
	APIC *FeatureAPIC `json:"apic,omitempty"`

	// HypervPassthrough gives the guest every Hyper-V enlightenment the node's KVM offers (QEMU's
	// hv-passthrough). It excludes hyperv, and the instance cannot be live-migrated: another
	// node's KVM may offer others. Needs KVM: dropped under emulation, with an event saying so.
	// +optional
	HypervPassthrough *HyperVPassthrough `json:"hypervPassthrough,omitempty"`

	// Hyperv are the Hyper-V enlightenments (paravirtual interfaces Windows uses), each QEMU's
	// hv-* CPU flag. A feature another needs (synic for synictimer, vpindex for synic, tlbflush
	// and ipi, vapic for evmcs) is turned on when unset and refused when disabled, as in
	// KubeVirt. Needs KVM: dropped under emulation, with an event saying so.
	// +optional
	Hyperv *FeatureHyperv `json:"hyperv,omitempty"`

	// KVM says how the guest sees KVM; hidden hides its CPUID signature (QEMU's kvm=off).
	// +optional
	KVM *FeatureKVM `json:"kvm,omitempty"`

	// Pvspinlock tells the guest the host has paravirtual spinlocks (KVM's PV_UNHALT, QEMU's
	// kvm-pv-unhalt); enabled: false turns them off for old guest kernels.
	// +optional
	Pvspinlock *FeatureState `json:"pvspinlock,omitempty"`
}

// FeatureAPIC is the local APIC feature, as KubeVirt's.
type FeatureAPIC struct {
	// Enabled defaults to true; false is accepted with a warning and has no effect, as under
	// KubeVirt (libvirt has no way to turn it off): the guest's CPUs always have a local APIC.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// EndOfInterrupt turns on KVM's paravirtual end-of-interrupt (the kvm-pv-eoi CPU feature),
	// which saves the guest an exit per interrupt under KVM. Defaults to false.
	// +optional
	EndOfInterrupt bool `json:"endOfInterrupt,omitempty"`
}

// FeatureState turns a feature on or off.
type FeatureState struct {
	// Enabled turns the feature on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// Devices are the guest's disks, network interfaces and consoles.
// +kubebuilder:validation:XValidation:rule="!has(self.disks) || self.disks.filter(d, has(d.bootOrder)).all(d, self.disks.filter(e, has(e.bootOrder) && e.bootOrder == d.bootOrder).size() == 1)",message="bootOrder values must be unique across disks",fieldPath=".disks"
type Devices struct {
	// Disks are the guest's block devices; each attaches the volume of the same name.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Disks []Disk `json:"disks,omitempty"`

	// Interfaces are the guest's network cards; each connects to the network of the same name.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	Interfaces []Interface `json:"interfaces,omitempty"`

	// AutoattachSerialConsole gives the guest a serial console (ttyS0) reachable with
	// `qvirtctl console`. Defaults to true.
	// +optional
	AutoattachSerialConsole *bool `json:"autoattachSerialConsole,omitempty"`

	// AutoattachGraphicsDevice gives the guest a VGA device and VNC display reachable with
	// `qvirtctl vnc`. Defaults to true.
	// +optional
	AutoattachGraphicsDevice *bool `json:"autoattachGraphicsDevice,omitempty"`

	// AutoattachPodInterface gives an instance created with no interfaces and no networks an
	// interface named default with the masquerade binding on the pod network, as KubeVirt does.
	// Defaults to true; false leaves such an instance without a network.
	// +optional
	AutoattachPodInterface *bool `json:"autoattachPodInterface,omitempty"`

	// AutoattachMemBalloon gives the guest a virtio memory balloon that reports the pages it frees
	// back to the host (free page reporting), as KubeVirt's. Defaults to true; recorded when the
	// instance is created.
	// +optional
	AutoattachMemBalloon *bool `json:"autoattachMemBalloon,omitempty"`

	// AutoattachInputDevice gives an instance created with no inputs a USB tablet named
	// default-0, as KubeVirt's. Defaults to false.
	// +optional
	AutoattachInputDevice *bool `json:"autoattachInputDevice,omitempty"`

	// Rng gives the guest a virtio entropy device (virtio-rng) fed from the host's /dev/urandom.
	// +optional
	Rng *Rng `json:"rng,omitempty"`

	// UseVirtioTransitional gives the guest transitional virtio devices (virtio 0.9 and 1.0), as
	// conventional PCI devices, so that guests older than virtio 1.0 (RHEL 6, for one) find their
	// disks, interfaces, SCSI controller, serial channel, entropy device and balloon. Input devices
	// and virtio-fs exist in virtio 1.0 only; hot-plugged devices are virtio 1.0 too.
	// +optional
	UseVirtioTransitional *bool `json:"useVirtioTransitional,omitempty"`

	// DownwardMetrics gives the guest a virtio-serial port, org.github.vhostmd.1, on which it reads
	// metrics of its node and of itself in vhostmd's XML (vm-dump-metrics, or "GET /metrics/XML"
	// written to the port). The cluster must enable it (enableDownwardMetrics in qvirt-config), as
	// KubeVirt's DownwardMetrics feature gate: it shows the guest its node's load.
	// +optional
	DownwardMetrics *DownwardMetrics `json:"downwardMetrics,omitempty"`

	// AutoattachVSOCK gives the guest a virtio VSOCK device; not supported by this version of qvirt
	// (refused when true): the node's kernel keeps one CID space for every guest and process on
	// the node, so any process there could reach the guest.
	// +optional
	AutoattachVSOCK *bool `json:"autoattachVSOCK,omitempty"`

	// ClientPassthrough lets a client redirect up to four of its USB devices into the guest at
	// once (qvirtctl usbredir, as virtctl usbredir): the guest gets an xHCI controller with four
	// usb-redir slots.
	// +optional
	ClientPassthrough *ClientPassthroughDevices `json:"clientPassthrough,omitempty"`

	// GPUs pass host GPUs through to the guest; not supported by this version of qvirt (refused).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	GPUs []GPU `json:"gpus,omitempty"`

	// HostDevices pass host PCI or mediated devices through to the guest; not supported by this
	// version of qvirt (refused).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	HostDevices []HostDevice `json:"hostDevices,omitempty"`

	// DisableHotplug leaves the instance without spare PCIe ports, so nothing can be hot-plugged
	// into it (disks, volumes, interfaces and networks are then as fixed as the rest of the spec).
	// +optional
	DisableHotplug bool `json:"disableHotplug,omitempty"`

	// Video is the graphics device's model; vga when unset. It needs autoattachGraphicsDevice.
	// +optional
	Video *VideoDevice `json:"video,omitempty"`

	// TPM gives the guest a TPM 2.0, emulated by swtpm in the launcher pod. Its state lasts as long
	// as the instance's QEMU (KubeVirt's non-persistent vTPM).
	// +optional
	TPM *TPMDevice `json:"tpm,omitempty"`

	// Sound gives the guest a sound card (an Intel HD Audio controller with a codec, or an AC97),
	// whose output goes nowhere: the node has no audio for it.
	// +optional
	Sound *SoundDevice `json:"sound,omitempty"`

	// Inputs are the guest's input devices: tablets (absolute pointers, so the VNC pointer and the
	// guest's agree) on USB or virtio.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Inputs []Input `json:"inputs,omitempty"`

	// Watchdog is a hardware watchdog the guest must keep feeding; when it stops, the action is
	// taken.
	// +optional
	Watchdog *Watchdog `json:"watchdog,omitempty"`

	// PanicDevices let the guest kernel report its panic to the host: the instance then stops and
	// fails with reason GuestPanicked, as KubeVirt's (libvirt's on_crash destroy), rather than
	// rebooting or hanging.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=3
	PanicDevices []PanicDevice `json:"panicDevices,omitempty"`

	// BlockMultiQueue gives each virtio disk one request queue per vCPU, so the guest's CPUs
	// submit I/O without contending for one queue.
	// +optional
	BlockMultiQueue *bool `json:"blockMultiQueue,omitempty"`

	// NetworkInterfaceMultiQueue gives each virtio interface one queue pair per vCPU (at most
	// MaxNICQueues), on a multi-queue tap, so the guest's CPUs send and receive in parallel. Other
	// interface models stay single-queue, as in KubeVirt.
	// +optional
	NetworkInterfaceMultiQueue *bool `json:"networkInterfaceMultiqueue,omitempty"`

	// Filesystems share a volume's directory with the guest as a filesystem the guest mounts by the
	// volume's name (virtiofs), rather than as a disk. The volume is a persistentVolumeClaim,
	// configMap, secret, serviceAccount or downwardAPI volume, as in KubeVirt.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Filesystems []Filesystem `json:"filesystems,omitempty"`
}

// Filesystem shares the volume of the same name with the guest (KubeVirt's Filesystem).
type Filesystem struct {
	// Name is the volume's name and the tag the guest mounts (mount -t virtiofs NAME /mnt).
	Name string `json:"name"`
	// Virtiofs shares it with virtio-fs, served by the launcher's own virtiofsd.
	Virtiofs *FilesystemVirtiofs `json:"virtiofs"`
}

// FilesystemVirtiofs is virtio-fs (no settings, as KubeVirt's).
type FilesystemVirtiofs struct{}

// Rng is a virtio random number generator, as KubeVirt's (no settings).
type Rng struct{}

// VideoType is a graphics device model.
// +kubebuilder:validation:Enum=vga;virtio;bochs;cirrus;ramfb
type VideoType string

// Video models, as KubeVirt's.
const (
	VideoVGA    VideoType = "vga"
	VideoVirtio VideoType = "virtio"
	VideoBochs  VideoType = "bochs"
	VideoCirrus VideoType = "cirrus"
	VideoRamfb  VideoType = "ramfb"
)

// ClientPassthroughDevices is USB redirection from a client (no settings, as KubeVirt's).
type ClientPassthroughDevices struct{}

// GPU is a host GPU passed through to the guest (KubeVirt's GPU).
type GPU struct {
	Name string `json:"name"`
	// DeviceName is the device plugin's resource name, e.g. nvidia.com/TU104GL_Tesla_T4.
	DeviceName string `json:"deviceName"`
	// VirtualGPUOptions are a mediated GPU's display options.
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	VirtualGPUOptions *runtime.RawExtension `json:"virtualGPUOptions,omitempty"`
	// Tag is the device's role tag for the guest.
	// +optional
	Tag string `json:"tag,omitempty"`
}

// HostDevice is a host PCI or mediated device passed through to the guest (KubeVirt's
// HostDevice).
type HostDevice struct {
	Name string `json:"name"`
	// DeviceName is the device plugin's resource name, e.g. intel.com/qat.
	DeviceName string `json:"deviceName"`
	// Tag is the device's role tag for the guest.
	// +optional
	Tag string `json:"tag,omitempty"`
}

// DownwardMetrics is the downward metrics port (no settings, as KubeVirt's).
type DownwardMetrics struct{}

// PanicDeviceModel is how the guest reports a panic.
// +kubebuilder:validation:Enum=hyperv;isa;pvpanic
type PanicDeviceModel string

// Panic device models, as KubeVirt's.
const (
	// PanicHyperv is Hyper-V's crash MSRs (hv-crash), which Windows uses; it needs KVM.
	PanicHyperv PanicDeviceModel = "hyperv"
	// PanicIsa is QEMU's pvpanic ISA device (I/O port 0x505, ACPI QEMU0001).
	PanicIsa PanicDeviceModel = "isa"
	// PanicPvpanic is QEMU's pvpanic PCI device (1b36:0011).
	PanicPvpanic PanicDeviceModel = "pvpanic"
)

// PanicDevice is a device through which the guest reports a kernel panic (KubeVirt's
// PanicDevice).
type PanicDevice struct {
	// Model is hyperv, isa or pvpanic; isa when unset (recorded when the instance is created).
	// +optional
	Model *PanicDeviceModel `json:"model,omitempty"`
}

// VideoDevice is the graphics device's model (KubeVirt's VideoDevice).
type VideoDevice struct {
	// Type is vga (the default), virtio, bochs, cirrus or ramfb.
	// +optional
	Type VideoType `json:"type,omitempty"`
}

// TPMDevice is a virtual TPM 2.0 (KubeVirt's TPMDevice).
type TPMDevice struct {
	// Enabled false leaves the TPM out, even one a preference asks for. Defaults to true.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Persistent keeps the TPM's state across restarts of the VM, on its backend-storage claim
	// persistent-state-for-<name> (KubeVirt's backend storage); such an instance does not
	// live-migrate.
	// +optional
	Persistent *bool `json:"persistent,omitempty"`
}

// TPMEnabled says whether dev gives the guest a TPM: present, and enabled unless set to false.
func TPMEnabled(dev *Devices) bool {
	return dev.TPM != nil && (dev.TPM.Enabled == nil || *dev.TPM.Enabled)
}

// SoundModel is a sound card model.
// +kubebuilder:validation:Enum=ich9;ac97
type SoundModel string

// Sound card models, as KubeVirt's.
const (
	SoundModelICH9 SoundModel = "ich9"
	SoundModelAC97 SoundModel = "ac97"
)

// SoundDevice is a named sound card (KubeVirt's SoundDevice).
type SoundDevice struct {
	// Name is the sound card's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Model is ich9 (the default: Intel HD Audio) or ac97.
	// +optional
	Model SoundModel `json:"model,omitempty"`
}

// InputBus is the bus an input device is attached to.
// +kubebuilder:validation:Enum=usb;virtio
type InputBus string

// Input buses.
const (
	InputBusUSB    InputBus = "usb"
	InputBusVirtio InputBus = "virtio"
)

// InputType is the kind of input device.
// +kubebuilder:validation:Enum=tablet
type InputType string

// InputTypeTablet is an absolute pointing device, the one type KubeVirt accepts.
const InputTypeTablet InputType = "tablet"

// Input is an input device.
type Input struct {
	// Name is the device's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Bus is usb (the default; a USB tablet on an xHCI controller) or virtio.
	// +optional
	Bus InputBus `json:"bus,omitempty"`

	// Type is tablet (the default and only type).
	// +optional
	Type InputType `json:"type,omitempty"`
}

// Watchdog is a named hardware watchdog, as KubeVirt's: an Intel 6300ESB.
type Watchdog struct {
	// Name is the watchdog's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// I6300ESB is the Intel 6300ESB watchdog, the default (and only) model.
	// +optional
	I6300ESB *I6300ESBWatchdog `json:"i6300esb,omitempty"`
}

// WatchdogAction is what happens when the watchdog expires.
// +kubebuilder:validation:Enum=poweroff;reset;shutdown
type WatchdogAction string

// Watchdog actions, as KubeVirt's.
const (
	// WatchdogActionPoweroff stops the guest at once, as pulling the plug.
	WatchdogActionPoweroff WatchdogAction = "poweroff"
	// WatchdogActionReset resets the guest, as the reset button.
	WatchdogActionReset WatchdogAction = "reset"
	// WatchdogActionShutdown presses the guest's ACPI power button.
	WatchdogActionShutdown WatchdogAction = "shutdown"
)

// I6300ESBWatchdog is the Intel 6300ESB watchdog.
type I6300ESBWatchdog struct {
	// Action is poweroff, reset (the default) or shutdown.
	// +optional
	Action WatchdogAction `json:"action,omitempty"`
}

// Disk attaches the volume of the same name to the guest as a disk, a CD-ROM or a LUN.
// +kubebuilder:validation:XValidation:rule="!(has(self.disk) && has(self.cdrom)) && !(has(self.lun) && (has(self.disk) || has(self.cdrom)))",message="a disk is one of disk, cdrom or lun"
type Disk struct {
	// Name is the disk's name; it must match a volume's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Disk attaches the volume as a hard disk (the default when neither disk nor cdrom is set).
	// +optional
	Disk *DiskTarget `json:"disk,omitempty"`

	// CDRom attaches the volume as a read-only CD-ROM.
	// +optional
	CDRom *CDRomTarget `json:"cdrom,omitempty"`

	// LUN passes a block-mode claim's SCSI device through to the guest (QEMU's scsi-block), so
	// that the guest sends it SCSI commands itself. The claim's device must take SCSI commands
	// (SG_IO): an iSCSI or Fibre Channel LUN, not a loop or virtio disk.
	// +optional
	LUN *LunTarget `json:"lun,omitempty"`

	// BootOrder is the disk's place in the boot order, from 1; disks without one are not tried.
	// +optional
	// +kubebuilder:validation:Minimum=1
	BootOrder *uint32 `json:"bootOrder,omitempty"`

	// Serial is the serial number the guest sees, for example in /dev/disk/by-id.
	// +optional
	// +kubebuilder:validation:MaxLength=20
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.+-]+$`
	Serial string `json:"serial,omitempty"`

	// Cache is the host page cache mode: none (the default; required for live migration),
	// writethrough or writeback.
	// +optional
	Cache DriverCache `json:"cache,omitempty"`

	// IO is the I/O mode: native (needs cache none) or threads.
	// +optional
	IO DriverIO `json:"io,omitempty"`

	// Shareable lets other guests open the same image at the same time (a cluster filesystem's
	// shared disk): QEMU takes no write lock on it. Needs cache none, so that no host page cache
	// hides the other writers.
	// +optional
	Shareable *bool `json:"shareable,omitempty"`

	// DedicatedIOThread gives this virtio disk an I/O thread to itself (see ioThreadsPolicy).
	// +optional
	DedicatedIOThread *bool `json:"dedicatedIOThread,omitempty"`

	// BlockSize is the block sizes the guest sees on this hard disk, rather than QEMU's 512 bytes.
	// +optional
	BlockSize *BlockSize `json:"blockSize,omitempty"`
}

// BlockSize is a disk's block sizes as the guest sees them (KubeVirt's BlockSize).
type BlockSize struct {
	// Custom gives the sizes.
	// +optional
	Custom *CustomBlockSize `json:"custom,omitempty"`
	// MatchVolume takes the sizes of the volume's storage, as KubeVirt reads them where the
	// instance starts (a block device's logical and physical sector sizes and discard
	// granularity; a file's filesystem block size for all three). They are recorded in
	// status.volumeStatus[].blockSize, and a live migration target gives the guest the same.
	// +optional
	MatchVolume *FeatureState `json:"matchVolume,omitempty"`
}

// CustomBlockSize is a disk's block sizes in bytes: powers of two from 512 to 2 MiB, the logical
// size at most the physical one (QEMU's limits).
type CustomBlockSize struct {
	Logical  uint32 `json:"logical"`
	Physical uint32 `json:"physical"`
	// DiscardGranularity is the unit the guest discards in: a multiple of the logical size; QEMU's
	// default (the logical size) when unset.
	// +optional
	DiscardGranularity *uint32 `json:"discardGranularity,omitempty"`
}

// DiskBus is the bus a disk is attached to.
// +kubebuilder:validation:Enum=virtio;sata;scsi
type DiskBus string

// Disk buses.
const (
	DiskBusVirtio DiskBus = "virtio"
	DiskBusSATA   DiskBus = "sata"
	DiskBusSCSI   DiskBus = "scsi"
)

// DriverCache is a disk's host cache mode.
// +kubebuilder:validation:Enum=none;writethrough;writeback
type DriverCache string

// Cache modes.
const (
	CacheNone         DriverCache = "none"
	CacheWriteThrough DriverCache = "writethrough"
	CacheWriteBack    DriverCache = "writeback"
)

// DriverIO is a disk's I/O mode.
// +kubebuilder:validation:Enum=native;threads
type DriverIO string

// I/O modes.
const (
	IONative  DriverIO = "native"
	IOThreads DriverIO = "threads"
)

// DiskTarget attaches a volume as a hard disk.
type DiskTarget struct {
	// Bus is virtio (the default), sata or scsi.
	// +optional
	Bus DiskBus `json:"bus,omitempty"`

	// ReadOnly exposes the disk read-only.
	// +optional
	ReadOnly bool `json:"readonly,omitempty"`
}

// CDRomTarget attaches a volume as a CD-ROM.
type CDRomTarget struct {
	// Bus is sata (the default) or scsi; a CD-ROM cannot sit on virtio.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self != 'virtio'",message="a cdrom cannot use the virtio bus; use sata or scsi"
	Bus DiskBus `json:"bus,omitempty"`

	// ReadOnly defaults to true. The guest cannot write to a CD-ROM: qvirt attaches it read-only
	// even when readonly is false (accepted and kept as written, as KubeVirt does).
	// +optional
	ReadOnly *bool `json:"readonly,omitempty"`
}

// LunTarget attaches a volume as a passed-through SCSI LUN.
type LunTarget struct {
	// Bus is scsi, the default and the only bus a SCSI device can be passed through on.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == 'scsi'",message="a lun is passed through on the scsi bus; virtio and sata cannot carry SCSI commands"
	Bus DiskBus `json:"bus,omitempty"`

	// ReadOnly attaches the LUN read-only.
	// +optional
	ReadOnly bool `json:"readonly,omitempty"`

	// Reservation lets the guest take SCSI persistent reservations on the LUN; not supported by
	// this version of qvirt, which runs no qemu-pr-helper (refused).
	// +optional
	Reservation bool `json:"reservation,omitempty"`
}

// Interface is one guest network card, connected to the network of the same name.
// +kubebuilder:validation:XValidation:rule="[has(self.masquerade), has(self.bridge), has(self.binding)].filter(b, b).size() <= 1",message="an interface has one binding: masquerade, bridge or binding, not two"
type Interface struct {
	// Name is the interface's name; it must match a network's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Model is the emulated card: virtio (the default), e1000, e1000e or rtl8139.
	// +optional
	// +kubebuilder:validation:Enum=virtio;e1000;e1000e;rtl8139
	Model string `json:"model,omitempty"`

	// Masquerade connects the guest through NAT behind the pod's address (the default binding);
	// inbound connections to the pod on ports are forwarded to the guest. Live-migratable.
	// +optional
	Masquerade *InterfaceMasquerade `json:"masquerade,omitempty"`

	// Bridge hands the pod's address to the guest through a bridge and DHCP. Not live-migratable.
	// +optional
	Bridge *InterfaceBridge `json:"bridge,omitempty"`

	// Binding names a network binding plugin, as KubeVirt's interfaces[].binding does: "passt"
	// (the only one; qvirt runs it built in, with no plugin to register) connects the guest to
	// the pod network through a passt process of the launcher's, user-mode: the guest gets the
	// pod's address by DHCP and passt forwards the pod's ports (ports, all when empty) to it.
	// Pod network only; not live-migratable.
	// +optional
	Binding *PluginBinding `json:"binding,omitempty"`

	// Ports limit which inbound ports are forwarded to the guest with masquerade or passt; all
	// when empty.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Ports []Port `json:"ports,omitempty"`

	// MacAddress is the guest MAC, for example 02:00:00:00:00:01. Defaults to one derived from the
	// instance, stable across restarts and migrations.
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$`
	MacAddress string `json:"macAddress,omitempty"`
}

// InterfaceMasquerade selects the masquerade (NAT) binding.
type InterfaceMasquerade struct{}

// InterfaceBridge selects the bridge binding.
type InterfaceBridge struct{}

// PluginBinding is KubeVirt's network binding plugin reference.
type PluginBinding struct {
	// Name is the binding's: passt or slirp.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
}

// PasstBinding is the binding plugin name of the passt binding, KubeVirt's.
const PasstBinding = "passt"

// IsPasst says whether the interface uses the passt binding.
func (in *Interface) IsPasst() bool { return in.Binding != nil && in.Binding.Name == PasstBinding }

// SlirpBinding is the binding plugin name of KubeVirt's slirp binding: QEMU's own user-mode
// network stack (libslirp) in the pod.
const SlirpBinding = "slirp"

// IsSlirp says whether the interface uses the slirp binding.
func (in *Interface) IsSlirp() bool { return in.Binding != nil && in.Binding.Name == SlirpBinding }

// IsUserMode says whether the interface reaches the pod's network through a user-mode network
// stack (passt or slirp) rather than a tap: an unprivileged process in the pod then binds its
// forwarded ports and opens its connections.
func (in *Interface) IsUserMode() bool { return in.IsPasst() || in.IsSlirp() }

// IsMasquerade says whether the interface uses the masquerade binding: named, or by default
// (an interface that names none is defaulted to it on the pod network).
func (in *Interface) IsMasquerade() bool { return in.Bridge == nil && in.Binding == nil }

// Port is an inbound port forwarded to the guest.
type Port struct {
	// Name is an optional name for the port.
	// +optional
	// +kubebuilder:validation:MaxLength=15
	Name string `json:"name,omitempty"`

	// Protocol is TCP (the default) or UDP.
	// +optional
	// +kubebuilder:validation:Enum=TCP;UDP
	Protocol string `json:"protocol,omitempty"`

	// Port is the port number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port"`
}

// Network is a network the guest connects to: the pod network or a Multus network.
// +kubebuilder:validation:XValidation:rule="has(self.pod) != has(self.multus)",message="a network sets exactly one of pod and multus"
type Network struct {
	// Name is the network's name; an interface of the same name connects to it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// Pod is the pod network, the network of the launcher pod.
	// +optional
	Pod *PodNetwork `json:"pod,omitempty"`

	// Multus is a secondary network attached through Multus.
	// +optional
	Multus *MultusNetwork `json:"multus,omitempty"`
}

// PodNetwork is the pod network.
type PodNetwork struct {
	// VMNetworkCIDR is the guest-side subnet of the masquerade binding, 10.0.2.0/24 by default.
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$`
	VMNetworkCIDR string `json:"vmNetworkCIDR,omitempty"`
}

// MultusNetwork is a Multus NetworkAttachmentDefinition.
type MultusNetwork struct {
	// NetworkName is the NetworkAttachmentDefinition, as <name> or <namespace>/<name>.
	// +kubebuilder:validation:MinLength=1
	NetworkName string `json:"networkName"`

	// Default makes this network the pod's default network instead of the cluster's.
	// +optional
	Default bool `json:"default,omitempty"`
}

// Volume is a storage source attached by the disk of the same name. Exactly one source is set.
// +kubebuilder:validation:XValidation:rule="[has(self.containerDisk), has(self.cloudInitNoCloud), has(self.cloudInitConfigDrive), has(self.emptyDisk), has(self.hostDisk), has(self.persistentVolumeClaim), has(self.ephemeral), has(self.dataVolume), has(self.secret), has(self.configMap), has(self.serviceAccount), has(self.downwardAPI)].filter(x, x).size() == 1",message="a volume sets exactly one source: containerDisk, cloudInitNoCloud, cloudInitConfigDrive, emptyDisk, hostDisk, persistentVolumeClaim, ephemeral, dataVolume, secret, configMap, serviceAccount or downwardAPI"
type Volume struct {
	// Name is the volume's name; a disk of the same name attaches it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	VolumeSource `json:",inline"`
}

// VolumeSource is where a volume's data comes from.
type VolumeSource struct {
	// ContainerDisk is a disk image inside a container image, copied on write and discarded when
	// the instance stops.
	// +optional
	ContainerDisk *ContainerDiskSource `json:"containerDisk,omitempty"`

	// CloudInitNoCloud is a NoCloud cloud-init data source: a small ISO 9660 image labelled cidata
	// holding user-data, meta-data and network-config.
	// +optional
	CloudInitNoCloud *CloudInitNoCloudSource `json:"cloudInitNoCloud,omitempty"`

	// CloudInitConfigDrive is an OpenStack config drive cloud-init data source: a small ISO 9660
	// image labelled config-2 holding openstack/latest/{meta_data.json,user_data,network_data.json}.
	// +optional
	CloudInitConfigDrive *CloudInitConfigDriveSource `json:"cloudInitConfigDrive,omitempty"`

	// EmptyDisk is a blank sparse disk that lives as long as the instance.
	// +optional
	EmptyDisk *EmptyDiskSource `json:"emptyDisk,omitempty"`

	// HostDisk is a disk image file on the node. Only paths under the cluster's allowed host paths
	// are accepted; an instance with a host disk cannot live-migrate.
	// +optional
	HostDisk *HostDisk `json:"hostDisk,omitempty"`

	// PersistentVolumeClaim attaches a claim's volume as the disk.
	// +optional
	PersistentVolumeClaim *PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim,omitempty"`

	// Ephemeral attaches a claim read-only with a copy-on-write overlay discarded at stop.
	// +optional
	Ephemeral *EphemeralVolumeSource `json:"ephemeral,omitempty"`

	// DataVolume attaches the claim of a CDI DataVolume, which CDI names as the DataVolume: it is
	// handled as a persistentVolumeClaim volume of that claim. A VirtualMachine creates its
	// instance only once the DataVolume has succeeded.
	// +optional
	DataVolume *DataVolumeSource `json:"dataVolume,omitempty"`

	// Secret attaches a Secret's keys as files on a small read-only ISO 9660 disk (KubeVirt's
	// config volumes): the launcher pod mounts the Secret and the launcher writes the image at start.
	// +optional
	Secret *SecretVolumeSource `json:"secret,omitempty"`

	// ConfigMap attaches a ConfigMap's keys as files on a read-only ISO 9660 disk, as Secret.
	// +optional
	ConfigMap *ConfigMapVolumeSource `json:"configMap,omitempty"`

	// ServiceAccount attaches a service account's token, the cluster's CA certificate and the
	// namespace (the files a pod finds in /var/run/secrets/kubernetes.io/serviceaccount) on a
	// read-only ISO 9660 disk labelled cfgdata. An instance has at most one.
	// +optional
	ServiceAccount *ServiceAccountVolumeSource `json:"serviceAccount,omitempty"`

	// DownwardAPI attaches the launcher pod's fields (labels, annotations, ...) as files on a
	// read-only ISO 9660 disk.
	// +optional
	DownwardAPI *DownwardAPIVolumeSource `json:"downwardAPI,omitempty"`
}

// ConfigVolumeDefaultLabel is the ISO 9660 volume label of a config volume without a volumeLabel,
// KubeVirt's.
const ConfigVolumeDefaultLabel = "cfgdata"

// ConfigVolumeMaxLabel is the longest volume label: ISO 9660's volume identifier field.
const ConfigVolumeMaxLabel = 32

// SecretVolumeSource is a Secret attached as a disk, as KubeVirt's.
type SecretVolumeSource struct {
	// SecretName is the Secret's name, in the instance's namespace.
	// +optional
	SecretName string `json:"secretName,omitempty"`

	// Optional lets the instance start without the Secret (an empty disk); otherwise its launcher
	// pod waits for it.
	// +optional
	Optional *bool `json:"optional,omitempty"`

	// VolumeLabel is the disk's ISO 9660 volume label; cfgdata when empty.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	VolumeLabel string `json:"volumeLabel,omitempty"`
}

// ConfigMapVolumeSource is a ConfigMap attached as a disk, as KubeVirt's.
type ConfigMapVolumeSource struct {
	// Name is the ConfigMap's name, in the instance's namespace.
	corev1.LocalObjectReference `json:",inline"`

	// Optional lets the instance start without the ConfigMap (an empty disk); otherwise its
	// launcher pod waits for it.
	// +optional
	Optional *bool `json:"optional,omitempty"`

	// VolumeLabel is the disk's ISO 9660 volume label; cfgdata when empty.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	VolumeLabel string `json:"volumeLabel,omitempty"`
}

// ServiceAccountVolumeSource is a service account's credentials attached as a disk, as KubeVirt's.
type ServiceAccountVolumeSource struct {
	// ServiceAccountName is the service account; the launcher pod runs as it.
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
}

// DownwardAPIVolumeSource is the launcher pod's downward API attached as a disk, as KubeVirt's.
type DownwardAPIVolumeSource struct {
	// Fields are the files, as a pod's downwardAPI volume items.
	// +optional
	// +listType=atomic
	Fields []corev1.DownwardAPIVolumeFile `json:"fields,omitempty"`

	// VolumeLabel is the disk's ISO 9660 volume label; cfgdata when empty.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	VolumeLabel string `json:"volumeLabel,omitempty"`
}

// ConfigVolume is the label (VolumeLabel, else ConfigVolumeDefaultLabel) and the field name of a
// config volume (secret, configMap, serviceAccount or downwardAPI); ok is false for other sources.
func (s *VolumeSource) ConfigVolume() (label, field string, ok bool) {
	var l string
	switch {
	case s.Secret != nil:
		l, field = s.Secret.VolumeLabel, "secret"
	case s.ConfigMap != nil:
		l, field = s.ConfigMap.VolumeLabel, "configMap"
	case s.ServiceAccount != nil:
		field = "serviceAccount"
	case s.DownwardAPI != nil:
		l, field = s.DownwardAPI.VolumeLabel, "downwardAPI"
	default:
		return "", "", false
	}
	if l == "" {
		l = ConfigVolumeDefaultLabel
	}
	return l, field, true
}

// DataVolumeSource names a CDI DataVolume, as KubeVirt's.
type DataVolumeSource struct {
	// Name is the DataVolume's name.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`

	// Hotpluggable marks the volume as one that can be hot-plugged.
	// +optional
	Hotpluggable bool `json:"hotpluggable,omitempty"`
}

// ContainerDiskSource is a disk image in a container image.
type ContainerDiskSource struct {
	// Image is the container image holding the disk image.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`

	// ImagePullSecret is the name of a Secret used to pull the image.
	// +optional
	ImagePullSecret string `json:"imagePullSecret,omitempty"`

	// Path is the disk image's path inside the image; the single file under /disk when empty.
	// +optional
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	Path string `json:"path,omitempty"`

	// ImagePullPolicy is when to pull the image: Always, Never or IfNotPresent.
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
}

// CloudInitMaxUserData and CloudInitMaxNetworkData are KubeVirt's limits on inline (or base64,
// decoded) cloud-init user and network data, in bytes: the data travels in the object to every
// watcher, so larger data belongs in a Secret (secretRef, networkDataSecretRef).
const (
	CloudInitMaxUserData    = 2048
	CloudInitMaxNetworkData = 2048
)

// CloudInitNoCloudSource is NoCloud user and network data, inline or from a Secret. At most one
// source of user data and one of network data; at least one of the two.
// +kubebuilder:validation:XValidation:rule="[has(self.userData), has(self.userDataBase64), has(self.secretRef)].filter(x, x).size() <= 1",message="set at most one of userData, userDataBase64 and secretRef"
// +kubebuilder:validation:XValidation:rule="[has(self.networkData), has(self.networkDataBase64), has(self.networkDataSecretRef)].filter(x, x).size() <= 1",message="set at most one of networkData, networkDataBase64 and networkDataSecretRef"
type CloudInitNoCloudSource struct {
	// UserDataSecretRef names a Secret whose userdata (or userData) key holds the user data.
	// +optional
	UserDataSecretRef *corev1.LocalObjectReference `json:"secretRef,omitempty"`

	// UserDataBase64 is cloud-init user data, base64-encoded; at most 2048 bytes decoded.
	// +optional
	// +kubebuilder:validation:MaxLength=2732
	UserDataBase64 string `json:"userDataBase64,omitempty"`

	// UserData is cloud-init user data; at most 2048 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	UserData string `json:"userData,omitempty"`

	// NetworkDataSecretRef names a Secret whose networkdata (or networkData) key holds the
	// network configuration.
	// +optional
	NetworkDataSecretRef *corev1.LocalObjectReference `json:"networkDataSecretRef,omitempty"`

	// NetworkDataBase64 is cloud-init network configuration, base64-encoded; at most 2048 bytes
	// decoded.
	// +optional
	// +kubebuilder:validation:MaxLength=2732
	NetworkDataBase64 string `json:"networkDataBase64,omitempty"`

	// NetworkData is cloud-init network configuration; at most 2048 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	NetworkData string `json:"networkData,omitempty"`
}

// CloudInitConfigDriveSource is config drive user and network data, inline or from a Secret, with
// the same rules as CloudInitNoCloudSource.
// +kubebuilder:validation:XValidation:rule="[has(self.userData), has(self.userDataBase64), has(self.secretRef)].filter(x, x).size() <= 1",message="set at most one of userData, userDataBase64 and secretRef"
// +kubebuilder:validation:XValidation:rule="[has(self.networkData), has(self.networkDataBase64), has(self.networkDataSecretRef)].filter(x, x).size() <= 1",message="set at most one of networkData, networkDataBase64 and networkDataSecretRef"
type CloudInitConfigDriveSource struct {
	// UserDataSecretRef names a Secret whose userdata (or userData) key holds the user data.
	// +optional
	UserDataSecretRef *corev1.LocalObjectReference `json:"secretRef,omitempty"`

	// UserDataBase64 is cloud-init user data, base64-encoded; at most 2048 bytes decoded.
	// +optional
	// +kubebuilder:validation:MaxLength=2732
	UserDataBase64 string `json:"userDataBase64,omitempty"`

	// UserData is cloud-init user data; at most 2048 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	UserData string `json:"userData,omitempty"`

	// NetworkDataSecretRef names a Secret whose networkdata (or networkData) key holds the
	// network configuration.
	// +optional
	NetworkDataSecretRef *corev1.LocalObjectReference `json:"networkDataSecretRef,omitempty"`

	// NetworkDataBase64 is cloud-init network configuration, base64-encoded; at most 2048 bytes
	// decoded.
	// +optional
	// +kubebuilder:validation:MaxLength=2732
	NetworkDataBase64 string `json:"networkDataBase64,omitempty"`

	// NetworkData is cloud-init network configuration; at most 2048 bytes.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	NetworkData string `json:"networkData,omitempty"`
}

// CloudInitSource is what both cloud-init data sources hold, whichever the volume uses.
type CloudInitSource struct {
	UserDataSecretRef, NetworkDataSecretRef *corev1.LocalObjectReference
	UserData, UserDataBase64                string
	NetworkData, NetworkDataBase64          string
}

// CloudInit is the volume's cloud-init data and the field it sits in (cloudInitNoCloud or
// cloudInitConfigDrive); ok is false for any other volume.
func (s *VolumeSource) CloudInit() (src CloudInitSource, field string, ok bool) {
	if c := s.CloudInitNoCloud; c != nil {
		return CloudInitSource{c.UserDataSecretRef, c.NetworkDataSecretRef, c.UserData, c.UserDataBase64, c.NetworkData, c.NetworkDataBase64}, "cloudInitNoCloud", true
	}
	if c := s.CloudInitConfigDrive; c != nil {
		return CloudInitSource{c.UserDataSecretRef, c.NetworkDataSecretRef, c.UserData, c.UserDataBase64, c.NetworkData, c.NetworkDataBase64}, "cloudInitConfigDrive", true
	}
	return CloudInitSource{}, "", false
}

// EmptyDiskSource is a blank disk.
type EmptyDiskSource struct {
	// Capacity is the disk's size, for example 2Gi.
	// (Positive is checked by the validating webhook: a CEL quantity rule on every volume of a
	// 64-volume list exceeds the API server's cost budget.)
	Capacity resource.Quantity `json:"capacity"`
}

// HostDiskType says whether a host disk must exist.
// +kubebuilder:validation:Enum=Disk;DiskOrCreate
type HostDiskType string

// Host disk types.
const (
	HostDiskExists         HostDiskType = "Disk"
	HostDiskExistsOrCreate HostDiskType = "DiskOrCreate"
)

// HostDisk is a raw disk image file on the node.
// +kubebuilder:validation:XValidation:rule="self.type != 'DiskOrCreate' || has(self.capacity)",message="capacity is required when type is DiskOrCreate",fieldPath=".capacity"
type HostDisk struct {
	// Path is the absolute path of the image file on the node.
	// +kubebuilder:validation:Pattern=`^/[^\x00]*$`
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:XValidation:rule="!self.contains('/../') && !self.endsWith('/..')",message="path must not contain '..' segments"
	Path string `json:"path"`

	// Type is Disk (the file must exist) or DiskOrCreate (create a sparse raw file of capacity).
	Type HostDiskType `json:"type"`

	// Capacity is the size of a file created for DiskOrCreate.
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`

	// Shared marks the file as shared storage reachable from every node, which allows migration.
	// +optional
	Shared *bool `json:"shared,omitempty"`
}

// PersistentVolumeClaimVolumeSource references a PersistentVolumeClaim in the instance's namespace.
type PersistentVolumeClaimVolumeSource struct {
	// ClaimName is the claim's name.
	// +kubebuilder:validation:MinLength=1
	ClaimName string `json:"claimName"`

	// ReadOnly attaches the claim read-only.
	// +optional
	ReadOnly bool `json:"readOnly,omitempty"`
}

// EphemeralVolumeSource is a claim attached read-only under a discarded overlay.
type EphemeralVolumeSource struct {
	// PersistentVolumeClaim is the claim that backs the overlay.
	PersistentVolumeClaim *PersistentVolumeClaimVolumeSource `json:"persistentVolumeClaim"`
}
