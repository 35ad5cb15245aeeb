// Package machine is the contract between the node agent and qvirt-launcher: a fully resolved
// description of one virtual machine, which the launcher turns into QEMU's command line and QMP
// commands without re-deciding anything the VMI spec left open. The node agent makes every spec
// decision once (handler/translate): defaults, MAC addresses, the grace period, CPU model, memory
// size, NIC models. The launcher checks only the description's own invariants (names unique, ports
// exist, paths absolute) and the host facts it alone can see (image files, the pod's filesystem).
//
// Standard library only: the launcher links no Kubernetes package, and a new API field is not a
// wire change until the translation maps it here.
package machine

import "net/netip"

// Protocol is the version of the launcher protocol this package describes. A launcher lists the
// versions it speaks in Info (GET /v1/info); a launcher that has no /v1/info speaks ProtocolLegacy,
// whose sync request carried the VMI spec itself. Version 3 ends a live migration with a handover
// (launcher/switchover.go): the source holds its paused copy and the target does not run the guest
// until the node agents say which side keeps it; a version 2 source quit and a version 2 target ran
// the guest on their own.
const (
	Protocol       = "3"
	ProtocolLegacy = "1"
)

// Info is a launcher's answer to GET /v1/info.
type Info struct {
	// Protocols are the protocol versions the launcher speaks.
	Protocols []string `json:"protocols"`
}

// Accel is the accelerator QEMU runs the guest with.
type Accel string

const (
	AccelKVM Accel = "kvm"
	// AccelTCG is emulation, allowed only when the cluster says so (useEmulation).
	AccelTCG Accel = "tcg"
)

// TCGTranslationBufferMiB bounds QEMU's translation cache under emulation (-accel tcg,tb-size):
// QEMU's default, 1 GiB, is reserved and filled as the guest runs new code (about 60 MiB by the
// end of a Linux boot), so QEMU's memory grew past a pod overhead sized for KVM. Full, the cache is
// flushed and code translated again. EmulationOverheadMiB is what emulation adds to QEMU's memory
// with this bound (the cache and its index, measured at 1.25 times its size, and room), which the
// launcher pod's memory overhead counts under emulation.
const (
	TCGTranslationBufferMiB = 32
	EmulationOverheadMiB    = 48
)

