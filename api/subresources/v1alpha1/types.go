// Package v1alpha1 is the contract of qvirt-api's aggregated group subresources.qvirt.io/v1alpha1:
// its paths, the bodies of its actions and the websocket subprotocols of its streams. qvirt-api
// serves it; qvirtctl (and anyone else) calls it through kube-apiserver, which authenticates the
// user and proxies to qvirt-api.
//
// Every subresource is its own RBAC resource in the group subresources.qvirt.io, as in KubeVirt:
//
//	GET  .../virtualmachineinstances/{name}/console     websocket, subprotocol plain.qvirt.io
//	GET  .../virtualmachineinstances/{name}/vnc         websocket, subprotocol plain.qvirt.io
//	GET  .../virtualmachineinstances/{name}/qmp         websocket, subprotocol qmp.qvirt.io; commands
//	                                                    other than read-only ones need the verb
//	                                                    update on virtualmachineinstances/qmp-write
//	PUT  .../virtualmachineinstances/{name}/pause       no body
//	PUT  .../virtualmachineinstances/{name}/unpause     no body
//	PUT  .../virtualmachineinstances/{name}/softreboot  no body
//	GET  .../virtualmachineinstances/{name}/screenshot  image/png
//	GET  .../virtualmachineinstances/{name}/guestosinfo VirtualMachineInstanceGuestAgentInfo (409 without a guest agent)
//	GET  .../virtualmachineinstances/{name}/userlist    VirtualMachineInstanceGuestOSUserList
//	GET  .../virtualmachineinstances/{name}/filesystemlist VirtualMachineInstanceFileSystemList
//	PUT  .../virtualmachineinstances/{name}/freeze      no body; freezes the guest's filesystems
//	PUT  .../virtualmachineinstances/{name}/unfreeze    no body; thaws them
//	PUT  .../virtualmachines/{name}/start               StartOptions (or no body)
//	PUT  .../virtualmachines/{name}/stop                StopOptions (or no body)
//	PUT  .../virtualmachines/{name}/restart             RestartOptions (or no body)
//	PUT  .../virtualmachines/{name}/migrate             MigrateOptions (or no body); answers the
//	                                                    created VirtualMachineInstanceMigration
//	PUT  .../virtualmachines/{name}/addvolume           AddVolumeOptions
//	PUT  .../virtualmachines/{name}/removevolume        RemoveVolumeOptions
//	GET  /apis/subresources.qvirt.io/v1alpha1/version   Version
//
// where ... is /apis/subresources.qvirt.io/v1alpha1/namespaces/{namespace}. Errors are
// metav1.Status bodies with the HTTP code in them, as from kube-apiserver.
package v1alpha1

import (
	"path"

	"k8s.io/apimachinery/pkg/runtime/schema"

	core "github.com/qvirt/qvirt/api/v1alpha1"
)

// GroupVersion is the aggregated API's group and version.
var GroupVersion = schema.GroupVersion{Group: "subresources.qvirt.io", Version: "v1alpha1"}

// Subresource names; each is also the RBAC subresource.
const (
	Console = "console"
	VNC     = "vnc"
	QMP     = "qmp"
	// USBRedir carries a client's USB device to the guest in usbredir's protocol (KubeVirt's).
	USBRedir   = "usbredir"
	Pause      = "pause"
	Unpause    = "unpause"
	SoftReboot = "softreboot"
	Screenshot = "screenshot"
	// The guest agent's: KubeVirt's names.
	GuestOSInfo    = "guestosinfo"
	UserList       = "userlist"
	FileSystemList = "filesystemlist"
	Freeze         = "freeze"
	Unfreeze       = "unfreeze"

	Start        = "start"
	Stop         = "stop"
	Restart      = "restart"
	Migrate      = "migrate"
	AddVolume    = "addvolume"
	RemoveVolume = "removevolume"

	// QMPWrite is checked (verb update) before a QMP command that is not read-only is forwarded;
	// there is no path for it.
	QMPWrite = "qmp-write"
)

// Resources the subresources hang off.
const (
	VirtualMachineInstances = "virtualmachineinstances"
	VirtualMachines         = "virtualmachines"
)

// Websocket subprotocols (the same on the handler's stream server).
const (
	// SubprotocolPlain carries raw bytes in binary frames: the serial console and VNC.
	SubprotocolPlain = "plain.qvirt.io"
	// SubprotocolQMP carries one QMP JSON message per text frame.
	SubprotocolQMP = "qmp.qvirt.io"
)

// Websocket message limits of the streams, one set for qvirt-api and the handler's stream server
// alike: a message that passes one passes the other, so a user never sees qvirt-api accept what
// the handler then drops.
const (
	// MaxClientMessage bounds one message from the user on any stream: console and VNC input (a
	// paste, a VNC clipboard), a QMP command. 1 MiB: far above what a person types or a VNC client
	// sends at once, small enough that a session cannot make either side buffer much.
	MaxClientMessage = 1 << 20
	// MaxQMPMessage bounds one QMP message to the user: replies can be large (query-qmp-schema
	// is over 100 KiB). Console and VNC output comes in frames of at most 32 KiB.
	MaxQMPMessage = 16 << 20
)

