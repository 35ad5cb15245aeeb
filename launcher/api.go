package launcher

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// The command protocol between the node agent and a launcher: HTTP/1.1 with JSON bodies over the
// unix socket <socket-dir>/<vmi-uid>/launcher.sock. HTTP was chosen over gRPC because it needs no
// code generation, keeps the launcher's binary and memory small, and can be poked with curl
// (`curl --unix-socket launcher.sock http://launcher/v1/status`).
//
//	POST   /v1/sync                 SyncRequest      start the VM (idempotent for the same VMI UID)
//	GET    /v1/status               -> Status        ?watch=true streams one Status per line on change
//	GET    /v1/stats                -> Stats         cumulative CPU, memory, disk and NIC counters
//	POST   /v1/pause | /v1/resume | /v1/reset | /v1/kill
//	POST   /v1/softreboot                            Ctrl+Alt+Del on the guest's keyboard; 409 when paused
//	GET    /v1/screenshot           -> image/png     the display (QMP screendump); 400 without graphics
//	POST   /v1/shutdown             ShutdownRequest  ACPI power button, quit after the grace period
//	POST   /v1/volumes              VolumeHotplug    attach a spec disk and its volume -> DiskHotplug
//	DELETE /v1/volumes/{name}                        detach it (waits for the guest to let go)
//	POST   /v1/disks                DiskHotplug      attach an image file by path (migration, tests)
//	DELETE /v1/disks/{name}                          detach it (waits for the guest to let go)
//	POST   /v1/nics                 NICHotplug       attach a NIC
//	DELETE /v1/nics/{name}                           detach it
//	POST   /v1/migration/target     MigrationTarget  make this (incoming) QEMU listen for the guest
//	POST   /v1/migration/source     MigrationSource  send the guest to a target
//	DELETE /v1/migration                             cancel an outgoing migration
//
// Errors are an ErrorResponse with a 4xx status for bad requests (naming the offending field) or a
// state conflict, and 5xx when QEMU fails the command.

// SyncRequest is the desired VM.
type SyncRequest struct {
	Name      string                              `json:"name"`
	Namespace string                              `json:"namespace"`
	UID       types.UID                           `json:"uid"`
	Spec      v1alpha1.VirtualMachineInstanceSpec `json:"spec"`
	// Emulation allows TCG; without it QEMU runs with KVM or not at all.
	Emulation bool `json:"emulation,omitempty"`
	// Incoming starts QEMU waiting for a live migration instead of booting the guest.
	Incoming bool `json:"incoming,omitempty"`
	// Hotplugged are disks attached to the source while it ran; a migration target must start
	// with exactly the source's device set.
	Hotplugged []DiskHotplug `json:"hotplugged,omitempty"`
	// HotplugVolumes are hot-plugged spec disks a migration target must start with, each resolved
	// here as by POST /v1/volumes and placed on the root port it has on the source. The node agent
	// sends these, since it knows the spec and the ports (the source's volume status) but not the
	// target pod's paths. They must not be in Spec as well.
	HotplugVolumes []PlacedVolume `json:"hotplugVolumes,omitempty"`
	// HotplugNICs are NICs hot-plugged into the source that a migration target must start with,
	// each on the root port it has there (NICStatus.Port) and on the host side the node agent made
	// in the target's pod, as for POST /v1/nics. They must not be in Spec (nor their networks) or
	// Interfaces as well. A 400 names the field at fault: "hotplugNICs[0].port" (empty),
	// "hotplugNICs[0].mac", "hotplugNICs[0].dhcp.interface", ...; a port that does not exist or
	// is taken is found when QEMU's arguments are built and fails the start
	// ("machine.hotplugNICs[0].port").
	HotplugNICs []PlacedNIC `json:"hotplugNICs,omitempty"`
	// Interfaces are the guest NICs' host sides, which the node agent set up in the pod's network
	// namespace before the Sync: one per spec interface.
	Interfaces []InterfaceSetup `json:"interfaces,omitempty"`
}

// PlacedVolume is a hot-plugged spec disk and the pcie-root-port it sits on.
type PlacedVolume struct {
	VolumeHotplug
	Port string `json:"port"`
}