// Machine is one VM, resolved.
type Machine struct {
	// Name, Namespace and UID identify the VMI (QEMU's -name, the launcher's checks).
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	UID       string `json:"uid"`
	// UUID is the SMBIOS system UUID the guest sees.
	UUID string `json:"uuid"`
	// SMBIOSSerial is the SMBIOS system serial number; none when empty.
	SMBIOSSerial string `json:"smbiosSerial,omitempty"`
	// Type is QEMU's machine type ("q35").
	Type  string `json:"type"`
	Accel Accel  `json:"accel"`
	// NoACPI turns the machine's ACPI off.
	NoACPI bool `json:"noACPI,omitempty"`
	// SMM turns System Management Mode on (true) or off (false); QEMU's default when nil.
	SMM *bool `json:"smm,omitempty"`
	// Firmware is what the guest runs before its operating system; SeaBIOS when zero.
	Firmware Firmware `json:"firmware,omitzero"`
	CPU      CPU      `json:"cpu"`
	// Clock is the RTC and the timers.
	Clock Clock `json:"clock,omitzero"`
	// MemoryMiB is the guest's RAM.
	MemoryMiB int64 `json:"memoryMiB"`
	// HugePageKiB backs the guest's RAM with huge pages of this size (2048 or 1048576) from the
	// host's pool; ordinary pages when 0. MemoryMiB must be a whole number of them.
	HugePageKiB int64 `json:"hugePageKiB,omitempty"`
	// MaxMemoryMiB is the most RAM memory hotplug may give the guest: beyond MemoryMiB, QEMU
	// gets a virtio-mem device of MaxMemoryMiB-MemoryMiB, in MemoryBlockMiB blocks, which the
	// launcher plugs on request (SetGuestMemory). No hotplug room when 0 or MemoryMiB.
	MaxMemoryMiB int64 `json:"maxMemoryMiB,omitempty"`
	// PluggedMemoryMiB is what that device gives the guest from the start: a migration target's
	// is the source's. At most MaxMemoryMiB-MemoryMiB.
	PluggedMemoryMiB int64 `json:"pluggedMemoryMiB,omitempty"`
	// Kernel boots a kernel and initrd from an image instead of the firmware's boot order.
	Kernel *KernelBoot `json:"kernel,omitempty"`
	// SerialConsole attaches ttyS0 to the serial socket; Graphics attaches a VGA on the VNC socket.
	SerialConsole bool `json:"serialConsole,omitempty"`
	Graphics      bool `json:"graphics,omitempty"`
	// DownwardMetrics serves the guest metrics of its node and of itself on the virtio-serial port
	// org.github.vhostmd.1 (vhostmd's protocol); none when nil.
	DownwardMetrics *DownwardMetrics `json:"downwardMetrics,omitempty"`
	// VirtioTransitional gives the cold-plugged virtio devices that have one QEMU's transitional
	// model (virtio 0.9 and 1.0), as conventional PCI devices on pcie.0.
	VirtioTransitional bool `json:"virtioTransitional,omitempty"`
	// NoHotplug leaves the machine without spare root ports: nothing can be hot-plugged.
	NoHotplug bool `json:"noHotplug,omitempty"`
	// Video is the graphics device's model: VideoVGA when empty.
	Video string `json:"video,omitempty"`
	// IOThreads are the I/O threads the disks name, by id; each id starts with IOThreadPrefix.
	IOThreads []string `json:"ioThreads,omitempty"`
	// Disks in the guest's order; those with a Port were hot-plugged (a migration target starts
	// with them on the ports they had on the source).
	Disks []Disk `json:"disks,omitempty"`
	// NICs in the guest's order; those with a Port were hot-plugged, as Disks.
	NICs []NIC `json:"nics,omitempty"`
	// RNG gives the guest a virtio entropy device fed from the host's /dev/urandom.
	RNG bool `json:"rng,omitempty"`
	// MemBalloon gives the guest a virtio memory balloon with free page reporting: the pages the
	// guest frees go back to the host.
	MemBalloon bool `json:"memBalloon,omitempty"`
	// Sound is the guest's sound card; its output goes nowhere (QEMU's "none" audio backend).
	Sound *Sound `json:"sound,omitempty"`
	// TPM gives the guest a TPM 2.0 (a TIS interface) emulated by a swtpm the launcher runs. Its
	// state lives as long as the QEMU (a new start gets a new, empty TPM) unless State keeps it.
	TPM bool `json:"tpm,omitempty"`
	// State keeps the TPM's state or the EFI variable store across instances, in a directory
	// that outlives them; nil: they last as long as the QEMU.
	State *State `json:"state,omitempty"`
	// GuestAgent adds the virtio-serial channel org.qemu.guest_agent.0, on which a guest's
	// qemu-ga answers the launcher. The node agent sets it for every VMI, as KubeVirt does.
	GuestAgent bool `json:"guestAgent,omitempty"`
	// Inputs are the guest's input devices, in order.
	Inputs []Input `json:"inputs,omitempty"`
	// USBRedirSlots is how many USB devices a client can redirect into the guest at once (QEMU's
	// usb-redir devices, each fed from a socket of the launcher's; KubeVirt's clientPassthrough),
	// at most MaxUSBRedirSlots; none when 0.
	USBRedirSlots int `json:"usbRedirSlots,omitempty"`
	// Watchdog is the guest's hardware watchdog; none when nil.
	Watchdog *Watchdog `json:"watchdog,omitempty"`
	// Panic are the devices through which the guest reports a kernel panic (PanicISA, PanicPCI);
	// with any, QEMU ends when the guest panics (its default action, which the launcher states).
	// Hyper-V's crash MSRs are CPU.HyperV.Crash.
	Panic []string `json:"panic,omitempty"`
	// Filesystems are directories of the launcher's pod shared with the guest by virtio-fs, each
	// served by a virtiofsd the launcher runs. With any, the guest's RAM is shared memory (a memfd)
	// that the daemons map.
	Filesystems []Filesystem `json:"filesystems,omitempty"`
	// StartPaused leaves QEMU in prelaunch until a resume (startStrategy Paused).
	StartPaused bool `json:"startPaused,omitempty"`
	// GracePeriodSeconds is how long a graceful shutdown may take before QEMU is ended.
	GracePeriodSeconds int64 `json:"gracePeriodSeconds"`
	// Notes are what the node agent left out of the spec for this node, each with its reason
	// (Hyper-V enlightenments under emulation). Not sent to the launcher: the node agent reports
	// them as an event.
	Notes []string `json:"-"`
}

