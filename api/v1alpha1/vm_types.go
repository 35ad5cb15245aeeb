package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// VirtualMachine declares a virtual machine that qvirt keeps in the state its runStrategy asks for,
// creating and deleting VirtualMachineInstances from its template.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vm;vms,categories=all;qvirt
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=".status.printableStatus"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=".status.conditions[?(@.type=='Ready')].status"
type VirtualMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired machine and whether it should run.
	Spec VirtualMachineSpec `json:"spec"`

	// Status is what the controller observes.
	// +optional
	Status VirtualMachineStatus `json:"status,omitempty"`
}

// VirtualMachineList is a list of VirtualMachines.
//
// +kubebuilder:object:root=true
type VirtualMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachine `json:"items"`
}

// VirtualMachineSpec is the desired machine and its run strategy.
// +kubebuilder:validation:XValidation:rule="!(has(self.running) && has(self.runStrategy))",message="set either running (deprecated) or runStrategy, not both"
type VirtualMachineSpec struct {
	// RunStrategy says when an instance should exist: Always (keep one running, restart it whatever
	// ends it), RerunOnFailure (restart it after a failure but not after a guest shutdown), Once (run
	// it once), Manual (only start/stop requests change it) or Halted (no instance). Halted when
	// neither runStrategy nor running is set.
	// +optional
	RunStrategy *RunStrategy `json:"runStrategy,omitempty"`

	// Running is the deprecated KubeVirt switch: true is runStrategy Always, false is Halted.
	// +optional
	Running *bool `json:"running,omitempty"`

	// Template is the instance the VirtualMachine creates.
	Template VirtualMachineInstanceTemplateSpec `json:"template"`

	// DataVolumeTemplates are CDI DataVolumes (cdi.kubevirt.io/v1beta1) the VM controller creates
	// before the VM's first instance, each named as its metadata.name, in the VM's namespace and
	// controlled by the VM; the instance is created once every one has succeeded, and a
	// dataVolume volume uses the DataVolume's claim (CDI names it as the DataVolume). Needs CDI
	// installed in the cluster: without it the VM's Failure condition says so.
	// +optional
	DataVolumeTemplates []DataVolumeTemplateSpec `json:"dataVolumeTemplates,omitempty"`

	// Instancetype names the instancetype whose vCPUs, memory and scheduling settings the
	// instances get; the template must not set those itself.
	// +optional
	Instancetype *InstancetypeMatcher `json:"instancetype,omitempty"`

	// Preference names the preference whose settings fill what the template leaves unset.
	// +optional
	Preference *PreferenceMatcher `json:"preference,omitempty"`
}

// InstancetypeMatcher refers to an instancetype, as KubeVirt's (kubevirt.io/v1 InstancetypeMatcher).
// +kubebuilder:validation:XValidation:rule="has(self.name) != has(self.inferFromVolume)",message="set exactly one of name and inferFromVolume"
type InstancetypeMatcher struct {
	// Name is the instancetype's name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// Kind is VirtualMachineClusterInstancetype (the default) or VirtualMachineInstancetype (in
	// the VM's namespace); KubeVirt's lower-case and plural spellings are accepted too.
	// +optional
	// +kubebuilder:validation:Enum=VirtualMachineInstancetype;VirtualMachineClusterInstancetype;virtualmachineinstancetype;virtualmachineinstancetypes;virtualmachineclusterinstancetype;virtualmachineclusterinstancetypes
	Kind string `json:"kind,omitempty"`

	// RevisionName names the ControllerRevision that holds the copy of the instancetype this VM
	// uses. The controller records the copy it takes at first use in
	// status.instancetypeRef.controllerRevisionRef; a name given here is used instead (KubeVirt's
	// older place for it).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	RevisionName string `json:"revisionName,omitempty"`

	// InferFromVolume names a volume of the template whose PersistentVolumeClaim carries the
	// instancetype.kubevirt.io/default-instancetype (and -kind) labels; the VM takes that
	// instancetype. Admission resolves it and records name and kind in its place.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	InferFromVolume string `json:"inferFromVolume,omitempty"`

	// InferFromVolumeFailurePolicy is Reject (the default: a volume that names no instancetype
	// refuses the VM) or Ignore (the VM then has no instancetype).
	// +optional
	InferFromVolumeFailurePolicy *InferFromVolumeFailurePolicy `json:"inferFromVolumeFailurePolicy,omitempty"`
}