// PlacedNIC is a hot-plugged NIC and the pcie-root-port it sits on.
type PlacedNIC struct {
	NICHotplug
	Port string `json:"port"`
}

// InterfaceSetup is what the node agent made for one spec interface.
type InterfaceSetup struct {
	// Name is the interface's name in spec.domain.devices.interfaces.
	Name string `json:"name"`
	// Tap is the tap device QEMU opens by name.
	Tap string `json:"tap"`
	// MAC is the guest NIC's address (the spec's, else a stable one derived from the VMI).
	MAC string `json:"mac"`
	// DHCP, when set, makes the launcher hand the guest its address.
	DHCP *DHCPConfig `json:"dhcp,omitempty"`
}

// DHCPConfig is the one lease the launcher's DHCP server gives the guest NIC (see DHCPLease).
type DHCPConfig struct {
	// Interface is where the server listens: the bridge holding the guest's tap.
	Interface string       `json:"interface"`
	IP        netip.Prefix `json:"ip"`
	Gateway   netip.Addr   `json:"gateway"`
	ServerID  netip.Addr   `json:"serverID,omitzero"`
	DNS       []netip.Addr `json:"dns,omitempty"`
	Hostname  string       `json:"hostname,omitempty"`
	MTU       int          `json:"mtu,omitempty"`
}

// Phase is the launcher's view of the VM.
type Phase string

// Launcher phases; the node agent maps them to VMI phases.
const (
	PhaseWaiting   Phase = "Waiting"   // no Sync yet
	PhaseStarting  Phase = "Starting"  // QEMU starting
	PhaseRunning   Phase = "Running"   // guest running or paused
	PhaseIncoming  Phase = "Incoming"  // waiting for an incoming migration
	PhaseSucceeded Phase = "Succeeded" // QEMU ended cleanly
	PhaseFailed    Phase = "Failed"    // QEMU failed or was killed
)

// Status is what the launcher knows about its VM.
type Status struct {
	Phase       Phase          `json:"phase"`
	UID         types.UID      `json:"uid,omitempty"`
	RunState    string         `json:"runState,omitempty"`
	Paused      bool           `json:"paused"`
	QEMUVersion string         `json:"qemuVersion,omitempty"`
	PID         int            `json:"pid,omitempty"`
	Exit        *Exit          `json:"exit,omitempty"`
	StartError  string         `json:"startError,omitempty"`
	Disks       []DiskStatus   `json:"disks,omitempty"`
	NICs        []NICStatus    `json:"nics,omitempty"`
	Migration   *MigrationInfo `json:"migration,omitempty"`
	// Hotplugged repeats the hotplugged disks in the form a migration target's SyncRequest takes.
	Hotplugged []DiskHotplug `json:"hotplugged,omitempty"`
}

// DiskStatus is one attached disk.
type DiskStatus struct {
	Name       string `json:"name"`
	Hotplugged bool   `json:"hotplugged,omitempty"`
}

// NICStatus is one attached NIC.
type NICStatus struct {
	Name       string `json:"name"`
	MAC        string `json:"mac"`
	Hotplugged bool   `json:"hotplugged,omitempty"`
	// Port is the pcie-root-port a hot-plugged NIC sits on, which a migration target's
	// SyncRequest.HotplugNICs repeats; "" for the others.
	Port string `json:"port,omitempty"`
}

// ShutdownRequest asks for a graceful stop.
type ShutdownRequest struct {
	// GracePeriodSeconds is how long the guest may take to power off; the spec's
	// terminationGracePeriodSeconds when nil.
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
}

// VolumeHotplug attaches a disk of the VMI spec (spec.domain.devices.disks) with its volume
// (spec.volumes) to the running guest. The launcher resolves the volume with its own resolver, as
// at start (a hostDisk's file must exist, or is created for DiskOrCreate; an emptyDisk is created in
// its scratch directory), so the node agent sends the spec's objects, never a host path. Only
// what v1alpha1.ValidateHotplugDisk and ValidateHotplugVolume accept can be hot-plugged: a virtio
// disk on a hostDisk or emptyDisk volume. A 400 reply names the field at fault, relative to this
// request: "disk.disk.bus", "volume.hostDisk.path", "volume.name", ...
type VolumeHotplug struct {
	Disk   v1alpha1.Disk   `json:"disk"`
	Volume v1alpha1.Volume `json:"volume"`
}