// Firmware is the guest's firmware: SeaBIOS, or OVMF (UEFI) when EFI is set.
type Firmware struct {
	// EFI boots OVMF. Its variables (NVRAM) are the launcher's own copy of the build's template,
	// kept as long as the launcher runs the machine.
	EFI *EFI `json:"efi,omitempty"`
	// SerialBIOS shows SeaBIOS's output on the serial console too (KubeVirt's bios.useSerial).
	SerialBIOS bool `json:"serialBIOS,omitempty"`
}

// EFI is OVMF.
type EFI struct {
	// SecureBoot runs OVMF's Secure Boot build with Microsoft's keys enrolled; it needs SMM.
	SecureBoot bool `json:"secureBoot,omitempty"`
}

// CPU is the guest's processor.
type CPU struct {
	// Model is QEMU's -cpu model ("host" needs KVM).
	Model   string `json:"model"`
	VCPUs   uint32 `json:"vcpus"`
	Sockets uint32 `json:"sockets"`
	Cores   uint32 `json:"cores"`
	Threads uint32 `json:"threads"`
	// MaxSockets is the most sockets vCPU hotplug may reach (QEMU's maxcpus is that many sockets
	// of Cores and Threads); 0 for Sockets, no hotplug.
	MaxSockets uint32 `json:"maxSockets,omitempty"`
	// PVEOI turns on KVM's paravirtual end-of-interrupt (kvm-pv-eoi); QEMU's default otherwise.
	PVEOI bool `json:"pvEOI,omitempty"`
	// KVMHidden hides KVM's CPUID signature (kvm=off).
	KVMHidden bool `json:"kvmHidden,omitempty"`
	// PVUnhalt turns KVM's paravirtual spinlocks (kvm-pv-unhalt) on or off; QEMU's default when nil.
	PVUnhalt *bool `json:"pvUnhalt,omitempty"`
	// KVMClock shows (true) or hides (false) the KVM clock (kvmclock); QEMU's default when nil.
	KVMClock *bool `json:"kvmClock,omitempty"`
	// HyperV are the Hyper-V enlightenments; none when nil. They need KVM.
	HyperV *HyperV `json:"hyperV,omitempty"`
	// Features turn CPU features on or off beyond the model's, each by its policy.
	Features []CPUFeature `json:"features,omitempty"`
	// DedicatedCPUs pins each vCPU thread to one CPU of those the launcher may run on (the CPUs
	// the kubelet's CPU manager gave its container), in order: vCPU i to the i-th. The start
	// fails when there are fewer CPUs than the pinning needs.
	DedicatedCPUs bool `json:"dedicatedCPUs,omitempty"`
	// IsolateEmulatorThread pins QEMU's other threads to the CPU after the vCPUs' (one more is
	// needed); without it they share the vCPUs' CPUs. Only with DedicatedCPUs.
	IsolateEmulatorThread bool `json:"isolateEmulatorThread,omitempty"`
	// NUMAPassthrough gives the guest the NUMA layout of the host CPUs its vCPUs are pinned to
	// (KubeVirt's guestMappingPassthrough). Only with DedicatedCPUs and huge pages.
	NUMAPassthrough bool `json:"numaPassthrough,omitempty"`
	// RealtimeVCPUs are the vCPUs whose threads run real-time (SCHED_FIFO, priority 1), which the
	// node agent sets once QEMU runs; the launcher turns the PMU off for them. Only with
	// DedicatedCPUs: a real-time thread on a CPU it shares would starve the others there.
	RealtimeVCPUs []uint32 `json:"realtimeVCPUs,omitempty"`
}

// CPU feature policies, as KubeVirt's and libvirt's: force, require and optional turn the feature
// on (require fails the start when the guest does not get it), disable and forbid turn it off
// (forbid fails the start when the host has it).
const (
	CPUFeatureForce    = "force"
	CPUFeatureRequire  = "require"
	CPUFeatureOptional = "optional"
	CPUFeatureDisable  = "disable"
	CPUFeatureForbid   = "forbid"
)

// CPUFeature is one CPU feature (QEMU's property name, such as vmx or sse4.2) and its policy.
type CPUFeature struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
}

