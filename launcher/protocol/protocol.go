// Package protocol is the launcher's command protocol: the requests the node agent sends a
// launcher and what the launcher answers (status, exits, migrations, stats). Its version is
// machine.Protocol. Standard library only, plus package machine: the launcher links it and no
// Kubernetes package, and the node agent speaks it to launchers of every version it supports.
package protocol

import (
	"time"

	"github.com/qvirt/qvirt/machine"
)

// The command protocol between the node agent and a launcher: HTTP/1.1 with JSON bodies over the
// unix socket <socket-dir>/<vmi-uid>/launcher.sock. HTTP was chosen over gRPC because it needs no
// code generation, keeps the launcher's binary and memory small, and can be poked with curl
// (`curl --unix-socket launcher.sock http://launcher/v1/status`). Both ends speak it through package
// launcher/wire, a subset of HTTP/1.1 (bodies with a Content-Length, replies chunked or with one,
// a connection per call) that keeps net/http and its TLS stack out of the launcher's binary. Its
// version is machine.Protocol; the node agent asks GET /v1/info before it sends a SyncRequest.
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
//	DELETE /v1/migration                             cancel an outgoing migration (not once it holds the guest)
//	POST   /v1/migration/run        MigrationRun     target: take over the handed-over guest (HandoverHolding)
//	POST   /v1/migration/finish                      source: the target runs the guest; quit
//	POST   /v1/migration/reclaim    MigrationReclaim source: the target failed before it ran the guest; run it here again
//	POST   /v1/migration/recover    MigrationRecover target: listen again for a post-copy migration whose link broke -> MigrationTargetReply
//	POST   /v1/migration/resume     MigrationResume  source: send the rest of a post-copy migration whose link broke
//	GET    /v1/guest/ping           -> {}              guest-ping to the guest agent (the guestAgentPing probe); 409 when it is not connected
//	POST   /v1/guest/exec-probe GuestExecProbe -> GuestExecResult  the exec probe: the command runs in the guest through the agent; 409 when it is not connected
//	GET    /v1/guest/info           -> GuestAgentInfo  asks the guest agent now; 409 when it is not connected
//	GET    /v1/guest/users          -> []GuestUser
//	GET    /v1/guest/filesystems    -> []GuestFilesystem
//	GET    /v1/guest/fsfreeze       -> FSFreeze      the guest's filesystems' freeze state
//	POST   /v1/guest/fsfreeze       -> FSFreeze      freeze them (guest-fsfreeze-freeze)
//	POST   /v1/guest/fsthaw         -> FSFreeze      thaw them
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
	Phase       Phase  `json:"phase"`
	UID         string `json:"uid,omitempty"`
	RunState    string `json:"runState,omitempty"`
	Paused      bool   `json:"paused"`
	QEMUVersion string `json:"qemuVersion,omitempty"`
	PID         int    `json:"pid,omitempty"`
	Exit        *Exit  `json:"exit,omitempty"`
	StartError  string `json:"startError,omitempty"`
	// Sockets is how many sockets of vCPUs the guest has (hot-plugged ones included); 0 before
	// QEMU runs.
	Sockets uint32 `json:"sockets,omitempty"`
	// Memory is the guest's memory when the machine has memory hotplug room; nil without.
	Memory    *MemoryStatus  `json:"memory,omitempty"`
	Disks     []DiskStatus   `json:"disks,omitempty"`
	NICs      []NICStatus    `json:"nics,omitempty"`
	Migration *MigrationInfo `json:"migration,omitempty"`
	// Hotplugged are the hot-plugged disks as attached (each with its port), in the form a
	// migration target's machine takes.
	Hotplugged []machine.Disk `json:"hotplugged,omitempty"`
	// GuestAgent is what the guest agent last reported; nil when the machine has no agent channel.
	GuestAgent *GuestAgent `json:"guestAgent,omitempty"`
	// Terminated is set once the launcher's process was told to stop (SIGTERM: its pod is being
	// deleted, or the kubelet stops its container, as for a failed liveness probe) and so stops
	// the guest; Exit then says how the guest ended.
	Terminated bool `json:"terminated,omitempty"`
}

// GuestAgent is the guest agent's state as the launcher polls it. Everything in it came from the
// guest: bounded by the launcher (package launcher/guestagent), but not to be trusted.
type GuestAgent struct {
	// Connected is true while the agent answers.
	Connected bool   `json:"connected"`
	Version   string `json:"version,omitempty"`
	// OS is the guest's operating system; nil until the agent told.
	OS *GuestOSInfo `json:"os,omitempty"`
	// Interfaces are the guest's network interfaces with their addresses, as the guest sees them.
	Interfaces []GuestInterface `json:"interfaces,omitempty"`
}

