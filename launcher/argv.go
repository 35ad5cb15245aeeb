package launcher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// This file turns a VMI spec plus what the caller resolved on the host into QEMU 7.2's command line.
// BuildArgv is pure (no filesystem, no environment, deterministic) and strict: whatever it cannot
// express makes it fail with the field path at fault; it never drops a device.
//
// PCI layout on q35 (fixed, so a migration target started from the same Machine has the same one):
//
//	00:00.0        host bridge (built in)
//	00:01.0        VGA, when a graphics device is attached
//	00:02.0 ...    pcie-root-ports, packed eight functions per slot (multifunction on function 0
//	               when the slot holds more than one), in this order: the virtio-scsi controller
//	               (if any scsi disk), virtio disks, PCIe NICs (virtio, e1000e), the xHCI
//	               controller and virtio input devices in input order, the virtio-rng device, the
//	               virtio-serial controller of the guest agent's channel, the vhost-user-fs
//	               devices in filesystem order, then the spare ports
//	               "hotplug0".."hotplugN-1". Port i has chassis i+1 and port number
//	               slot<<3|function, all unique.
//	00:1e.0 down   conventional PCI devices, one slot each, as integrated endpoints (QEMU's
//	               docs/pcie.txt: legacy PCI devices belong on pcie.0, not behind a root port):
//	               the legacy NICs (e1000, rtl8139), then the i6300esb watchdog; on a machine
//	               with VirtioTransitional, the transitional virtio devices take these slots
//	               instead of root ports, in the order above. They cannot be unplugged.
//	00:1f.x        ICH9 LPC, AHCI (ide.0..ide.5), SMBus (built in)
//
// Every PCIe device sits alone behind its own root port, as libvirt and KubeVirt do, so it can be
// unplugged; pcie.0 itself does not support hotplug, hence the spare ports.

// Machine is a machine description (package machine, from the node agent) with what the
// launcher resolved on its host: image paths, the run directory and the spare ports.
type Machine struct {
	machine.Machine
	// RunDir is the per-VMI directory holding the sockets and the pid file (see QMPSocket etc.).
	// It must be absolute and short enough for unix socket paths (107 bytes).
	RunDir string
	// KernelFile and InitrdFile are host paths, set exactly when Machine.Kernel is. InitrdFile is
	// optional unless Machine.Kernel.InitrdPath is set.
	KernelFile, InitrdFile string
	// EFICode and EFIVars are host paths, set exactly when Machine.Firmware.EFI is: OVMF's code,
	// opened read-only, and this machine's own copy of the build's variable store (NVRAM), which
	// the guest writes.
	EFICode, EFIVars string
	// Images maps each disk name to its resolved image; every disk needs one and every entry must
	// belong to a disk.
	Images map[string]DiskImage
	// SpareRootPorts is exactly how many empty pcie-root-ports ("hotplug0", ...) are added for
	// hotplug; the builder adds no default.
	SpareRootPorts int
	// Incoming starts QEMU as a migration target: "-incoming defer".
	Incoming bool
	// RTCStart is the date and time the guest's RTC starts at, set exactly when
	// Machine.Clock.RTCOffsetSeconds is not 0: the host's UTC time when QEMU starts, plus the
	// offset (HostResolver).
	RTCStart time.Time
}

// DiskImage is one resolved disk image. Its format is always given, never probed.
type DiskImage struct {
	Path string // absolute host path
	// Format is "raw" or "qcow2".
	Format   string
	ReadOnly bool
	// Backing is the image under a qcow2 image (for example the container disk under a
	// copy-on-write overlay the caller created), opened read-only with its own explicit format.
	// Without it a qcow2 image gets "backing": null: QEMU never follows a backing file name
	// written in an image.
	Backing *DiskImage
	// Ephemeral marks an image the launcher created (an emptyDisk): it goes with the disk.
	Ephemeral bool
	// Device says Path is a block device (a block-mode claim), which QEMU opens with its
	// host_device driver.
	Device bool
}

// PIDFile is where QEMU writes its pid, inside RunDir (see Dir). The sockets are with the devices
// they belong to (console.go, graphics.go); the supervisor and tests use these paths too.
func (m *Machine) PIDFile() string { return Dir(m.RunDir).PIDFile() }

// Device, block node and bus names BuildArgv gives, for the supervisor's QMP commands (the
// chardevs' are in console.go).
const (
	SCSIControllerID = "scsi0"
	// SpareRootPortPrefix + N (from 0) names the empty root ports for hotplug.
	SpareRootPortPrefix = "hotplug"
)

// DiskDeviceID is the -device id of a disk: "disk-<name>".
func DiskDeviceID(disk string) string { return "disk-" + disk }