// HyperV are the Hyper-V enlightenments, each QEMU's hv-* CPU flag of the same name
// (docs/system/i386/hyperv.rst in QEMU). QEMU checks their dependencies itself under KVM.
type HyperV struct {
	// Passthrough is hv-passthrough: every enlightenment the host's KVM offers; it excludes the
	// others.
	Passthrough     bool `json:"passthrough,omitempty"`
	Relaxed         bool `json:"relaxed,omitempty"`
	VAPIC           bool `json:"vapic,omitempty"`
	VPIndex         bool `json:"vpindex,omitempty"`
	Runtime         bool `json:"runtime,omitempty"`
	SyNIC           bool `json:"synic,omitempty"`
	STimer          bool `json:"stimer,omitempty"`
	STimerDirect    bool `json:"stimerDirect,omitempty"`
	Reset           bool `json:"reset,omitempty"`
	Frequencies     bool `json:"frequencies,omitempty"`
	Reenlightenment bool `json:"reenlightenment,omitempty"`
	TLBFlush        bool `json:"tlbflush,omitempty"`
	TLBFlushDirect  bool `json:"tlbflushDirect,omitempty"`
	TLBFlushExt     bool `json:"tlbflushExt,omitempty"`
	IPI             bool `json:"ipi,omitempty"`
	// Crash is hv-crash, the crash MSRs through which a Windows guest reports a panic.
	Crash bool `json:"crash,omitempty"`
	// EVMCS is hv-evmcs with the vmx CPU feature it serves.
	EVMCS bool `json:"evmcs,omitempty"`
	// Time is hv-time, the Hyper-V reference clock.
	Time bool `json:"time,omitempty"`
	// Spinlocks is hv-spinlocks, the retry count (at least 0xfff); not set when 0.
	Spinlocks uint32 `json:"spinlocks,omitempty"`
	// VendorID is hv-vendor-id, up to 12 printable ASCII characters; not set when empty.
	VendorID string `json:"vendorID,omitempty"`
}

// Clock is the guest's RTC and timers; QEMU's defaults when zero.
type Clock struct {
	// RTCOffsetSeconds starts the RTC this far from UTC (a clock.utc offset, or a time zone's
	// offset when the node agent described the machine); UTC when 0.
	RTCOffsetSeconds int64 `json:"rtcOffsetSeconds,omitempty"`
	// RTCClock is what the RTC follows: RTCClockVM (stops while the guest is paused) or
	// RTCClockHost; QEMU's default (host) when empty.
	RTCClock RTCClock `json:"rtcClock,omitempty"`
	// RTCCatchUp delivers the RTC's late ticks faster until the guest has caught up
	// (driftfix=slew).
	RTCCatchUp bool `json:"rtcCatchUp,omitempty"`
	// PITLostTicks is KVM's in-kernel PIT's lost-tick policy; QEMU's default when empty.
	PITLostTicks LostTickPolicy `json:"pitLostTicks,omitempty"`
	// NoPIT leaves the i8254 PIT out; NoHPET leaves the HPET out.
	NoPIT  bool `json:"noPIT,omitempty"`
	NoHPET bool `json:"noHPET,omitempty"`
}

// RTCClock is the clock the RTC follows (QEMU's -rtc clock=).
type RTCClock string

const (
	RTCClockVM   RTCClock = "vm"
	RTCClockHost RTCClock = "host"
)

// LostTickPolicy is QEMU's lost_tick_policy property.
type LostTickPolicy string

const (
	LostTickDelay   LostTickPolicy = "delay"
	LostTickSlew    LostTickPolicy = "slew"
	LostTickDiscard LostTickPolicy = "discard"
)

// KernelBoot is a kernel (and initrd) taken from a container image.
type KernelBoot struct {
	Image ImageRef `json:"image"`
	// KernelPath and InitrdPath are paths inside the image; InitrdPath is optional.
	KernelPath string `json:"kernelPath"`
	InitrdPath string `json:"initrdPath,omitempty"`
	Args       string `json:"args,omitempty"`
}

// ImageRef is a container image the launcher's side reads files from.
type ImageRef struct {
	// Ref is an image reference, or file:///dir for an image already unpacked at dir.
	Ref        string `json:"ref"`
	PullPolicy string `json:"pullPolicy,omitempty"` // Always, IfNotPresent or Never
	PullSecret string `json:"pullSecret,omitempty"`
}

// Bus is where a disk is attached.
type Bus string

const (
	BusVirtio Bus = "virtio"
	BusSATA   Bus = "sata"
	BusSCSI   Bus = "scsi"
)

// Cache is the host page cache mode of a disk.
type Cache string

const (
	CacheNone         Cache = "none"
	CacheWriteThrough Cache = "writethrough"
	CacheWriteBack    Cache = "writeback"
)