// GuestOSInfo is guest-get-osinfo, with the field names of KubeVirt's
// VirtualMachineInstanceGuestOSInfo.
type GuestOSInfo struct {
	Name          string `json:"name,omitempty"`
	KernelRelease string `json:"kernelRelease,omitempty"`
	Version       string `json:"version,omitempty"`
	PrettyName    string `json:"prettyName,omitempty"`
	VersionID     string `json:"versionId,omitempty"`
	KernelVersion string `json:"kernelVersion,omitempty"`
	Machine       string `json:"machine,omitempty"`
	ID            string `json:"id,omitempty"`
}

// GuestInterface is one guest network interface.
type GuestInterface struct {
	// Name is the guest's name for it (eth0).
	Name string `json:"name"`
	// MAC is its hardware address, lower case; "" when it has none.
	MAC string `json:"mac,omitempty"`
	// IPs are its addresses without prefix length, IPv4 and IPv6, in the guest's order.
	IPs []string `json:"ips,omitempty"`
}

// GuestExecProbe is an exec probe's command, run in the guest by the guest agent (KubeVirt's
// virt-probe --command).
type GuestExecProbe struct {
	// Command is the program (searched in the guest agent's PATH) and its arguments; no shell.
	Command []string `json:"command"`
	// TimeoutSeconds bounds the command's run: one that has not exited by then fails the probe
	// (the guest agent has no way to stop it; it runs on).
	TimeoutSeconds int32 `json:"timeoutSeconds"`
}

// GuestExecResult is how the command of a GuestExecProbe exited. It came from the guest.
type GuestExecResult struct {
	// ExitCode is the command's exit status; the probe passes on 0.
	ExitCode int `json:"exitCode"`
	// Signal is the signal that ended the command, 0 when none did.
	Signal int `json:"signal,omitempty"`
	// Output is the start of the command's stdout and then stderr, valid UTF-8, bounded.
	Output string `json:"output,omitempty"`
	// Skipped says why the command was not run and the probe passes anyway (a migration target
	// waiting for the guest).
	Skipped string `json:"skipped,omitempty"`
}

// GuestAgentInfo is what GET /v1/guest/info asks the agent, in the shape of KubeVirt's
// VirtualMachineInstanceGuestAgentInfo.
type GuestAgentInfo struct {
	Version           string            `json:"guestAgentVersion,omitempty"`
	SupportedCommands []string          `json:"supportedCommands,omitempty"`
	Hostname          string            `json:"hostname,omitempty"`
	OS                GuestOSInfo       `json:"os"`
	Users             []GuestUser       `json:"userList,omitempty"`
	Filesystems       []GuestFilesystem `json:"filesystems,omitempty"`
	FSFreezeStatus    string            `json:"fsFreezeStatus,omitempty"`
}

// GuestUser is a user logged in to the guest (KubeVirt's VirtualMachineInstanceGuestOSUser).
type GuestUser struct {
	UserName string `json:"userName"`
	Domain   string `json:"domain,omitempty"`
	// LoginTime is seconds since the epoch.
	LoginTime float64 `json:"loginTime,omitempty"`
}

// GuestFilesystem is a mounted guest filesystem (KubeVirt's VirtualMachineInstanceFileSystem).
type GuestFilesystem struct {
	DiskName       string                `json:"diskName"`
	MountPoint     string                `json:"mountPoint"`
	FileSystemType string                `json:"fileSystemType"`
	UsedBytes      int64                 `json:"usedBytes"`
	TotalBytes     int64                 `json:"totalBytes"`
	Disk           []GuestFilesystemDisk `json:"disk,omitempty"`
}

// GuestFilesystemDisk is a disk under a guest filesystem.
type GuestFilesystemDisk struct {
	Serial  string `json:"serial,omitempty"`
	BusType string `json:"busType"`
}

// FSFreeze is the result of a freeze, thaw or status request.
type FSFreeze struct {
	// Status is "frozen" or "thawed", as the agent says.
	Status string `json:"status"`
	// Filesystems is how many filesystems the freeze or thaw acted on.
	Filesystems int `json:"filesystems,omitempty"`
}

