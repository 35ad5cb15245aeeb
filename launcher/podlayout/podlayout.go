// Package podlayout is the launcher pod's layout: its container, the launcher's path and user, the
// directories the pod mounts and the flags of `qvirt-launcher serve`. The pod renderer
// (controllers/vmi) writes the pod from these, the node agent (handler/) finds the launcher's
// files by them, and qvirt-launcher's flags default to them, so the three cannot drift apart.
//
// It is standard library only: the launcher links it and links no Kubernetes package.
package podlayout

const (
	// ComputeContainer is the launcher pod's only container; it runs qvirt-launcher, which runs QEMU.
	ComputeContainer = "compute"
	// LauncherBinary is the launcher's path inside the launcher image.
	LauncherBinary = "/usr/bin/qvirt-launcher"
	// LauncherUID is the unprivileged user (and group) the launcher and QEMU run as, as in KubeVirt.
	LauncherUID = 107

	// SocketDir is where the launcher pod mounts its own sockets volume (SocketsVolume, an emptyDir):
	// one subdirectory for its VMI's UID with launcher.sock and QEMU's sockets (launcher.Dir). No
	// other pod sees it; the node agent reaches it on the host through the kubelet's pod directory
	// (HostSocketDir).
	SocketDir = "/var/run/qvirt/sockets"
	// SocketsVolume is the name of the launcher pod's emptyDir mounted at SocketDir.
	SocketsVolume = "sockets"
	// KubeletPodsDir is where a kubelet keeps its pods' volumes; the node agent mounts it (hostPath)
	// to reach launcher sockets.
	KubeletPodsDir = "/var/lib/kubelet/pods"
	// ContainerDiskDir holds one read-only image volume per containerDisk volume of the VMI, at
	// ContainerDiskDir/<volume name> (ContainerDiskMount). The kubelet (or a virtual node's
	// provider) pulls and unpacks the image with the pod's own imagePullSecrets; the launcher only
	// reads files from it and never pulls.
	ContainerDiskDir = "/var/run/qvirt/container-disks"
	// KernelBootDir is the read-only image volume of spec.domain.firmware.kernelBoot.container.
	KernelBootDir = "/var/run/qvirt/kernel-boot"
	// CloudInitSecretDir holds the Secret volumes of the VMI's cloud-init volume, read-only, at
	// CloudInitSecretMount: the kubelet (or a virtual node's provider) writes the Secret's keys
	// there, and the launcher reads them when it writes the cloud-init image. The node agent never
	// reads them.
	CloudInitSecretDir = "/var/run/qvirt/cloud-init-secrets"
	// ConfigVolumeDir holds the Kubernetes volume behind each config volume of the VMI (secret,
	// configMap, serviceAccount, downwardAPI), read-only, at ConfigVolumeMount: the kubelet (or a
	// virtual node's provider) writes the files there, and the launcher makes the disk's ISO 9660
	// image of them at start. The node agent never reads them.
	ConfigVolumeDir = "/var/run/qvirt/config-volumes"
	// ClaimsDir holds one mount per filesystem-mode PersistentVolumeClaim volume of the VMI, at
	// ClaimsDir/<volume name> (ClaimMount); the disk is the raw disk.img in it, as in KubeVirt.
	ClaimsDir = "/var/run/qvirt/claims"
	// ClaimDevicesDir holds the device node of each block-mode claim volume, at
	// ClaimDevicesDir/<volume name> (ClaimDevice): a directory of qvirt's own, so no volume name
	// can shadow a device the launcher needs (/dev/kvm, /dev/net/tun).
	ClaimDevicesDir = "/dev/qvirt-claims"
	// HostDisksDir holds the host directories of hostDisk volumes: the pod mounts host directory D
	// at HostDisksDir+D (HostDiskMount).
	HostDisksDir = "/var/run/qvirt/host-disks"
	// PrivateDir is a writable emptyDir for the launcher's own files, such as emptyDisk images (the
	// root filesystem is read-only).
	PrivateDir = "/var/run/qvirt/private"
	// StateDir is where the launcher pod mounts its instance's backend-storage claim
	// (v1alpha1.BackendStorageClaim), writable: the persistent EFI variable store and TPM state.
	StateDir = "/var/run/qvirt/state"
)