// DiskHotplug attaches an image to the running guest as a virtio disk.
type DiskHotplug struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	Format   string `json:"format"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	Serial   string `json:"serial,omitempty"`
	// Port is the pcie-root-port the disk sits on; chosen by the launcher, reported back so a
	// migration target can recreate the same layout.
	Port string `json:"port,omitempty"`
	// Ephemeral marks an image the launcher created for a hot-plugged emptyDisk volume: it is
	// deleted when the disk is unplugged, so adding the volume again gives a blank disk.
	Ephemeral bool `json:"ephemeral,omitempty"`
}

// NICHotplug attaches a tap (created by the node agent) to the running guest. The node agent sets
// up the host side (tap, bridge, NAT) in the pod's network namespace first, exactly as for a
// start-time interface (InterfaceSetup). A 400 reply names the field at fault, relative to this
// request: "name" (also when the name is taken), "tap", "mac", "model", "dhcp", "dhcp.interface"
// (the DHCP port cannot be bound there); a 409 means no QEMU runs or every hotplug port is in use;
// a 500 is QEMU refusing the device.
type NICHotplug struct {
	// Name is the interface's name in spec.domain.devices.interfaces.
	Name string `json:"name"`
	// Tap is the tap device QEMU opens by name.
	Tap string `json:"tap"`
	// MAC is the guest NIC's address.
	MAC string `json:"mac"`
	// Model is virtio (the default) or e1000e.
	Model string `json:"model,omitempty"`
	// DHCP, when set, makes the launcher serve the NIC's lease, as for a start-time interface:
	// the server is listening on DHCP.Interface before the NIC appears in the guest and stops when
	// the NIC is unplugged (the DELETE returns once its socket is closed) or QEMU exits.
	DHCP *DHCPConfig `json:"dhcp,omitempty"`
}

// MigrationTarget tells an incoming QEMU where to listen.
type MigrationTarget struct {
	// Listen is a host:port the source can reach; port 0 picks a free port, reported in the reply.
	Listen string `json:"listen"`
}

// MigrationTargetReply is where the target listens.
type MigrationTargetReply struct {
	URI string `json:"uri"`
}

// MigrationSource starts an outgoing migration.
type MigrationSource struct {
	// URI is the target's tcp:host:port.
	URI string `json:"uri"`
	// BandwidthBytesPerSecond caps the transfer; QEMU's default (32 MiB/s in 7.2) when zero,
	// unlimited when negative.
	BandwidthBytesPerSecond int64 `json:"bandwidthBytesPerSecond,omitempty"`
	// DowntimeLimit is the longest pause at switch-over that QEMU plans for.
	DowntimeLimit time.Duration `json:"downtimeLimit,omitempty"`
	AutoConverge  bool          `json:"autoConverge,omitempty"`
	PostCopy      bool          `json:"postCopy,omitempty"`
}

// MigrationInfo is the progress of the current or last migration.
type MigrationInfo struct {
	Role             string  `json:"role"` // source or target
	Status           string  `json:"status"`
	TotalBytes       int64   `json:"totalBytes,omitempty"`
	TransferredBytes int64   `json:"transferredBytes,omitempty"`
	RemainingBytes   int64   `json:"remainingBytes,omitempty"`
	ThroughputMbps   float64 `json:"throughputMbps,omitempty"`
	DowntimeMs       int64   `json:"downtimeMs,omitempty"`
	TotalTimeMs      int64   `json:"totalTimeMs,omitempty"`
	Error            string  `json:"error,omitempty"`
}

// ErrorResponse is the body of every failed request.
type ErrorResponse struct {
	Error string `json:"error"`
	// Field names the request field at fault, for 400 replies.
	Field string `json:"field,omitempty"`
}