// DiskStatus is one attached disk.
type DiskStatus struct {
	Name       string `json:"name"`
	Hotplugged bool   `json:"hotplugged,omitempty"`
	// BlockSize is what a disk with MatchVolumeBlockSize read from its volume's storage, which
	// a migration target's machine repeats.
	BlockSize *machine.BlockSize `json:"blockSize,omitempty"`
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

// MigrationTarget tells an incoming QEMU where to listen. A guest with local disks (see
// MigrationSource.BlockMigration) also gets them exported, writable, on the NBD socket
// launcher.Dir.NBDIn, until the guest has arrived.
type MigrationTarget struct {
	// Listen is ListenUnix (a socket in the launcher's directory, for the node agent), or a host:port the
	// source can reach where port 0 picks a free port; the reply has the URI.
	Listen string `json:"listen"`
	// Parallel must be the source's MigrationSource.Parallel: QEMU takes parallel streams only
	// when both ends set the same.
	Parallel *ParallelStreams `json:"parallel,omitempty"`
	// PostCopy must be the source's MigrationSource.PostCopy: the target then takes the guest
	// over, and runs it, as soon as the source switches to post-copy. It needs userfaultfd, which
	// QEMU opens as the launcher's user: an unprivileged launcher gets it only where the node sets
	// vm.unprivileged_userfaultfd=1, and the request fails otherwise.
	PostCopy bool `json:"postCopy,omitempty"`
	// PostCopyRecovery is how long the target waits, once the link broke after the switch to
	// post-copy (QEMU's postcopy-paused), for /v1/migration/recover and the source's resume
	// before it counts the guest lost and ends its QEMU; zero ends it at once. Only with PostCopy.
	PostCopyRecovery time.Duration `json:"postCopyRecovery,omitempty"`
}

// MigrationRecover makes a target whose post-copy migration lost its link listen for the source
// again (QEMU's migrate-recover); the reply has the URI.
type MigrationRecover struct {
	// Listen is as MigrationTarget's.
	Listen string `json:"listen"`
}

// MigrationResume sends the rest of a post-copy migration whose link broke to the target, which
// listens again (MigrationRecover) at URI.
type MigrationResume struct {
	// URI is as MigrationSource's.
	URI string `json:"uri"`
}

// ParallelStreams sends the guest's memory over Channels more connections (QEMU's multifd
// channels) beside the main one, its pages compressed with Compression.
type ParallelStreams struct {
	// Channels is 1 to MaxParallelChannels.
	Channels int `json:"channels"`
	// Compression is CompressionNone ("" too) or CompressionZstd.
	Compression string `json:"compression,omitempty"`
}

// MaxParallelChannels bounds ParallelStreams.Channels: each is a connection and a thread on
// both ends.
const MaxParallelChannels = 16

// Compressions of ParallelStreams.
const (
	CompressionNone = "none"
	CompressionZstd = "zstd"
)

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
	// PostCopy lets the migration switch to post-copy once it ran PostCopyAfter without
	// completing (KubeVirt's completion timeout with allowPostCopy): the guest then runs on the
	// target, which fetches the pages still here as it touches them. From the switch the guest is
	// the target's: the source cannot cancel it or take it back, and a failure after it loses
	// the guest. Not with BlockMigration or Parallel (QEMU 7.2 copies neither in post-copy).
	PostCopy bool `json:"postCopy,omitempty"`
	// PostCopyAfter is how long the migration runs in pre-copy before it switches (zero: as soon
	// as it is under way). Only with PostCopy.
	PostCopyAfter time.Duration `json:"postCopyAfter,omitempty"`
	// PostCopyRecovery is how long the source waits, once the link broke after the switch to
	// post-copy (QEMU's postcopy-paused), for /v1/migration/resume before it counts the guest
	// lost and ends its QEMU; zero ends it at once. Only with PostCopy.
	PostCopyRecovery time.Duration `json:"postCopyRecovery,omitempty"`
	// ProgressTimeout aborts the migration when the memory still to send has not fallen below
	// its lowest so far for this long (a guest dirtying memory faster than the link carries it);
	// zero never does.
	ProgressTimeout time.Duration `json:"progressTimeout,omitempty"`
	// BlockMigration is where the target exports the disks whose contents live on this node
	// only (emptyDisks, the writable overlays of containerDisks and ephemeral claims): the source
	// mirrors them there before it sends the guest's memory. Required when the guest has such
	// disks; a launcher that predates it refuses the request (unknown field) rather than leave
	// the target's disks blank.
	BlockMigration *BlockMigration `json:"blockMigration,omitempty"`
	// Parallel sends the memory over parallel streams; the target must have been prepared with
	// the same. The URI's endpoint then takes Channels+1 connections.
	Parallel *ParallelStreams `json:"parallel,omitempty"`
}