// PreferenceMatcher refers to a preference, as KubeVirt's (kubevirt.io/v1 PreferenceMatcher).
// +kubebuilder:validation:XValidation:rule="has(self.name) != has(self.inferFromVolume)",message="set exactly one of name and inferFromVolume"
type PreferenceMatcher struct {
	// Name is the preference's name.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`

	// Kind is VirtualMachineClusterPreference (the default) or VirtualMachinePreference (in the
	// VM's namespace); KubeVirt's lower-case and plural spellings are accepted too.
	// +optional
	// +kubebuilder:validation:Enum=VirtualMachinePreference;VirtualMachineClusterPreference;virtualmachinepreference;virtualmachinepreferences;virtualmachineclusterpreference;virtualmachineclusterpreferences
	Kind string `json:"kind,omitempty"`

	// RevisionName names the ControllerRevision holding the copy of the preference this VM uses
	// (see InstancetypeMatcher.RevisionName).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	RevisionName string `json:"revisionName,omitempty"`

	// InferFromVolume names a volume whose PersistentVolumeClaim carries the
	// instancetype.kubevirt.io/default-preference (and -kind) labels.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	InferFromVolume string `json:"inferFromVolume,omitempty"`

	// InferFromVolumeFailurePolicy is Reject (the default) or Ignore.
	// +optional
	InferFromVolumeFailurePolicy *InferFromVolumeFailurePolicy `json:"inferFromVolumeFailurePolicy,omitempty"`
}

// InferFromVolumeFailurePolicy is what happens when inferFromVolume finds nothing.
// +kubebuilder:validation:Enum=Reject;Ignore
type InferFromVolumeFailurePolicy string

// Failure policies, as KubeVirt's (RejectInferFromVolumeFailure, IgnoreInferFromVolumeFailure).
const (
	RejectInferFromVolumeFailure InferFromVolumeFailurePolicy = "Reject"
	IgnoreInferFromVolumeFailure InferFromVolumeFailurePolicy = "Ignore"
)

// InstancetypeStatusRef is the instancetype or preference a VM's instances are expanded from, and
// the ControllerRevision holding the copy taken at first use, as KubeVirt's status.instancetypeRef
// and status.preferenceRef.
type InstancetypeStatusRef struct {
	// Name is the instancetype's or preference's name.
	// +optional
	Name string `json:"name,omitempty"`

	// Kind is its kind.
	// +optional
	Kind string `json:"kind,omitempty"`

	// ControllerRevisionRef names the ControllerRevision, owned by the VM, that holds the copy.
	// +optional
	ControllerRevisionRef *ControllerRevisionRef `json:"controllerRevisionRef,omitempty"`
}

// ControllerRevisionRef names a ControllerRevision.
type ControllerRevisionRef struct {
	// Name is the ControllerRevision's name.
	// +optional
	Name string `json:"name,omitempty"`
}

// DataVolumeTemplateSpec is KubeVirt's template of a CDI DataVolume: the DataVolume's metadata
// and CDI's DataVolumeSpec, which qvirt passes to CDI as it is.
type DataVolumeTemplateSpec struct {
	// ObjectMeta is the DataVolume's metadata.
	// +optional
	ObjectMeta metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the DataVolume's spec (CDI's DataVolumeSpec: source, sourceRef, pvc or storage,
	// ...), copied to the DataVolume unchanged; CDI's own admission checks it.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Spec runtime.RawExtension `json:"spec,omitempty"`
}

// VirtualMachineInstanceTemplateSpec is the metadata and spec of the instances a VirtualMachine creates.
type VirtualMachineInstanceTemplateSpec struct {
	// ObjectMeta holds the labels and annotations given to each instance.
	// +optional
	ObjectMeta metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the instance's spec.
	Spec VirtualMachineInstanceSpec `json:"spec"`
}

// RunStrategy says when a VirtualMachine's instance should exist.
// +kubebuilder:validation:Enum=Always;RerunOnFailure;Once;Manual;Halted
type RunStrategy string

// Run strategies, with KubeVirt's semantics.
const (
	RunStrategyAlways         RunStrategy = "Always"
	RunStrategyRerunOnFailure RunStrategy = "RerunOnFailure"
	RunStrategyOnce           RunStrategy = "Once"
	RunStrategyManual         RunStrategy = "Manual"
	RunStrategyHalted         RunStrategy = "Halted"
)

// PrintableStatus is a one-word summary of a VirtualMachine for people.
type PrintableStatus string

// Printable statuses, as in KubeVirt.
const (
	PrintableStatusStopped            PrintableStatus = "Stopped"
	PrintableStatusProvisioning       PrintableStatus = "Provisioning"
	PrintableStatusStarting           PrintableStatus = "Starting"
	PrintableStatusRunning            PrintableStatus = "Running"
	PrintableStatusPaused             PrintableStatus = "Paused"
	PrintableStatusStopping           PrintableStatus = "Stopping"
	PrintableStatusTerminating        PrintableStatus = "Terminating"
	PrintableStatusMigrating          PrintableStatus = "Migrating"
	PrintableStatusUnknown            PrintableStatus = "Unknown"
	PrintableStatusUnschedulable      PrintableStatus = "ErrorUnschedulable"
	PrintableStatusErrImagePull       PrintableStatus = "ErrImagePull"
	PrintableStatusImagePullBackOff   PrintableStatus = "ImagePullBackOff"
	PrintableStatusCrashLoopBackOff   PrintableStatus = "CrashLoopBackOff"
	PrintableStatusWaitingForVolume   PrintableStatus = "WaitingForVolumeBinding"
	PrintableStatusFailed             PrintableStatus = "Failed"
	PrintableStatusSucceeded          PrintableStatus = "Succeeded"
	PrintableStatusRestartRequired    PrintableStatus = "RestartRequired"
	PrintableStatusDataVolumeNotReady PrintableStatus = "DataVolumeError"
	PrintableStatusDataVolumeNotFound PrintableStatus = "ErrorDataVolumeNotFound"
)

