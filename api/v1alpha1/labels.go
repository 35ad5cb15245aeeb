package v1alpha1

// Labels, annotations and finalizers shared by the controller, the node agent and the launcher pod.
const (
	// AppLabel marks qvirt's pods; launcher pods carry AppLabel=LauncherApp.
	AppLabel    = "qvirt.io/app"
	LauncherApp = "qvirt-launcher"

	// VMINameLabel and VMIUIDLabel link a launcher pod to its VMI.
	VMINameLabel = "qvirt.io/vmi"
	VMIUIDLabel  = "qvirt.io/vmi-uid"
	// VMNameLabel links a VMI and its launcher pod to the owning VM.
	VMNameLabel = "qvirt.io/vm"
	// MigrationUIDLabel marks a migration's target launcher pod.
	MigrationUIDLabel = "qvirt.io/migration-uid"
	// EvacuationMigrationAnnotation marks a migration qvirt-controller created to move an instance
	// off a node being drained (KubeVirt's kubevirt.io/evacuationMigration); its value is that node.
	EvacuationMigrationAnnotation = "qvirt.io/evacuationMigration"

	// GracefulShutdownFinalizer holds a VMI until the node agent has shut its guest down.
	GracefulShutdownFinalizer = "qvirt.io/graceful-shutdown"
	// MigrationFinalizer lets a migration cancel and clean up before it goes.
	MigrationFinalizer = "qvirt.io/migration"

	// KVMResource and TunResource are the device-plugin resources a launcher pod asks for unless
	// emulation is configured.
	KVMResource = "devices.qvirt.io/kvm"
	TunResource = "devices.qvirt.io/tun"

	// NodeSchedulableLabel is "true" on nodes whose node agent runs and beats; launcher pods
	// select it. The node agent sets it on every heartbeat and "false" when it stops cleanly; the
	// controller sets "false" on a node whose heartbeat went stale, and never sets "true".
	NodeSchedulableLabel = "qvirt.io/schedulable"
	// NodeKVMLabel is "true" when a check guest ran under KVM on the node, "false" otherwise;
	// NodeKVMReasonAnnotation then says why.
	NodeKVMLabel            = "qvirt.io/kvm"
	NodeKVMReasonAnnotation = "qvirt.io/kvm-reason"
	// NodePostCopyLabel is "true" when the node gives launchers userfaultfd, which an incoming
	// post-copy migration needs (sysctl vm.unprivileged_userfaultfd=1), "false" otherwise;
	// NodePostCopyReasonAnnotation then says why.
	NodePostCopyLabel            = "qvirt.io/postcopy"
	NodePostCopyReasonAnnotation = "qvirt.io/postcopy-reason"
	// NodeCPUManagerLabel is KubeVirt's: "true" when the node's kubelet runs the static CPU
	// manager, which gives a Guaranteed pod's container whole CPUs of its own, "false" otherwise
	// (NodeCPUManagerReasonAnnotation then says why). Launcher pods of instances with
	// dedicatedCpuPlacement select it; an administrator may set it by hand where the node agent
	// cannot read the kubelet's state.
	NodeCPUManagerLabel            = "cpumanager"
	NodeCPUManagerReasonAnnotation = "qvirt.io/cpumanager-reason"
	// NodeQEMUVersionLabel is the node's QEMU version, major.minor.micro as QMP reports it (the
	// same form as a VMI's status.qemuVersion).
	NodeQEMUVersionLabel = "qvirt.io/qemu-version"
	// NodeHeartbeatAnnotation is when the node agent last beat, RFC 3339.
	NodeHeartbeatAnnotation = "qvirt.io/heartbeat"
	// NodeStreamsAddressAnnotation is host:port of the node agent's mTLS stream server, where
	// qvirt-api reaches the consoles, displays and QMP shells of the node's VMIs.
	NodeStreamsAddressAnnotation = "qvirt.io/streams-address"

	// StopGracePeriodDataKey is the key of a Stop request's data (status.stateChangeRequests)
	// overriding the instance's terminationGracePeriodSeconds for that stop, in decimal seconds;
	// `qvirtctl stop --force` sends "0".
	StopGracePeriodDataKey = "gracePeriodSeconds"
	// StopGracePeriodAnnotation carries such an override to the instance being deleted, where the
	// node agent honours it when it powers the guest off.
	StopGracePeriodAnnotation = "qvirt.io/stop-grace-period-seconds"
	// StartPausedDataKey is the key of a Start request's data that, set to "true", makes the
	// instance it creates start paused (spec.startStrategy Paused); `qvirtctl start --paused`.
	StartPausedDataKey = "paused"
)
