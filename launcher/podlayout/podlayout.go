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

	// SocketDir is the host directory holding one subdirectory per VMI UID with launcher.sock and
	// QEMU's sockets (launcher.Dir), shared by the launcher pod (hostPath) and the node agent.
	SocketDir = "/var/run/qvirt/sockets"
	// ImageCacheDir is the host directory where launchers keep the registry images they pulled
	// (kernelBoot and containerDisk images), shared by the node's launchers and owned by their uid.
	ImageCacheDir = "/var/lib/qvirt/images"
	// PrivateDir is a writable emptyDir for the launcher's own files, such as emptyDisk images (the
	// root filesystem is read-only).
	PrivateDir = "/var/run/qvirt/private"
)

// Flags of `qvirt-launcher serve` that the pod renderer passes.
const (
	FlagSocketDir        = "socket-dir"
	FlagVMIUID           = "vmi-uid"
	FlagEmulation        = "emulation"
	FlagImageCache       = "image-cache"
	FlagInsecureRegistry = "insecure-registry"
)

// FlagAllowFileImagesForTests lets `qvirt-launcher serve` use file:// images, for tests that run
// serve-mode launchers on a prepared directory. The pod renderer never passes it (its test checks).
const FlagAllowFileImagesForTests = "allow-file-images"