// Flags of `qvirt-launcher serve` that the pod renderer passes.
const (
	FlagSocketDir = "socket-dir"
	FlagVMIUID    = "vmi-uid"
	FlagEmulation = "emulation"
	// FlagCPUProfile makes the launcher profile its start (ProfileFile).
	FlagCPUProfile = "cpu-profile"
)

// ProfileFile is where a launcher started with FlagCPUProfile writes the CPU profile of its start
// (from its own start until its guest first runs), in its instance's socket directory.
const ProfileFile = "cpu.pprof"

// ProbeCommand is the launcher's subcommand a guestAgentPing or exec probe runs in the compute
// container (as KubeVirt's virt-probe), with FlagSocketDir, FlagVMIUID and FlagGuestAgentPing, or
// FlagGuestExec followed by "--" and the command to run in the guest.
const (
	ProbeCommand       = "probe"
	FlagGuestAgentPing = "guest-agent-ping"
	FlagGuestExec      = "guest-exec"
	FlagProbeTimeout   = "timeout"
)

// TerminatedMessagePrefix starts the compute container's termination message when the launcher
// stopped the guest because it was told to stop (SIGTERM), not because the guest ended by itself.
// The node agent learns that from the launcher's status; the VMI reconciler reads it here when the
// launcher exited before the node agent asked, so that a liveness kill still fails the instance.
const TerminatedMessagePrefix = "terminated (SIGTERM): "

// Flags of `qvirt-launcher run` (outside Kubernetes), where the launcher still pulls its images.
const (
	FlagImageCache       = "image-cache"
	FlagInsecureRegistry = "insecure-registry"
)

// EmptyDir is where a node keeps pod podUID's emptyDir volume under podsDir (KubeletPodsDir on a
// kubelet's node; a virtual node lays out its pods the same way under its own state directory).
func EmptyDir(podsDir, podUID, volume string) string {
	return podsDir + "/" + podUID + "/volumes/kubernetes.io~empty-dir/" + volume
}

// HostSocketDir is the launcher pod podUID's SocketDir as the node agent sees it on the host.
func HostSocketDir(podsDir, podUID string) string {
	return EmptyDir(podsDir, podUID, SocketsVolume)
}

// Which cloud-init data a Secret volume holds (CloudInitSecretMount).
const (
	CloudInitUserData    = "userdata"
	CloudInitNetworkData = "networkdata"
)

// CloudInitSecretMount is where the launcher pod mounts the Secret of cloud-init volume's user
// data (CloudInitUserData) or network data (CloudInitNetworkData).
func CloudInitSecretMount(volume, data string) string {
	return CloudInitSecretDir + "/" + volume + "/" + data
}

// ConfigVolumeMount is where the launcher pod mounts config volume volume's files.
func ConfigVolumeMount(volume string) string { return ConfigVolumeDir + "/" + volume }

// ClaimMount is where the launcher pod mounts filesystem-mode claim volume's volume.
func ClaimMount(volume string) string { return ClaimsDir + "/" + volume }

// ClaimDevice is where the launcher pod has block-mode claim volume's device.
func ClaimDevice(volume string) string { return ClaimDevicesDir + "/" + volume }

// HostDiskMount is where the launcher pod mounts host directory dir (absolute, clean).
func HostDiskMount(dir string) string { return HostDisksDir + dir }

// ContainerDiskMount is where the launcher pod mounts containerDisk volume's image.
func ContainerDiskMount(volume string) string { return ContainerDiskDir + "/" + volume }

// FlagAllowFileImagesForTests lets `qvirt-launcher serve` use file:// images, for tests that run
// serve-mode launchers on a prepared directory. The pod renderer never passes it (its test checks).
const FlagAllowFileImagesForTests = "allow-file-images"