// IO is a disk's I/O mode.
type IO string

const (
	IOThreads IO = "threads"
	IONative  IO = "native"
)

// IOThreadPrefix starts every I/O thread's id: the ids share QEMU's object namespace with the
// launcher's own objects.
const IOThreadPrefix = "iothread-"

// Disk is one disk or cdrom and the image behind it.
type Disk struct {
	Name  string `json:"name"`
	Bus   Bus    `json:"bus"`
	CDROM bool   `json:"cdrom,omitempty"`
	// LUN passes the source's block device through as a SCSI LUN (QEMU's scsi-block): the guest
	// sends it SCSI commands. It takes the scsi bus and a block-mode claim.
	LUN      bool   `json:"lun,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	Serial   string `json:"serial,omitempty"`
	// BootIndex is the disk's place in the boot order; a machine where any disk has one tries
	// only those.
	BootIndex *uint32 `json:"bootIndex,omitempty"`
	Cache     Cache   `json:"cache"`
	IO        IO      `json:"io"`
	Source    Source  `json:"source"`
	// Port is the spare root port of a hot-plugged disk; "" for a cold-plugged one.
	Port string `json:"port,omitempty"`
	// Queues is a virtio disk's number of request queues; QEMU's default when 0.
	Queues uint32 `json:"queues,omitempty"`
	// Shareable lets other QEMUs open the image at the same time (no write lock).
	Shareable bool `json:"shareable,omitempty"`
	// IOThread is one of the machine's IOThreads that serves a virtio disk; QEMU's main loop
	// when "".
	IOThread string `json:"ioThread,omitempty"`
	// BlockSize is the block sizes the guest sees; QEMU's (512 bytes) when nil.
	BlockSize *BlockSize `json:"blockSize,omitempty"`
	// MatchVolumeBlockSize takes BlockSize from the storage of the disk's image when BlockSize is
	// nil: the launcher reads it when it starts the machine or hot-plugs the disk, and reports
	// it. A migration target gets the source's in BlockSize instead: the guest's disk must not
	// change under it.
	MatchVolumeBlockSize bool `json:"matchVolumeBlockSize,omitempty"`
}

// State is the VM's persistent state: what of it lives in Dir (absolute, writable by the
// launcher; the backend-storage claim the launcher pod mounts).
type State struct {
	Dir string `json:"dir"`
	// EFIVars keeps the EFI variable store in Dir (EFIVarsFile), made from the firmware's template
	// when it is not there yet.
	EFIVars bool `json:"efiVars,omitempty"`
	// TPM keeps the TPM's state in Dir (TPMStateDir).
	TPM bool `json:"tpm,omitempty"`
}

// Where in State.Dir the state lives.
const (
	EFIVarsFile = "efi-vars.fd"
	TPMStateDir = "tpm"
)

// BlockSize is a disk's block sizes in bytes: powers of two from 512 to 2 MiB, Logical at most
// Physical; DiscardGranularity, a multiple of Logical, is QEMU's default when 0.
type BlockSize struct {
	Logical            uint32 `json:"logical"`
	Physical           uint32 `json:"physical"`
	DiscardGranularity uint32 `json:"discardGranularity,omitempty"`
}

// Source is where a disk's image comes from; exactly one field is set.
type Source struct {
	HostFile  *HostFile  `json:"hostFile,omitempty"`
	Container *Container `json:"container,omitempty"`
	Empty     *Empty     `json:"empty,omitempty"`
	CloudInit *CloudInit `json:"cloudInit,omitempty"`
	Claim     *Claim     `json:"claim,omitempty"`
	Config    *Config    `json:"config,omitempty"`
}

// Config is a config volume (KubeVirt's secret, configMap, serviceAccount and downwardAPI
// volumes): the launcher writes the files its pod mounts for the disk (podlayout.ConfigVolumeMount)
// into a read-only ISO 9660 image in its own directory when the VM starts, as KubeVirt's
// virt-launcher does. The node agent never reads the files.
type Config struct {
	// Kind is the volume's source, for messages: secret, configMap, serviceAccount or downwardAPI.
	Kind string `json:"kind"`
	// Label is the image's volume label.
	Label string `json:"label"`
}

// HostFile is an image file the launcher can see (a hostDisk's path in the pod).
type HostFile struct {
	Path string `json:"path"`
	// Format is raw or qcow2, never probed.
	Format string `json:"format"`
	// CreateBytes, when positive, creates a sparse raw file of that size if none exists.
	CreateBytes int64 `json:"createBytes,omitempty"`
	// Root, when set, is the directory Path must stay within once its links are resolved: a
	// hostDisk's namespace directory as the launcher pod mounts it, so a link planted there cannot
	// lead QEMU to another tenant's image.
	Root string `json:"root,omitempty"`
}

// FilesystemOverhead is the share of a filesystem-mode claim's capacity kept free for the
// filesystem's own needs: disk.img is created at the capacity less this (KubeVirt's and CDI's
// default, 5.5%).
const FilesystemOverhead = 0.055

// ClaimImageBytes is the size of the disk.img created in a filesystem-mode claim of capacity bytes:
// the capacity less FilesystemOverhead (rounded up), aligned down to a MiB. Zero or less when the
// claim is too small to hold one.
func ClaimImageBytes(capacity int64) int64 {
	const mib = 1 << 20
	overhead := capacity/1000*55 + (capacity%1000*55+999)/1000
	return (capacity - overhead) / mib * mib
}

// ClaimImage is the file name of a filesystem-mode claim's disk image in its volume, as in KubeVirt.
const ClaimImage = "disk.img"

// Claim is a PersistentVolumeClaim's volume as the launcher pod holds it (KubeVirt's
// persistentVolumeClaim and ephemeral volumes). Exactly one of Dir and Device is set.
type Claim struct {
	// Name is the claim's name, for messages.
	Name string `json:"name"`
	// Dir is a filesystem-mode claim's mount in the pod: the disk is the raw image Dir/disk.img,
	// created sparse at ImageBytes when absent.
	Dir string `json:"dir,omitempty"`
	// Device is a block-mode claim's device node in the pod, attached raw.
	Device string `json:"device,omitempty"`
	// ImageBytes is the size of a disk.img created for a filesystem-mode claim: its capacity less
	// FilesystemOverhead.
	ImageBytes int64 `json:"imageBytes,omitempty"`
	// Overlay attaches the claim read-only under a qcow2 overlay in the launcher's scratch
	// directory that goes with the VM (an ephemeral volume): the claim is never written.
	Overlay bool `json:"overlay,omitempty"`
}

// Container is a disk image inside a container image (KubeVirt's containerDisk). The image itself
// is never written: a disk that is not ReadOnly (nor a cdrom) gets a qcow2 overlay the launcher
// creates over it, which takes the guest's writes and goes with the VM.
type Container struct {
	Image ImageRef `json:"image"`
	// Path is the image file inside the image; the one file under /disk when empty.
	Path string `json:"path,omitempty"`
}

// Empty is a blank scratch disk the launcher creates, gone with the VM.
type Empty struct {
	CapacityBytes int64 `json:"capacityBytes"`
}

// CloudInitDataSource is the cloud-init data source a CloudInit image is laid out for.
type CloudInitDataSource string

const (
	// CloudInitNoCloud: an ISO 9660 image labelled cidata holding user-data, meta-data and
	// network-config.
	CloudInitNoCloud CloudInitDataSource = "noCloud"
	// CloudInitConfigDrive: an ISO 9660 image labelled config-2 holding
	// openstack/latest/{meta_data.json,user_data,network_data.json}.
	CloudInitConfigDrive CloudInitDataSource = "configDrive"
)

// CloudInit is a cloud-init data source the launcher writes as a small read-only ISO 9660 image in
// its own directory when the VM starts. The node agent decides the meta-data; user and network data
// are inline or, when they come from a Secret, read by the launcher from the Secret volume its pod
// mounts for the disk (podlayout.CloudInitSecretMount): the node agent never reads Secrets.
type CloudInit struct {
	DataSource CloudInitDataSource `json:"dataSource"`
	// InstanceID is meta-data's instance-id: cloud-init runs its once-per-instance modules again
	// when it changes.
	InstanceID string `json:"instanceID"`
	// Hostname is the guest's hostname (NoCloud's local-hostname, ConfigDrive's hostname).
	Hostname string `json:"hostname,omitempty"`
	// UUID is ConfigDrive's uuid.
	UUID        string        `json:"uuid,omitempty"`
	UserData    CloudInitData `json:"userData,omitzero"`
	NetworkData CloudInitData `json:"networkData,omitzero"`
}

// CloudInitData is user or network data: inline, from the pod's Secret volume, or none when
// neither is set.
type CloudInitData struct {
	Inline string `json:"inline,omitempty"`
	// FromSecret reads it from the pod's Secret volume for this disk: the key userdata (else
	// userData) for user data, networkdata (else networkData) for network data, as in KubeVirt.
	FromSecret bool `json:"fromSecret,omitempty"`
}

// NICModel is the guest NIC's device model.
type NICModel string

const (
	NICVirtio  NICModel = "virtio"
	NICE1000   NICModel = "e1000"
	NICE1000E  NICModel = "e1000e"
	NICRTL8139 NICModel = "rtl8139"
)

// NIC is one guest NIC and the host side the node agent made for it in the pod's network namespace.
type NIC struct {
	Name string `json:"name"`
	// Tap is the tap device QEMU opens by name; "" with Passt or Slirp.
	Tap string `json:"tap"`
	// Passt, when set, connects the NIC to a passt process the launcher runs in its own network
	// namespace instead of a tap: user-mode networking that gives the guest the pod's address.
	Passt *Passt `json:"passt,omitempty"`
	// Slirp, when set, connects the NIC to QEMU's own user-mode network stack (libslirp) in the
	// launcher's network namespace instead of a tap: the guest gets a private address behind it.
	Slirp *Slirp   `json:"slirp,omitempty"`
	MAC   string   `json:"mac"`
	Model NICModel `json:"model"`
	// DHCP, when set, makes the launcher hand the guest its address.
	DHCP *DHCP `json:"dhcp,omitempty"`
	// Port is the spare root port of a hot-plugged NIC; "" for a cold-plugged one.
	Port string `json:"port,omitempty"`
	// Queues is the queue pairs of a virtio NIC on a multi-queue Tap (one per vCPU); 0 for one
	// queue on a single-queue tap.
	Queues uint32 `json:"queues,omitempty"`
}

// Passt is what a passt-backed NIC's passt forwards from the pod to the guest: the listed ports,
// or every port when both lists are empty. passt serves the guest's DHCP itself.
type Passt struct {
	// Interface is the pod's interface whose address, routes and name servers the guest gets.
	Interface string  `json:"interface"`
	TCPPorts  []int32 `json:"tcpPorts,omitempty"`
	UDPPorts  []int32 `json:"udpPorts,omitempty"`
}

// Slirp is what a slirp NIC forwards from the pod's addresses to the guest: the listed ports (none
// when both lists are empty, as KubeVirt's slirp binding). QEMU's stack gives the guest
// 10.0.2.15/24 by DHCP, with 10.0.2.2 as its router and 10.0.2.3 as its name server, which
// answers from the pod's resolv.conf.
type Slirp struct {
	TCPPorts []int32 `json:"tcpPorts,omitempty"`
	UDPPorts []int32 `json:"udpPorts,omitempty"`
}

// DHCP is the one lease the launcher's DHCP server gives a guest NIC.
type DHCP struct {
	// Interface is where the server listens: the bridge holding the guest's tap.
	Interface string       `json:"interface"`
	IP        netip.Prefix `json:"ip"`
	Gateway   netip.Addr   `json:"gateway"`
	ServerID  netip.Addr   `json:"serverID,omitzero"`
	DNS       []netip.Addr `json:"dns,omitempty"`
	Hostname  string       `json:"hostname,omitempty"`
	MTU       int          `json:"mtu,omitempty"`
}

// InputBus is where an input device is attached.
type InputBus string

const (
	// InputUSB is a USB device on the machine's xHCI controller.
	InputUSB InputBus = "usb"
	// InputVirtio is a virtio-input PCI device.
	InputVirtio InputBus = "virtio"
)

// InputType is the kind of input device.
type InputType string

// InputTablet is an absolute pointing device.
const InputTablet InputType = "tablet"

// Input is one input device.
type Input struct {
	Name string    `json:"name"`
	Bus  InputBus  `json:"bus"`
	Type InputType `json:"type"`
}

// WatchdogAction is what QEMU does when the guest's watchdog expires (its -action watchdog=).
type WatchdogAction string

const (
	// WatchdogPoweroff ends the VM as if its power were cut.
	WatchdogPoweroff WatchdogAction = "poweroff"
	// WatchdogReset resets the guest.
	WatchdogReset WatchdogAction = "reset"
	// WatchdogShutdown presses the ACPI power button.
	WatchdogShutdown WatchdogAction = "shutdown"
)

// DownwardMetrics is what the downward metrics port reports beyond what the launcher measures.
type DownwardMetrics struct {
	// NodeName is the node the instance runs on (the HostName metric).
	NodeName string `json:"nodeName"`
}

// Panic devices: QEMU's pvpanic on the ISA bus (I/O port 0x505) and on PCI.
const (
	PanicISA = "isa"
	PanicPCI = "pci"
)

// WatchdogI6300ESB is the Intel 6300ESB watchdog, the only model.
const WatchdogI6300ESB = "i6300esb"

// Watchdog is the guest's hardware watchdog.
// Video models: the standard VGA, virtio-gpu with VGA, Bochs' display (no legacy VGA), a Cirrus
// CLGD 5446, or a RAM framebuffer (no PCI device).
const (
	VideoVGA    = "vga"
	VideoVirtio = "virtio"
	VideoBochs  = "bochs"
	VideoCirrus = "cirrus"
	VideoRamfb  = "ramfb"
)

// Sound card models: Intel HD Audio (ICH9) with a duplex codec, or an AC97.
const (
	SoundICH9 = "ich9"
	SoundAC97 = "ac97"
)

// Sound is a sound card.
type Sound struct {
	Name  string `json:"name"`
	Model string `json:"model"`
}

type Watchdog struct {
	Name   string         `json:"name"`
	Model  string         `json:"model"`
	Action WatchdogAction `json:"action"`
}

// Disk returns the disk named name, or nil.
func (m *Machine) Disk(name string) *Disk {
	for i := range m.Disks {
		if m.Disks[i].Name == name {
			return &m.Disks[i]
		}
	}
	return nil
}

// NIC returns the NIC named name, or nil.
func (m *Machine) NIC(name string) *NIC {
	for i := range m.NICs {
		if m.NICs[i].Name == name {
			return &m.NICs[i]
		}
	}
	return nil
}

// Filesystem is a directory shared with the guest by virtio-fs (KubeVirt's filesystems with
// virtiofs).
type Filesystem struct {
	// Name is the virtio-fs tag the guest mounts (at most 36 bytes, the device's tag field).
	Name string `json:"name"`
	// Kind is the volume's source, for messages: persistentVolumeClaim, configMap, secret,
	// serviceAccount or downwardAPI.
	Kind string `json:"kind"`
	// Dir is the shared directory in the launcher's pod: a claim's mount
	// (podlayout.ClaimMount) or a config volume's (podlayout.ConfigVolumeMount).
	// Config volumes and claims attached read-only are mounted read-only in the pod, so the
	// guest's writes to them fail there.
	Dir string `json:"dir"`
}

// MaxUSBRedirSlots is how many USB redirection slots a machine has at most, and what KubeVirt
// gives every instance with clientPassthrough (v1.UsbClientPassthroughMaxNumberOf).
const MaxUSBRedirSlots = 4

// HugePagesTCGMigration is why huge page RAM does not live-migrate under emulation (TCG), said by
// the launcher that refuses it and by the controller that marks such an instance not migratable.
const HugePagesTCGMigration = "QEMU 7.2 loses guest writes migrating RAM of whole 256 KiB blocks under TCG (fixed in QEMU 9.0), " +
	"and huge pages cannot be padded out of that; it migrates under KVM"

// MemoryBlockMiB is the virtio-mem block size: the unit memory is plugged in, and what the guest
// memory and its hotplug room must be whole multiples of (KubeVirt's 2 MiB alignment).
const MemoryBlockMiB = 2

// MemoryHotplugTCGMigration is why RAM with memory hotplug room does not live-migrate under
// emulation (TCG), said by the launcher that refuses it and by the controller that marks such an
// instance not migratable.
const MemoryHotplugTCGMigration = "QEMU 7.2 loses guest writes migrating RAM of whole 256 KiB blocks under TCG (fixed in QEMU 9.0), " +
	"and the virtio-mem region is whole 2 MiB blocks, which cannot be padded out of that; it migrates under KVM"

// MaxVCPUs is the most vCPUs a q35 guest gets from QEMU here (without an IOMMU's interrupt
// remapping, x2APIC IDs above 254 are unreachable).
const MaxVCPUs = 255

// MemoryHotplugRoomMiB is the virtio-mem device's size: the memory hotplug may add beyond
// MemoryMiB; 0 without hotplug room.
func (m *Machine) MemoryHotplugRoomMiB() int64 { return max(m.MaxMemoryMiB-m.MemoryMiB, 0) }
