package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VirtualMachineInstanceMigration asks for one live migration of a running instance to another node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=vmim;vmims,categories=all;qvirt
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=".status.phase"
// +kubebuilder:printcolumn:name="VMI",type=string,JSONPath=".spec.vmiName"
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=".status.migrationState.sourceNode",priority=1
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=".status.migrationState.targetNode",priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type VirtualMachineInstanceMigration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec names the instance to migrate; it cannot change.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable; delete the migration and create a new one"
	Spec VirtualMachineInstanceMigrationSpec `json:"spec"`

	// Status is the migration's progress.
	// +optional
	Status VirtualMachineInstanceMigrationStatus `json:"status,omitempty"`
}

// VirtualMachineInstanceMigrationList is a list of migrations.
//
// +kubebuilder:object:root=true
type VirtualMachineInstanceMigrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VirtualMachineInstanceMigration `json:"items"`
}

// VirtualMachineInstanceMigrationSpec names the instance to migrate.
type VirtualMachineInstanceMigrationSpec struct {
	// VMIName is the VirtualMachineInstance to migrate, in the migration's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	VMIName string `json:"vmiName"`
}

// VirtualMachineInstanceMigrationPhase is where a migration is.
// +kubebuilder:validation:Enum=Pending;Scheduling;Scheduled;PreparingTarget;TargetReady;Running;Succeeded;Failed
type VirtualMachineInstanceMigrationPhase string

// Migration phases, as in KubeVirt.
const (
	MigrationPending         VirtualMachineInstanceMigrationPhase = "Pending"
	MigrationScheduling      VirtualMachineInstanceMigrationPhase = "Scheduling"
	MigrationScheduled       VirtualMachineInstanceMigrationPhase = "Scheduled"
	MigrationPreparingTarget VirtualMachineInstanceMigrationPhase = "PreparingTarget"
	MigrationTargetReady     VirtualMachineInstanceMigrationPhase = "TargetReady"
	MigrationRunning         VirtualMachineInstanceMigrationPhase = "Running"
	MigrationSucceeded       VirtualMachineInstanceMigrationPhase = "Succeeded"
	MigrationFailed          VirtualMachineInstanceMigrationPhase = "Failed"
)

// MigrationConditionFailed is the condition a migration gets once it failed or was refused; its
// reason and message say why.
const MigrationConditionFailed = "Failed"

// VirtualMachineInstanceMigrationStatus is a migration's progress.
type VirtualMachineInstanceMigrationStatus struct {
	// Phase is where the migration is.
	// +optional
	Phase VirtualMachineInstanceMigrationPhase `json:"phase,omitempty"`

	// PhaseTransitionTimestamps records when each phase was entered.
	// +optional
	// +listType=atomic
	PhaseTransitionTimestamps []VirtualMachineInstanceMigrationPhaseTransitionTimestamp `json:"phaseTransitionTimestamps,omitempty"`

	// Conditions explain failures and progress.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// MigrationState is the source and target node and pod, timestamps and progress.
	// +optional
	MigrationState *VirtualMachineInstanceMigrationState `json:"migrationState,omitempty"`
}

// VirtualMachineInstanceMigrationPhaseTransitionTimestamp is when a migration phase was entered.
type VirtualMachineInstanceMigrationPhaseTransitionTimestamp struct {
	// Phase is the phase entered.
	Phase VirtualMachineInstanceMigrationPhase `json:"phase,omitempty"`
	// PhaseTransitionTimestamp is when.
	PhaseTransitionTimestamp metav1.Time `json:"phaseTransitionTimestamp,omitempty"`
}