// BlockMigration names the NBD server of a migration target's local disks. Its exports are
// named after the disks.
type BlockMigration struct {
	// URI is unix:/ABSOLUTE/PATH: the target launcher's NBD socket (launcher.Dir.NBDIn), or the
	// node agent's tunnel to it in the source pod (launcher.Dir.NBDOut).
	URI string `json:"uri"`
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
	// DiskTotalBytes and DiskTransferredBytes are the copy of the local disks (BlockMigration)
	// on a source: what its mirrors have to copy, which grows as the guest writes, and what
	// they copied.
	DiskTotalBytes       int64 `json:"diskTotalBytes,omitempty"`
	DiskTransferredBytes int64 `json:"diskTransferredBytes,omitempty"`
	// ParallelBytes is what the parallel streams carried (source), counted as pages before
	// compression, as QEMU 7.2 counts them.
	ParallelBytes int64 `json:"parallelBytes,omitempty"`
	// Handover is where the migration's last step stands once QEMU moved the guest's whole state
	// (Status completed); "" before.
	Handover Handover `json:"handover,omitempty"`
	// GuestPaused (source) is true when the guest was not running when it was handed over (paused,
	// or started paused and never run): the target keeps it that way.
	GuestPaused bool `json:"guestPaused,omitempty"`
	// PostCopy is true once QEMU switched the migration to post-copy: the target runs the guest
	// from then on (its Handover is done at the switch), and the source can neither cancel the
	// migration nor take the guest back.
	PostCopy bool `json:"postCopy,omitempty"`
}

// Handover is the state of a migration's last step: who runs the guest. QEMU's return path makes
// the source's migration complete only once the target loaded the guest's whole state; from then
// on the guest is on both sides and runs on neither until the node agents decide.
type Handover string

// Handover states.
const (
	// HandoverHolding: the source keeps its paused copy until /v1/migration/finish (the target runs
	// the guest) or /v1/migration/reclaim (the target failed before it ran it); the target keeps its
	// loaded, paused copy until /v1/migration/run.
	HandoverHolding Handover = "holding"
	// HandoverDone: the target was told to run the guest (target), or the source quits because it
	// does (source).
	HandoverDone Handover = "done"
	// HandoverReclaimed (source): the target failed before it ran the guest, which the source runs
	// again (Status failed, Error saying why).
	HandoverReclaimed Handover = "reclaimed"
)

// MigrationRun tells a target holding the guest to take it over.
type MigrationRun struct {
	// Paused keeps the guest paused, as it was on the source (MigrationInfo.GuestPaused).
	Paused bool `json:"paused,omitempty"`
}

// MigrationReclaim tells a source holding the guest that the target failed before running it.
type MigrationReclaim struct {
	// Reason is why the target failed; the migration's Error says it.
	Reason string `json:"reason"`
}

// ErrorResponse is the body of every failed request.
type ErrorResponse struct {
	Error string `json:"error"`
	// Field names the request field at fault, for 400 replies.
	Field string `json:"field,omitempty"`
}

// ExitReason says why QEMU ended.
type ExitReason string

// Exit reasons, as reported in Status and by `qvirt-launcher run`.
const (
	// ExitGuestShutdown: the guest powered itself off (on its own or after the ACPI power button).
	ExitGuestShutdown ExitReason = "guest shutdown"
	// ExitGuestPanicked: the guest kernel panicked.
	ExitGuestPanicked ExitReason = "guest panicked"
	// ExitQuit: QEMU was told to quit (a stop whose grace period ran out, or an operator).
	ExitQuit ExitReason = "quit"
	// ExitMigrated: the guest now runs on the migration target; this QEMU is done.
	ExitMigrated ExitReason = "migrated"
	// ExitKilled: QEMU died from a signal.
	ExitKilled ExitReason = "killed"
	// ExitCrashed: QEMU exited with an error of its own.
	ExitCrashed ExitReason = "crashed"
	// ExitFailedToStart: QEMU exited before its monitor answered; Detail holds its stderr.
	ExitFailedToStart ExitReason = "failed to start"
)

// Clean reports whether the guest ended in a way that loses no data and needs no restart under
// RerunOnFailure.
func (r ExitReason) Clean() bool {
	return r == ExitGuestShutdown || r == ExitQuit || r == ExitMigrated
}

// Exit describes how QEMU ended.
type Exit struct {
	Reason ExitReason `json:"reason"`
	// Detail is QEMU's exit code or signal and, for failures, the tail of its stderr.
	Detail string    `json:"detail,omitempty"`
	At     time.Time `json:"at"`
}