// NICDeviceID is the -device id of an interface: "nic-<name>".
func NICDeviceID(iface string) string { return "nic-" + iface }

// NetdevID is the -netdev id of an interface: "net-<name>".
func NetdevID(iface string) string { return "net-" + iface }

// FileNode is the block node name of a disk's file (protocol) layer: "file-<name>" when that fits
// QEMU's 31-byte limit on node names, else a 17-byte prefix of the name, "_" and a hash.
func FileNode(disk string) string { return nodeName("file-", disk) }

// DriveNode is the block node name of a disk's format layer, which the device attaches:
// "drive-<name>", shortened as FileNode is (16-byte prefix).
func DriveNode(disk string) string { return nodeName("drive-", disk) }

// HotplugPortID is the id of spare root port i (from 0): "hotplug<i>".
func HotplugPortID(i int) string { return SpareRootPortPrefix + strconv.Itoa(i) }

// maxNodeName is the longest block node name QEMU 7.2 accepts.
const maxNodeName = 31

// nodeName never collides between a verbatim and a shortened name: DNS-label disk names hold no
// "_", and the backing-layer suffix ".b<k>" holds no "_" either.
func nodeName(prefix, s string) string {
	if n := prefix + s; len(n) <= maxNodeName {
		return n
	}
	h := fnv.New32a()
	h.Write([]byte(s))
	keep := maxNodeName - len(prefix) - 9 // "_" and 8 hex digits
	return fmt.Sprintf("%s%s_%08x", prefix, s[:keep], h.Sum32())
}

// InvalidMachineError is BuildArgv's error: every problem found, each with a field path into the
// machine description ("machine.disks[2].bus") or into what the launcher resolved
// ("machine.runDir", "machine.images[data]"). errors.As finds the *machine.FieldError values too.
type InvalidMachineError struct {
	Errs machine.FieldErrors
}

func (e *InvalidMachineError) Error() string {
	return "cannot build the QEMU command line: " + e.Errs.Error()
}

// Unwrap returns the individual *machine.FieldError values.
func (e *InvalidMachineError) Unwrap() []error { return e.Errs.Unwrap() }

// Limits of the q35 layout above.
const (
	firstPortSlot = 0x02
	lastFreeSlot  = 0x1e // 0x1f holds the ICH9 functions
	freeSlots     = lastFreeSlot - firstPortSlot + 1
	// MaxRootPorts is how many pcie-root-ports fit on pcie.0 (eight per free slot).
	MaxRootPorts = freeSlots * 8
	maxSocketLen = 107
)

// legacySlot takes the next conventional PCI slot on pcie.0, from lastFreeSlot down, and returns
// its address for -device's addr=.
func (b *builder) legacySlot() string {
	addr := fmt.Sprintf("%#x", lastFreeSlot-b.legacy)
	b.legacy++
	return addr
}

// slot is where a device goes: its driver, its bus and, on pcie.0, its address.
type slot struct{ driver, bus, addr string }

// opts is the slot's bus and address as -device QemuOpts properties.
func (s slot) opts() string {
	if s.addr == "" {
		return ",bus=" + s.bus
	}
	return ",bus=" + s.bus + ",addr=" + s.addr
}

// place sets the slot's driver, bus and address on a JSON -device.
func (s slot) place(d qmp.Device) qmp.Device {
	d.Driver, d.Bus = s.driver, s.bus
	if s.addr != "" {
		d.Props["addr"] = s.addr
	}
	return d
}

// virtioSlot places a cold-plugged virtio device of the given (modern) driver: on its own root
// port; or, on a machine with VirtioTransitional, QEMU's transitional model in a legacy slot on
// pcie.0, a conventional PCI device whose I/O BAR a pre-1.0 virtio driver finds (libvirt puts
// virtio-transitional devices on conventional PCI for the same reason).
func (b *builder) virtioSlot(driver, id string) slot {
	if !b.m.VirtioTransitional {
		return slot{driver: driver, bus: b.rootPort("port-" + id)}
	}
	return slot{driver: driver + "-transitional", bus: "pcie.0", addr: b.legacySlot()}
}

// checkName requires a DNS-1123 label (at most 63 bytes).
func checkName(p machine.Path, v string) *machine.FieldError {
	if len(v) > 63 || !machine.IsLabel(v) {
		return machine.Invalid(p, v, "must be a DNS-1123 label: at most 63 lower-case letters, digits or '-', starting and ending with a letter or digit")
	}
	return nil
}

