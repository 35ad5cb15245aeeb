package launcher

import (
	"time"

	"github.com/qvirt/qvirt/machine"
)

// The command protocol between the node agent and a launcher: HTTP/1.1 with JSON bodies over the
// unix socket <socket-dir>/<vmi-uid>/launcher.sock. HTTP was chosen over gRPC because it needs no
// code generation, keeps the launcher's binary and memory small, and can be poked with curl
// (`curl --unix-socket launcher.sock http://launcher/v1/status`). Its version is
// machine.Protocol; the node agent asks GET /v1/info before it sends a SyncRequest.
//
//	GET    /v1/info                 -> machine.Info  the protocol versions this launcher speaks
//	POST   /v1/sync                 SyncRequest      start the VM (idempotent for the same VMI UID)
//	GET    /v1/status               -> Status        ?watch=true streams one Status per line on change
//	GET    /v1/stats                -> Stats         cumulative CPU, memory, disk and NIC counters
//	POST   /v1/pause | /v1/resume | /v1/reset | /v1/kill
//	POST   /v1/softreboot                            Ctrl+Alt+Del on the guest's keyboard; 409 when paused
//	GET    /v1/screenshot           -> image/png     the display (QMP screendump); 400 without graphics
//	POST   /v1/shutdown             ShutdownRequest  ACPI power button, quit after the grace period
//	POST   /v1/disks                machine.Disk     hot-plug a disk -> machine.Disk as attached (its port)
//	DELETE /v1/disks/{name}                          detach it (waits for the guest to let go)
//	POST   /v1/nics                 machine.NIC      hot-plug a NIC
//	DELETE /v1/nics/{name}                           detach it
//	POST   /v1/migration/target     MigrationTarget  make this (incoming) QEMU listen for the guest
//	POST   /v1/migration/source     MigrationSource  send the guest to a target
//	DELETE /v1/migration                             cancel an outgoing migration
//
// Errors are an ErrorResponse with a 4xx status for bad requests (naming the offending field) or a
// state conflict, and 5xx when QEMU fails the command.

// SyncRequest is the desired VM.
type SyncRequest struct {
	// Machine is the VM, fully resolved by the node agent. Its disks and NICs with a Port were
	// hot-plugged on a migration source: a migration target starts with exactly the source's
	// device set, each on the port it has there.
	Machine machine.Machine `json:"machine"`
	// Incoming starts QEMU waiting for a live migration instead of booting the guest.
	Incoming bool `json:"incoming,omitempty"`
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
	UID         string         `json:"uid,omitempty"`
	RunState    string         `json:"runState,omitempty"`
	Paused      bool           `json:"paused"`
	QEMUVersion string         `json:"qemuVersion,omitempty"`
	PID         int            `json:"pid,omitempty"`
	Exit        *Exit          `json:"exit,omitempty"`
	StartError  string         `json:"startError,omitempty"`
	Disks       []DiskStatus   `json:"disks,omitempty"`
	NICs        []NICStatus    `json:"nics,omitempty"`
	Migration   *MigrationInfo `json:"migration,omitempty"`
	// Hotplugged are the hot-plugged disks as attached (each with its port), in the form a
	// migration target's machine takes.
	Hotplugged []machine.Disk `json:"hotplugged,omitempty"`
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
	// Port is the pcie-root-port a hot-plugged NIC sits on, which a migration target's machine
	// repeats; "" for the others.
	Port string `json:"port,omitempty"`
}

// ShutdownRequest asks for a graceful stop.
type ShutdownRequest struct {
	// GracePeriodSeconds is how long the guest may take to power off; the machine's when nil.
	GracePeriodSeconds *int64 `json:"gracePeriodSeconds,omitempty"`
}

// MigrationTarget tells an incoming QEMU where to listen.
type MigrationTarget struct {
	// Listen is ListenUnix (a socket in the launcher's directory, for the node agent), or a host:port the
	// source can reach where port 0 picks a free port; the reply has the URI.
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

// MigrationRole is which side of a migration a launcher is.
type MigrationRole string

// Migration roles.
const (
	RoleSource MigrationRole = "source"
	RoleTarget MigrationRole = "target"
)

// MigrationInfo is the progress of the current or last migration.
type MigrationInfo struct {
	Role             MigrationRole `json:"role"`
	Status           string        `json:"status"`
	TotalBytes       int64         `json:"totalBytes,omitempty"`
	TransferredBytes int64         `json:"transferredBytes,omitempty"`
	RemainingBytes   int64         `json:"remainingBytes,omitempty"`
	ThroughputMbps   float64       `json:"throughputMbps,omitempty"`
	DowntimeMs       int64         `json:"downtimeMs,omitempty"`
	TotalTimeMs      int64         `json:"totalTimeMs,omitempty"`
	Error            string        `json:"error,omitempty"`
}

// ErrorResponse is the body of every failed request.
type ErrorResponse struct {
	Error string `json:"error"`
	// Field names the request field at fault, for 400 replies.
	Field string `json:"field,omitempty"`
}