// Path is the absolute path of a subresource of the named object, without scheme and host.
func Path(namespace, resource, name, subresource string) string {
	return path.Join("/apis", GroupVersion.Group, GroupVersion.Version, "namespaces", namespace, resource, name, subresource)
}

// VersionPath is where qvirt-api reports its version.
func VersionPath() string {
	return path.Join("/apis", GroupVersion.Group, GroupVersion.Version, "version")
}

// StartOptions is the body of virtualmachines/start.
type StartOptions struct {
	// Paused starts the VM with its vCPUs stopped.
	Paused bool `json:"paused,omitempty"`
}

// StopOptions is the body of virtualmachines/stop.
type StopOptions struct {
	// GracePeriodSeconds overrides the VMI's terminationGracePeriodSeconds for this stop.
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
	// Force stops at once (grace period 0) and also stops a VM whose instance is still starting.
	Force bool `json:"force,omitempty"`
}

// RestartOptions is the body of virtualmachines/restart.
type RestartOptions struct {
	// GracePeriodSeconds overrides the grace period of the stop half.
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
	// Force stops the current instance at once (grace period 0), as stop's force does.
	Force bool `json:"force,omitempty"`
}

// MigrateOptions is the body of virtualmachines/migrate.
type MigrateOptions struct {
	// DryRun validates without creating the migration.
	DryRun []string `json:"dryRun,omitempty"`
}

// AddVolumeOptions is the body of virtualmachines/addvolume: the volume and its disk are added to
// the VM's template and, when it runs, to its instance (hotplug).
type AddVolumeOptions struct {
	// Name names both the volume and its disk.
	Name string `json:"name"`
	// Disk is how the guest sees it; Disk.Name is set from Name.
	Disk *core.Disk `json:"disk"`
	// VolumeSource is the volume's backing.
	VolumeSource *core.VolumeSource `json:"volumeSource"`
}

// RemoveVolumeOptions is the body of virtualmachines/removevolume.
type RemoveVolumeOptions struct {
	// Name is the volume (and disk) to remove.
	Name string `json:"name"`
}

// Version is what GET .../version answers.
type Version struct {
	GitVersion string `json:"gitVersion"`
	GitCommit  string `json:"gitCommit,omitempty"`
	GoVersion  string `json:"goVersion"`
	Platform   string `json:"platform"`
}

// VirtualMachineInstanceGuestAgentInfo is what the guestosinfo subresource answers: KubeVirt's
// VirtualMachineInstanceGuestAgentInfo. Everything in it comes from the guest.
type VirtualMachineInstanceGuestAgentInfo struct {
	GAVersion         string                                 `json:"guestAgentVersion,omitempty"`
	SupportedCommands []GuestAgentCommand                    `json:"supportedCommands,omitempty"`
	Hostname          string                                 `json:"hostname,omitempty"`
	OS                core.VirtualMachineInstanceGuestOSInfo `json:"os,omitempty"`
	UserList          []GuestOSUser                          `json:"userList,omitempty"`
	FSInfo            FileSystemInfo                         `json:"fsInfo,omitempty"`
	FSFreezeStatus    string                                 `json:"fsFreezeStatus,omitempty"`
}

// GuestAgentCommand is one command the guest agent has enabled.
type GuestAgentCommand struct {
	Name    string `json:"name"`
	Enabled bool   `json:"enabled,omitempty"`
}

// FileSystemInfo holds the guest's filesystems (KubeVirt's VirtualMachineInstanceFileSystemInfo).
type FileSystemInfo struct {
	Filesystems []FileSystem `json:"disks"`
}

// VirtualMachineInstanceGuestOSUserList is what the userlist subresource answers.
type VirtualMachineInstanceGuestOSUserList struct {
	Items []GuestOSUser `json:"items"`
}

// GuestOSUser is a user logged in to the guest.
type GuestOSUser struct {
	UserName string `json:"userName"`
	Domain   string `json:"domain,omitempty"`
	// LoginTime is seconds since the epoch.
	LoginTime float64 `json:"loginTime,omitempty"`
}

// VirtualMachineInstanceFileSystemList is what the filesystemlist subresource answers.
type VirtualMachineInstanceFileSystemList struct {
	Items []FileSystem `json:"items"`
}

// FileSystem is a mounted guest filesystem (KubeVirt's VirtualMachineInstanceFileSystem).
type FileSystem struct {
	DiskName       string           `json:"diskName"`
	MountPoint     string           `json:"mountPoint"`
	FileSystemType string           `json:"fileSystemType"`
	UsedBytes      int              `json:"usedBytes"`
	TotalBytes     int              `json:"totalBytes"`
	Disk           []FileSystemDisk `json:"disk,omitempty"`
}

// FileSystemDisk is a disk under a guest filesystem.
type FileSystemDisk struct {
	Serial  string `json:"serial,omitempty"`
	BusType string `json:"busType"`
}