// The argv is the only place QEMU's option syntax lives. QemuOpts values (-chardev, -vnc, -name,
// -netdev, -device, -smbios) escape "," as ",,"; -kernel, -initrd, -append and -pidfile take their
// argument verbatim; -blockdev and JSON -device take JSON, so any string is safe there.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// builder accumulates the argv and the errors; no method stops at the first error.
type builder struct {
	m    *Machine
	errs machine.FieldErrors

	head     []string // everything before the PCI devices
	devs     []string // block and network backends and devices, after the root ports
	ports    []string // root port ids, in layout order
	legacy   int      // conventional PCI slots used, from lastFreeSlot down
	sata     int      // AHCI ports used
	scsi     int      // scsi targets used
	scsiCtl  bool
	nodes    map[string]string // block node name -> disk that uses it
	hotPorts map[string]string // spare root port -> what a placed hot-plugged device sits there
	macs     map[string]string // normalised MAC -> interface
	names    map[string]bool   // device names seen, per kind prefix ("disk/x", "nic/y")
	usb      bool              // the xHCI controller is there
}

const machinePath machine.Path = "machine"

// BuildArgv returns QEMU's arguments (without argv[0]) for m, or every problem found at once as
// an *InvalidMachineError.
func BuildArgv(m *Machine) ([]string, error) {
	if m == nil {
		return nil, &InvalidMachineError{Errs: machine.FieldErrors{machine.Required(machinePath, "no machine")}}
	}
	b := &builder{m: m, nodes: map[string]string{}, hotPorts: map[string]string{}, macs: map[string]string{}, names: map[string]bool{}}
	// The order of these calls is the order of the command line (and of the errors).
	b.identity()     // argv.go
	b.smbios()       // firmware.go
	b.process()      // argv.go
	b.machineType()  // firmware.go
	b.cpuMemory()    // cpu.go
	b.clock()        // clock.go
	b.kernelBoot()   // firmware.go
	b.consoles()     // console.go
	b.graphics()     // graphics.go
	b.ioThreads()    // disk.go
	b.disks()        // disk.go
	b.nics()         // nic.go
	b.inputs()       // input.go
	b.usbRedirs()    // input.go
	b.rng()          // rng.go
	b.memBalloon()   // balloon.go
	b.memHotplug()   // memory_hotplug.go
	b.channels()     // channel.go
	b.watchdog()     // watchdog.go
	b.sound()        // sound.go
	b.tpm()          // tpm.go
	b.filesystems()  // filesystem.go
	b.panicDevices() // panic.go
	b.spares()
	b.checkUnused()
	if len(b.errs) > 0 {
		return nil, &InvalidMachineError{Errs: b.errs}
	}
	argv := append(b.head, b.rootPorts()...)
	argv = append(argv, b.devs...)
	if m.Incoming {
		argv = append(argv, "-incoming", "defer")
	}
	// Belt and braces: every input string was checked already, but an argv element with a NUL would
	// be cut short by execve and must never reach it.
	for i, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, &InvalidMachineError{Errs: machine.FieldErrors{machine.Invalid(machinePath, i, "an argument contains a NUL byte")}}
		}
	}
	return argv, nil
}

func (b *builder) add(args ...string) { b.head = append(b.head, args...) }

func (b *builder) fail(err *machine.FieldError) {
	if err != nil {
		b.errs = append(b.errs, err)
	}
}

// unique records a device name of kind, failing at p when it is taken.
func (b *builder) unique(p machine.Path, kind, name string) bool {
	if err := checkName(p, name); err != nil {
		b.fail(err)
		return false
	}
	if b.names[kind+"/"+name] {
		b.fail(machine.Duplicate(p, name))
		return false
	}
	b.names[kind+"/"+name] = true
	return true
}

// identity: the QEMU process's name and the guest's UUID.
func (b *builder) identity() {
	m := b.m
	if len(m.Name) > 253 || !machine.IsSubdomain(m.Name) {
		b.fail(machine.Invalid(machinePath.Child("name"), m.Name, "must be a DNS-1123 subdomain"))
	}
	b.fail(checkName(machinePath.Child("namespace"), m.Namespace))
	if !machine.IsUUID(m.UUID) {
		b.fail(machine.Invalid(machinePath.Child("uuid"), m.UUID, "must be a UUID such as 6a1c6d35-6a0e-4b9b-9d3a-0123456789ab"))
	}
	b.add("-name", "guest="+optEscape(m.Namespace+"_"+m.Name)+",debug-threads=on",
		"-uuid", m.UUID)
}