// Condition types of a VirtualMachine.
const (
	// VirtualMachineReady mirrors the instance's Ready condition.
	VirtualMachineReady = "Ready"
	// VirtualMachinePaused mirrors the instance's Paused condition.
	VirtualMachinePaused = "Paused"
	// VirtualMachineFailure reports a failure to create or run the instance.
	VirtualMachineFailure = "Failure"
	// VirtualMachineRestartRequired is true when the template changed under a running instance.
	VirtualMachineRestartRequired = "RestartRequired"
	// VirtualMachineDataVolumesReady says whether the DataVolumes of the VM's dataVolume volumes
	// have all succeeded (KubeVirt's DataVolumesReady); only VMs with such volumes have it.
	VirtualMachineDataVolumesReady = "DataVolumesReady"
)

// Reasons of the DataVolumesReady condition of a VirtualMachine or an instance, KubeVirt's.
const (
	AllDataVolumesReadyReason    = "AllDVsReady"
	NotAllDataVolumesReadyReason = "NotAllDVsReady"
)

// VirtualMachineStatus is the observed state of a VirtualMachine.
type VirtualMachineStatus struct {
	// Created is true when an instance exists.
	// +optional
	Created bool `json:"created,omitempty"`

	// Ready is true when the instance exists and is ready.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// PrintableStatus is a one-word summary: Stopped, Starting, Running, Paused, Stopping,
	// Terminating, Migrating, ErrorUnschedulable, CrashLoopBackOff, ...
	// +optional
	PrintableStatus PrintableStatus `json:"printableStatus,omitempty"`

	// RunStrategy is the run strategy in force.
	// +optional
	RunStrategy RunStrategy `json:"runStrategy,omitempty"`

	// Conditions are Ready, Paused, Failure, RestartRequired and the like.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// StateChangeRequests are pending start and stop requests, as set by `qvirtctl start/stop/restart`.
	// A restart is a Stop naming the current instance's UID followed by a Start.
	// +optional
	// +listType=atomic
	StateChangeRequests []VirtualMachineStateChangeRequest `json:"stateChangeRequests,omitempty"`

	// StartFailure tracks consecutive failed starts for the crash-loop back-off.
	// +optional
	StartFailure *VirtualMachineStartFailure `json:"startFailure,omitempty"`

	// ObservedGeneration is the spec generation the status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// InstancetypeRef is the instancetype the VM's instances are expanded from and the
	// ControllerRevision holding its copy: a later change to the instancetype does not reach this
	// VM's instances until the reference in spec.instancetype changes.
	// +optional
	InstancetypeRef *InstancetypeStatusRef `json:"instancetypeRef,omitempty"`

	// PreferenceRef is the same for spec.preference.
	// +optional
	PreferenceRef *InstancetypeStatusRef `json:"preferenceRef,omitempty"`
}

// StateChangeRequestAction is a requested change of run state.
// +kubebuilder:validation:Enum=Start;Stop
type StateChangeRequestAction string

// Request actions.
const (
	StartRequest StateChangeRequestAction = "Start"
	StopRequest  StateChangeRequestAction = "Stop"
)

// VirtualMachineStateChangeRequest is one start or stop request.
type VirtualMachineStateChangeRequest struct {
	// Action is Start or Stop.
	Action StateChangeRequestAction `json:"action"`
	// Data carries request details, such as a grace period override.
	// +optional
	Data map[string]string `json:"data,omitempty"`
	// UID is the instance a Stop applies to; a Stop for an instance that is already gone is dropped.
	// +optional
	UID *types.UID `json:"uid,omitempty"`
}

// VirtualMachineStartFailure tracks failed starts.
type VirtualMachineStartFailure struct {
	// ConsecutiveFailCount is how many starts in a row failed.
	// +optional
	ConsecutiveFailCount int `json:"consecutiveFailCount,omitempty"`
	// LastFailedVMIUID is the instance that failed last.
	// +optional
	LastFailedVMIUID types.UID `json:"lastFailedVMIUID,omitempty"`
	// RetryAfterTimestamp is when the next start may happen.
	// +optional
	RetryAfterTimestamp *metav1.Time `json:"retryAfterTimestamp,omitempty"`
}

// EffectiveRunStrategy is the strategy vm asks for: spec.runStrategy when set, else spec.running
// (true is Always, false or unset is Halted). The VM controller and qvirt-api's VM actions both
// read it here.
func (vm *VirtualMachine) EffectiveRunStrategy() RunStrategy {
	if vm.Spec.RunStrategy != nil && *vm.Spec.RunStrategy != "" {
		return *vm.Spec.RunStrategy
	}
	if vm.Spec.Running != nil && *vm.Spec.Running {
		return RunStrategyAlways
	}
	return RunStrategyHalted
}