// String is "reason" or "reason: detail", as Events and the termination message say it.
func (e Exit) String() string {
	if e.Detail == "" {
		return string(e.Reason)
	}
	return string(e.Reason) + ": " + e.Detail
}

// Stats is a snapshot of one VM's cumulative counters. Counters only grow while the same QEMU runs;
// they start again from zero in a new QEMU (after a restart or on a migration target).
type Stats struct {
	// Time is when the snapshot was taken.
	Time time.Time `json:"time"`
	// PID is QEMU's process id, so a consumer sees when the counters restarted.
	PID int `json:"pid"`
	// CPU is the whole QEMU process's CPU time: vCPUs plus emulator, I/O and exited threads.
	CPU CPUTime `json:"cpu"`
	// VCPUs is each vCPU thread's CPU time, by vCPU index.
	VCPUs []VCPUStats `json:"vcpus"`
	// MemoryResidentBytes is QEMU's resident set size (VmRSS): guest RAM touched so far plus
	// QEMU's own memory.
	MemoryResidentBytes int64 `json:"memoryResidentBytes"`
	// Disks are the block I/O counters of each spec and hotplugged disk, by disk name.
	Disks []DiskStats `json:"disks"`
	// Interfaces are each NIC's traffic as the guest sees it, by interface name.
	Interfaces []InterfaceStats `json:"interfaces"`
}

// CPUTime is CPU time split by mode, in nanoseconds in JSON. The kernel accounts it in clock ticks
// (USER_HZ, 100 per second on every Linux Go runs on), so the resolution is 10 ms.
type CPUTime struct {
	User   time.Duration `json:"userNs"`
	System time.Duration `json:"systemNs"`
}

// Total is user plus system time.
func (c CPUTime) Total() time.Duration { return c.User + c.System }

// VCPUStats is one vCPU's host thread's CPU time. The time a vCPU spent halted (the guest idle)
// is not counted: the thread sleeps then. Under single-threaded TCG all vCPUs share one thread,
// and each reports that thread's time.
type VCPUStats struct {
	ID       int     `json:"id"`
	ThreadID int     `json:"threadID"`
	Time     CPUTime `json:"time"`
}

// DiskStats are one disk's I/O counters from QEMU (query-blockstats): requests the guest made to
// the virtual device, whatever the host cache did with them. Times are the summed latencies of
// completed requests.
type DiskStats struct {
	Name       string        `json:"name"`
	Hotplugged bool          `json:"hotplugged,omitempty"`
	ReadBytes  int64         `json:"readBytes"`
	WriteBytes int64         `json:"writeBytes"`
	ReadOps    int64         `json:"readOps"`
	WriteOps   int64         `json:"writeOps"`
	FlushOps   int64         `json:"flushOps"`
	ReadTime   time.Duration `json:"readTimeNs"`
	WriteTime  time.Duration `json:"writeTimeNs"`
	FlushTime  time.Duration `json:"flushTimeNs"`
}

// InterfaceStats is one NIC's traffic from the guest's point of view. It is read from the host
// side of the NIC, its tap, whose directions are the guest's swapped: what the tap transmits the
// guest receives.
type InterfaceStats struct {
	Name       string `json:"name"`
	Tap        string `json:"tap"`
	Hotplugged bool   `json:"hotplugged,omitempty"`
	RxBytes    uint64 `json:"rxBytes"`
	RxPackets  uint64 `json:"rxPackets"`
	RxErrors   uint64 `json:"rxErrors"`
	RxDropped  uint64 `json:"rxDropped"`
	TxBytes    uint64 `json:"txBytes"`
	TxPackets  uint64 `json:"txPackets"`
	TxErrors   uint64 `json:"txErrors"`
	TxDropped  uint64 `json:"txDropped"`
}

// CPURequest is PUT /v1/cpu's body: the sockets of vCPUs the guest should have.
type CPURequest struct {
	Sockets uint32 `json:"sockets"`
}

// MemoryRequest is PUT /v1/memory's body: the memory the guest should have, boot RAM included.
type MemoryRequest struct {
	GuestMiB int64 `json:"guestMiB"`
}

// MemoryStatus is the guest's memory under memory hotplug, each figure boot RAM included:
// KubeVirt's status.memory (guestAtBoot, guestRequested, guestCurrent).
type MemoryStatus struct {
	BootMiB      int64 `json:"bootMiB"`
	RequestedMiB int64 `json:"requestedMiB"`
	PluggedMiB   int64 `json:"pluggedMiB"`
}