// process: how QEMU itself runs (no defaults, sandbox, pid file, start paused), and the socket
// paths every device file derives from RunDir.
func (b *builder) process() {
	m := b.m
	if m.GracePeriodSeconds < 0 {
		b.fail(machine.Invalid(machinePath.Child("gracePeriodSeconds"), m.GracePeriodSeconds, "must be 0 or more"))
	}
	b.checkAbs(machinePath.Child("runDir"), m.RunDir)
	sockets := []string{m.QMPSocket(), m.ShellQMPSocket(), m.SerialSocket(), m.VNCSocket(), m.GuestAgentSocket()}
	if m.DownwardMetrics != nil {
		sockets = append(sockets, Dir(m.RunDir).DownwardMetrics())
	}
	for _, s := range sockets {
		if len(s) > maxSocketLen {
			b.fail(machine.Invalid(machinePath.Child("runDir"), m.RunDir, fmt.Sprintf("too long: socket path %s exceeds the %d bytes of a unix socket address", s, maxSocketLen)))
			break
		}
	}
	b.add("-no-user-config", "-nodefaults",
		// spawn=deny: QEMU may not fork or exec (taps use script=no; no exec: migration).
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-pidfile", m.PIDFile(),
		"-display", "none",
		"-msg", "timestamp=on")
	// Paused until the launcher has set up and resumes it (or not: startStrategy Paused). A
	// migration target too: it runs the guest only when the node agents hand it over
	// (switchover.go), in the run state the guest had on the source.
	b.add("-S")
}

func jsonArg(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err) // only plain structs, maps of strings, numbers and bools are encoded
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func onOff(v bool) string {
	if v {
		return "on"
	}
	return "off"
}

// placeOnSparePort reserves spare root port port for what (a placed hot-plugged device), failing
// at p when it is no spare port or already taken.
func (b *builder) placeOnSparePort(p machine.Path, port, what string) bool {
	if k, err := strconv.Atoi(strings.TrimPrefix(port, SpareRootPortPrefix)); err != nil || k < 0 ||
		k >= b.m.SpareRootPorts || HotplugPortID(k) != port {
		b.fail(machine.Invalid(p, port, fmt.Sprintf("must be one of the %d spare root ports %s0...",
			b.m.SpareRootPorts, SpareRootPortPrefix)))
		return false
	}
	if other, dup := b.hotPorts[port]; dup {
		b.fail(machine.Duplicate(p, fmt.Sprintf("%s (also %s)", port, other)))
		return false
	}
	b.hotPorts[port] = what
	return true
}

func (b *builder) spares() {
	n := b.m.SpareRootPorts
	if n < 0 || n > MaxRootPorts {
		b.fail(machine.Invalid(machinePath.Child("spareRootPorts"), n, fmt.Sprintf("must be 0 to %d", MaxRootPorts)))
		return
	}
	for i := range n {
		b.rootPort(HotplugPortID(i))
	}
}

// rootPort reserves the next pcie-root-port and returns its id; rootPorts lays them out.
func (b *builder) rootPort(id string) string {
	b.ports = append(b.ports, id)
	return id
}

func (b *builder) rootPorts() []string {
	var out []string
	for i, id := range b.ports {
		slot, fn := firstPortSlot+i/8, i%8
		props := fmt.Sprintf("pcie-root-port,id=%s,bus=pcie.0,chassis=%d,port=%#x,addr=%#x.%#x", id, i+1, slot<<3|fn, slot, fn)
		if fn == 0 && i+1 < len(b.ports) {
			props += ",multifunction=on"
		}
		out = append(out, "-device", props)
	}
	return out
}

// checkUnused rejects resolved images no disk uses (a caller bug that would otherwise drop a
// device silently) and a layout that does not fit on pcie.0.
func (b *builder) checkUnused() {
	for _, k := range slices.Sorted(maps.Keys(b.m.Images)) {
		if b.m.Disk(k) == nil {
			b.fail(machine.Invalid(machinePath.Child("images").Key(k), k, "no disk of the machine has this name"))
		}
	}
	if slots := (len(b.ports)+7)/8 + b.legacy; slots > freeSlots {
		b.fail(machine.Invalid(machinePath.Child("spareRootPorts"), b.m.SpareRootPorts, fmt.Sprintf(
			"%d root ports (PCIe devices plus spares) and %d conventional PCI devices (legacy NICs, watchdog, sound card, transitional virtio devices) "+
				"do not fit on pcie.0's %d free slots (eight root ports per slot)",
			len(b.ports), b.legacy, freeSlots)))
	}
}

// checkAbs requires an absolute host path without NUL bytes.
func (b *builder) checkAbs(p machine.Path, v string) bool {
	if err := absPath(p, v); err != nil {
		b.fail(err)
		return false
	}
	return true
}

func absPath(p machine.Path, v string) *machine.FieldError {
	switch {
	case v == "":
		return machine.Required(p, "an absolute host path")
	case !strings.HasPrefix(v, "/"):
		return machine.Invalid(p, v, "must be an absolute path")
	case strings.IndexByte(v, 0) >= 0:
		return machine.Invalid(p, v, "must not contain a NUL byte")
	}
	return nil
}
