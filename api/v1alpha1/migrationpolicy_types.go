package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MigrationPolicy is KubeVirt's migrations.kubevirt.io/v1alpha1 MigrationPolicy under qvirt's
// group: migration settings for the instances its selectors match, over the cluster's
// (qvirt-config). The migration controller picks one policy per migration when it starts and
// records it in the instance's status.migrationState (migrationPolicyName, migrationConfiguration),
// so a policy changed later does not change a migration under way.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,categories=all;qvirt
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type MigrationPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MigrationPolicySpec `json:"spec"`
	// +optional
	Status MigrationPolicyStatus `json:"status,omitempty"`
}

// MigrationPolicySpec is what a policy sets and for which instances. Every setting is optional:
// one the policy leaves out is the cluster's.
//
// +kubebuilder:validation:XValidation:rule="!has(self.allowPostCopy) || !self.allowPostCopy || !has(self.parallelMigrationThreads) || self.parallelMigrationThreads == 0",message="allowPostCopy: true cannot be combined with parallelMigrationThreads: QEMU 7.2 sends post-copy pages over the main stream only"
// +kubebuilder:validation:XValidation:rule="!has(self.allowWorkloadDisruption) || !self.allowWorkloadDisruption",message="allowWorkloadDisruption: true is not supported by qvirt yet: a migration is never paused to converge"
// +kubebuilder:validation:XValidation:rule="!has(self.parallelMigrationCompression) || self.parallelMigrationCompression == 'none' || (has(self.parallelMigrationThreads) && self.parallelMigrationThreads > 0)",message="parallelMigrationCompression: compression needs parallelMigrationThreads of 1 or more: QEMU compresses only the parallel (multifd) streams"
type MigrationPolicySpec struct {
	// AllowAutoConverge lets QEMU throttle the guest's vCPUs when it dirties memory faster than
	// the migration sends it.
	// +optional
	AllowAutoConverge *bool `json:"allowAutoConverge,omitempty"`
	// BandwidthPerMigration caps each migration's bandwidth in bytes per second; 0 is unlimited.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0')) || quantity(string(self)).compareTo(quantity('0')) == 0",message="bandwidthPerMigration must not be negative"
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`
	// CompletionTimeoutPerGiB is how many seconds a migration may take per GiB of guest memory
	// before it is aborted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	CompletionTimeoutPerGiB *int64 `json:"completionTimeoutPerGiB,omitempty"`
	// AllowPostCopy lets a migration that has not converged by its completion timeout switch to
	// post-copy instead of being aborted: the guest runs on the target at once and fetches the
	// rest of its memory from the source. A failure after the switch loses the guest. Only where
	// the target node gives launchers userfaultfd (label qvirt.io/postcopy=true); elsewhere, and
	// for instances with local disks, the migration stays pre-copy and says why in an Event.
	// +optional
	AllowPostCopy *bool `json:"allowPostCopy,omitempty"`
	// AllowWorkloadDisruption lets a migration pause the guest to converge (KubeVirt's field; qvirt
	// refuses it until it does so).
	// +optional
	AllowWorkloadDisruption *bool `json:"allowWorkloadDisruption,omitempty"`
	// ParallelMigrationThreads sends the guest's memory over this many parallel streams (QEMU's
	// multifd-channels) beside the main one; 0 or unset sends it over the main stream only.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	ParallelMigrationThreads *int32 `json:"parallelMigrationThreads,omitempty"`
	// ParallelMigrationCompression compresses the parallel streams' pages: none (the default) or
	// zstd, which trades the nodes' CPU for network bandwidth. A qvirt setting.
	// +optional
	ParallelMigrationCompression *MigrationCompression `json:"parallelMigrationCompression,omitempty"`

	// Selectors are the instances the policy applies to: those carrying every label of
	// virtualMachineInstanceSelector in a namespace carrying every label of namespaceSelector.
	Selectors *Selectors `json:"selectors"`
}

// Selectors pick a policy's instances by labels, as KubeVirt's: a map of label to value, all of
// which must match; an empty map matches every instance (or namespace).
type Selectors struct {
	// +optional
	NamespaceSelector LabelSelector `json:"namespaceSelector,omitempty"`
	// +optional
	VirtualMachineInstanceSelector LabelSelector `json:"virtualMachineInstanceSelector,omitempty"`
}

// LabelSelector is KubeVirt's migrations LabelSelector: exact label values, all required.
type LabelSelector map[string]string

// MigrationPolicyStatus is empty, as KubeVirt's.
type MigrationPolicyStatus struct{}

// +kubebuilder:object:root=true

// MigrationPolicyList is a list of MigrationPolicy.
type MigrationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MigrationPolicy `json:"items"`
}

// MigrationConfiguration is the migration settings in force for one migration: the cluster's
// with its policy's over them (KubeVirt's v1.MigrationConfiguration, the fields qvirt uses).
type MigrationConfiguration struct {
	// +optional
	AllowAutoConverge *bool `json:"allowAutoConverge,omitempty"`
	// +optional
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`
	// +optional
	CompletionTimeoutPerGiB *int64 `json:"completionTimeoutPerGiB,omitempty"`
	// +optional
	AllowPostCopy *bool `json:"allowPostCopy,omitempty"`
	// +optional
	ParallelMigrationThreads *int32 `json:"parallelMigrationThreads,omitempty"`
	// +optional
	ParallelMigrationCompression *MigrationCompression `json:"parallelMigrationCompression,omitempty"`
}

// MigrationCompression is how a migration's parallel streams compress the guest's pages.
// +kubebuilder:validation:Enum=none;zstd
type MigrationCompression string

// Compressions QEMU 7.2 offers for multifd (it also has zlib, which zstd beats on speed and size).
const (
	MigrationCompressionNone MigrationCompression = "none"
	MigrationCompressionZstd MigrationCompression = "zstd"
)
