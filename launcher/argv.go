package launcher

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
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
//	               (if any scsi disk), virtio disks, PCIe NICs (virtio, e1000e), then the spare
//	               ports "hotplug0".."hotplugN-1". Port i has chassis i+1 and port number
//	               slot<<3|function, all unique.
//	00:1e.0 down   conventional PCI NICs (e1000, rtl8139), one slot each, as integrated
//	               endpoints (QEMU's docs/pcie.txt: legacy PCI devices belong on pcie.0, not
//	               behind a root port). They cannot be unplugged.
//	00:1f.x        ICH9 LPC, AHCI (ide.0..ide.5), SMBus (built in)
//
// Every PCIe device sits alone behind its own root port, as libvirt and KubeVirt do, so it can be
// unplugged; pcie.0 itself does not support hotplug, hence the spare ports.

// Machine is everything BuildArgv needs, already resolved to host paths by the caller.
type Machine struct {
	Name      string // VMI name; -name guest=NAMESPACE_NAME
	Namespace string
	// UID is the VMI's UID; the SMBIOS UUID is spec.domain.firmware.uuid, else this.
	UID  string
	Spec *v1alpha1.VirtualMachineInstanceSpec
	// Emulation allows (and uses) TCG. Without it the machine uses KVM and fails to start where KVM
	// does not work: there is no silent fallback.
	Emulation bool
	// RunDir is the per-VMI directory holding the sockets and the pid file (see QMPSocket etc.).
	// It must be absolute and short enough for unix socket paths (107 bytes).
	RunDir string
	// Kernel and Initrd are host paths, set exactly when spec.domain.firmware.kernelBoot is.
	// Initrd is optional unless kernelBoot.container.initrdPath is set.
	Kernel, Initrd string
	// Disks maps each volume name to its resolved image; every disk in the spec needs one and every
	// entry must be attached by a disk.
	Disks map[string]DiskImage
	// Taps maps each interface name to the tap device the node agent created for it.
	Taps map[string]string
	// MACs maps an interface name to the MAC it gets when the spec gives none (the caller derives a
	// stable one). An interface without either is an error.
	MACs map[string]string
	// SpareRootPorts is exactly how many empty pcie-root-ports ("hotplug0", ...) are added for
	// hotplug; the builder adds no default.
	SpareRootPorts int
	// Incoming starts QEMU as a migration target: "-incoming defer".
	Incoming bool
	// Hotplugged are disks attached at run time (HotplugDisk) that this QEMU must start with, as a
	// migration target does: each becomes a virtio disk on the spare root port it had
	// (DiskHotplug.Port, one of "hotplug0".."hotplugN-1"), so the guest sees the same layout. Their
	// images are never probed either: qcow2 gets "backing": null.
	Hotplugged []DiskHotplug
	// HotplugNICs are NICs attached at run time (HotplugNIC) that this QEMU must start with, as a
	// migration target does: each sits on the spare root port it had (PlacedNIC.Port), with the
	// same device properties HotplugNIC gives it, so the guest sees the same device. DHCP is the
	// launcher's business, not the argv's.
	HotplugNICs []PlacedNIC
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
}

// Socket and pid file paths inside RunDir (see Dir); the supervisor and tests use these too.

// QMPSocket is the launcher's own QMP control socket.
func (m *Machine) QMPSocket() string { return Dir(m.RunDir).QMP() }

// ShellQMPSocket is the QMP socket for the operator shell.
func (m *Machine) ShellQMPSocket() string { return Dir(m.RunDir).ShellQMP() }

// SerialSocket is the guest's serial console (ttyS0).
func (m *Machine) SerialSocket() string { return Dir(m.RunDir).Serial() }

// VNCSocket is the VNC display, when a graphics device is attached.
func (m *Machine) VNCSocket() string { return Dir(m.RunDir).VNC() }

// PIDFile is where QEMU writes its pid.
func (m *Machine) PIDFile() string { return Dir(m.RunDir).PIDFile() }

// Device, block node and bus names BuildArgv gives, for the supervisor's QMP commands.
const (
	QMPChardevID      = "qmp"
	ShellQMPChardevID = "qmp-shell"
	SerialChardevID   = "serial0"
	SCSIControllerID  = "scsi0"
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
// VMI ("spec.domain.devices.disks[2].disk.bus", "metadata.uid") or, for what the caller resolved,
// into the Machine ("machine.runDir", "machine.disks[data]"). errors.As finds the *field.Error
// values too.
type InvalidMachineError struct {
	Errs field.ErrorList
}

func (e *InvalidMachineError) Error() string {
	return "cannot build the QEMU command line: " + e.Errs.ToAggregate().Error()
}

// Unwrap returns the individual *field.Error values.
func (e *InvalidMachineError) Unwrap() []error {
	out := make([]error, len(e.Errs))
	for i, err := range e.Errs {
		out[i] = err
	}
	return out
}

// Limits of the q35 layout above.
const (
	vgaSlot       = 0x01
	firstPortSlot = 0x02
	lastFreeSlot  = 0x1e // 0x1f holds the ICH9 functions
	freeSlots     = lastFreeSlot - firstPortSlot + 1
	// MaxRootPorts is how many pcie-root-ports fit on pcie.0 (eight per free slot).
	MaxRootPorts = freeSlots * 8
	sataPorts    = 6 // ICH9 AHCI: ide.0 .. ide.5
	maxBacking   = 8 // deepest backing chain accepted
	maxSocketLen = 107
)

var (
	serialRE = regexp.MustCompile(`^[A-Za-z0-9_.+-]+$`)
	uuidRE   = regexp.MustCompile(`^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$`)
	tapRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$`)
	macRE    = regexp.MustCompile(`^([0-9A-Fa-f]{2}[:-]){5}[0-9A-Fa-f]{2}$`)
)

// The argv is the only place QEMU's option syntax lives. QemuOpts values (-chardev, -vnc, -name,
// -netdev, -device, -smbios) escape "," as ",,"; -kernel, -initrd, -append and -pidfile take their
// argument verbatim; -blockdev takes JSON, so any path is safe there.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// builder accumulates the argv and the errors; no method stops at the first error.
type builder struct {
	m    *Machine
	spec *v1alpha1.VirtualMachineInstanceSpec
	errs field.ErrorList

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
	bootSeen bool
}

var (
	specPath    = field.NewPath("spec")
	domainPath  = specPath.Child("domain")
	diskPath    = domainPath.Child("devices", "disks")
	ifacePath   = domainPath.Child("devices", "interfaces")
	machinePath = field.NewPath("machine")
)

// BuildArgv returns QEMU's arguments (without argv[0]) for m. It first validates the spec with
// v1alpha1.ValidateVirtualMachineInstanceSpec and returns those errors if any; otherwise it returns
// every further problem at once. The error is an *InvalidMachineError.
func BuildArgv(m *Machine) ([]string, error) {
	if m == nil || m.Spec == nil {
		return nil, &InvalidMachineError{Errs: field.ErrorList{field.Required(specPath, "the Machine has no spec")}}
	}
	if errs := v1alpha1.ValidateVirtualMachineInstanceSpec(m.Spec, specPath); len(errs) > 0 {
		return nil, &InvalidMachineError{Errs: errs}
	}
	b := &builder{m: m, spec: m.Spec, nodes: map[string]string{}, hotPorts: map[string]string{}, macs: map[string]string{}}
	b.identity()
	b.machine()
	b.kernelBoot()
	b.controlAndConsoles()
	b.disks()
	b.hotplugged()
	b.nics()
	b.hotplugNICs()
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
			return nil, &InvalidMachineError{Errs: field.ErrorList{field.InternalError(machinePath, fmt.Errorf("argument %d contains a NUL byte", i))}}
		}
	}
	return argv, nil
}

func (b *builder) add(args ...string) { b.head = append(b.head, args...) }

func (b *builder) fail(err *field.Error) { b.errs = append(b.errs, err) }

// identity: name, UUID, SMBIOS, process settings.
func (b *builder) identity() {
	m := b.m
	if msgs := validation.IsDNS1123Subdomain(m.Name); len(msgs) > 0 {
		b.fail(field.Invalid(field.NewPath("metadata", "name"), m.Name, strings.Join(msgs, "; ")))
	}
	if msgs := validation.IsDNS1123Label(m.Namespace); len(msgs) > 0 {
		b.fail(field.Invalid(field.NewPath("metadata", "namespace"), m.Namespace, strings.Join(msgs, "; ")))
	}
	uuid, uuidPath := m.UID, field.NewPath("metadata", "uid")
	fw := b.spec.Domain.Firmware
	if fw != nil && fw.UUID != "" {
		uuid, uuidPath = string(fw.UUID), domainPath.Child("firmware", "uuid")
	}
	if !uuidRE.MatchString(uuid) {
		b.fail(field.Invalid(uuidPath, uuid, "must be a UUID such as 6a1c6d35-6a0e-4b9b-9d3a-0123456789ab"))
	}
	b.checkAbs(machinePath.Child("runDir"), m.RunDir)
	for _, s := range []string{m.QMPSocket(), m.ShellQMPSocket(), m.SerialSocket(), m.VNCSocket()} {
		if len(s) > maxSocketLen {
			b.fail(field.Invalid(machinePath.Child("runDir"), m.RunDir, fmt.Sprintf("too long: socket path %s exceeds the %d bytes of a unix socket address", s, maxSocketLen)))
			break
		}
	}

	b.add("-name", "guest="+optEscape(m.Namespace+"_"+m.Name)+",debug-threads=on",
		"-uuid", uuid)
	if fw != nil && fw.Serial != "" {
		b.add("-smbios", "type=1,serial="+optEscape(fw.Serial)+",uuid="+uuid)
	}
	b.add("-no-user-config", "-nodefaults",
		// spawn=deny: QEMU may not fork or exec (taps use script=no; no exec: migration).
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-pidfile", m.PIDFile(),
		"-display", "none",
		"-msg", "timestamp=on")
	if !m.Incoming {
		// Paused until the launcher has set up and resumes it (or not: startStrategy Paused). A
		// migration target runs without -S: QEMU then gives the guest the run state it had on the
		// source (running, paused, or prelaunch if it never ran) once the migration completes.
		b.add("-S")
	}
}

// machine: machine type, accelerator, ACPI, CPU, topology, memory.
func (b *builder) machine() {
	d := &b.spec.Domain
	mtype := "q35"
	if d.Machine != nil && d.Machine.Type != "" {
		mtype = d.Machine.Type
	}
	accel := "kvm"
	if b.m.Emulation {
		accel = "tcg"
	}
	mopt := mtype + ",accel=" + accel
	if f := d.Features; f != nil && f.ACPI != nil && f.ACPI.Enabled != nil && !*f.ACPI.Enabled {
		mopt += ",acpi=off"
	}
	b.add("-machine", mopt)

	model, modelPath := "", domainPath.Child("cpu", "model")
	var cpu v1alpha1.CPU
	if d.CPU != nil {
		cpu = *d.CPU
		model = cpu.Model
	}
	switch model {
	case "":
		model = "host"
		if b.m.Emulation {
			model = "qemu64"
		}
	case "host-passthrough", "host":
		if b.m.Emulation {
			b.fail(field.Invalid(modelPath, cpu.Model, "the host CPU model needs KVM; under emulation use a named model such as qemu64 or max"))
		}
		model = "host"
	case "host-model":
		b.fail(field.NotSupported(modelPath, cpu.Model, []string{"host-passthrough", "<QEMU CPU model, e.g. qemu64>"}))
	}
	b.add("-cpu", model)
	one := func(v uint32) uint32 { return max(v, 1) }
	b.add("-smp", fmt.Sprintf("cpus=%d,sockets=%d,cores=%d,threads=%d",
		v1alpha1.VCPUs(d.CPU), one(cpu.Sockets), one(cpu.Cores), one(cpu.Threads)))

	memPath := domainPath.Child("memory", "guest")
	if d.Memory == nil || d.Memory.Guest == nil {
		memPath = domainPath.Child("resources", "requests", "memory")
	}
	q := v1alpha1.GuestMemory(d) // validation guarantees a positive quantity
	const mib = 1 << 20
	v := q.Value()
	if q.CmpInt64(v) != 0 || v%mib != 0 {
		b.fail(field.Invalid(memPath, q.String(), "must be a whole number of MiB"))
		return
	}
	b.add("-m", strconv.FormatInt(v/mib, 10))
}

func (b *builder) kernelBoot() {
	var kb *v1alpha1.KernelBoot
	if fw := b.spec.Domain.Firmware; fw != nil {
		kb = fw.KernelBoot
	}
	kp := domainPath.Child("firmware", "kernelBoot")
	if kb == nil {
		if b.m.Kernel != "" || b.m.Initrd != "" {
			b.fail(field.Forbidden(machinePath.Child("kernel"), "a kernel or initrd was resolved but the spec has no firmware.kernelBoot"))
		}
		return
	}
	if b.m.Kernel == "" {
		p := kp
		if kb.Container != nil {
			p = kp.Child("container", "kernelPath")
		}
		b.fail(field.Required(p, "no kernel was resolved for kernelBoot"))
	} else {
		b.checkAbs(machinePath.Child("kernel"), b.m.Kernel)
	}
	if b.m.Initrd == "" && kb.Container != nil && kb.Container.InitrdPath != "" {
		b.fail(field.Required(kp.Child("container", "initrdPath"), "no initrd was resolved for kernelBoot"))
	} else if b.m.Initrd != "" {
		b.checkAbs(machinePath.Child("initrd"), b.m.Initrd)
	}
	if strings.IndexByte(kb.KernelArgs, 0) >= 0 {
		b.fail(field.Invalid(kp.Child("kernelArgs"), kb.KernelArgs, "must not contain a NUL byte"))
	}
	b.add("-kernel", b.m.Kernel)
	if b.m.Initrd != "" {
		b.add("-initrd", b.m.Initrd)
	}
	if kb.KernelArgs != "" {
		b.add("-append", kb.KernelArgs)
	}
}

func (b *builder) controlAndConsoles() {
	m, dev := b.m, &b.spec.Domain.Devices
	for _, c := range []struct{ id, path string }{{QMPChardevID, m.QMPSocket()}, {ShellQMPChardevID, m.ShellQMPSocket()}} {
		b.add("-chardev", "socket,id="+c.id+",path="+optEscape(c.path)+",server=on,wait=off",
			"-mon", "chardev="+c.id+",mode=control")
	}
	if dev.AutoattachSerialConsole == nil || *dev.AutoattachSerialConsole {
		b.add("-chardev", "socket,id="+SerialChardevID+",path="+optEscape(m.SerialSocket())+",server=on,wait=off",
			"-serial", "chardev:"+SerialChardevID)
	}
	if dev.AutoattachGraphicsDevice == nil || *dev.AutoattachGraphicsDevice {
		b.add("-vnc", "unix:"+optEscape(m.VNCSocket()),
			"-device", fmt.Sprintf("VGA,id=video0,bus=pcie.0,addr=%#x", vgaSlot))
	}
}

// cacheMode maps a disk cache mode to QEMU's three knobs, as libvirt does:
//
//	none:         cache.direct=on  cache.no-flush=off  write-cache=on  (O_DIRECT; guest flushes reach the disk)
//	writethrough: cache.direct=off cache.no-flush=off  write-cache=off (host page cache; every write is flushed)
//	writeback:    cache.direct=off cache.no-flush=off  write-cache=on  (host page cache; guest flushes honoured)
func cacheMode(c v1alpha1.DriverCache) (direct, writeCache bool) {
	switch c {
	case v1alpha1.CacheWriteThrough:
		return false, false
	case v1alpha1.CacheWriteBack:
		return false, true
	default: // none, the default
		return true, true
	}
}

type blockCache struct {
	Direct  bool `json:"direct"`
	NoFlush bool `json:"no-flush"`
}

// fileNode and formatNode are -blockdev JSON objects; field order is the output order.
type fileNode struct {
	Driver   string     `json:"driver"`
	NodeName string     `json:"node-name"`
	Filename string     `json:"filename"`
	AIO      string     `json:"aio"`
	Cache    blockCache `json:"cache"`
	ReadOnly bool       `json:"read-only"`
}

type formatNode struct {
	Driver   string          `json:"driver"`
	NodeName string          `json:"node-name"`
	File     string          `json:"file"`
	Backing  json.RawMessage `json:"backing,omitempty"` // qcow2 only: null or a node name
	Cache    blockCache      `json:"cache"`
	ReadOnly bool            `json:"read-only"`
}

func jsonArg(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic(err) // only plain structs of strings and bools are encoded
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

func (b *builder) disks() {
	vols := map[string]*v1alpha1.Volume{}
	for i := range b.spec.Volumes {
		vols[b.spec.Volumes[i].Name] = &b.spec.Volumes[i]
	}
	disks := b.spec.Domain.Devices.Disks
	for i := range disks {
		if disks[i].BootOrder != nil {
			b.bootSeen = true
		}
		if t := disks[i].Disk; disks[i].CDRom == nil && (t == nil || t.Bus == "" || t.Bus == v1alpha1.DiskBusVirtio) {
			continue
		}
		if bus := diskBus(&disks[i]); bus == v1alpha1.DiskBusSCSI && !b.scsiCtl {
			// One controller for all scsi disks and cdroms, placed before the disks that use it.
			b.scsiCtl = true
			port := b.rootPort("port-" + SCSIControllerID)
			b.devs = append(b.devs, "-device", "virtio-scsi-pci,id="+SCSIControllerID+",bus="+port+",addr=0x0")
		}
	}
	if b.bootSeen {
		// Disks without a bootOrder are not tried, as in KubeVirt.
		b.add("-boot", "strict=on")
	}
	for i := range disks {
		b.disk(i, &disks[i], vols[disks[i].Name])
	}
}

func diskBus(d *v1alpha1.Disk) v1alpha1.DiskBus {
	if d.CDRom != nil {
		if d.CDRom.Bus == "" {
			return v1alpha1.DiskBusSATA
		}
		return d.CDRom.Bus
	}
	if d.Disk == nil || d.Disk.Bus == "" {
		return v1alpha1.DiskBusVirtio
	}
	return d.Disk.Bus
}

func (b *builder) disk(i int, d *v1alpha1.Disk, vol *v1alpha1.Volume) {
	dp := diskPath.Index(i)
	img, ok := b.m.Disks[d.Name]
	if !ok {
		b.fail(field.Required(dp, fmt.Sprintf("no image was resolved for volume %q", d.Name)))
		return
	}
	cdrom := d.CDRom != nil
	readOnly := cdrom || img.ReadOnly || (d.Disk != nil && d.Disk.ReadOnly)
	if vol != nil && vol.PersistentVolumeClaim != nil && vol.PersistentVolumeClaim.ReadOnly {
		readOnly = true
	}
	direct, writeCache := cacheMode(d.Cache)
	aio := string(d.IO)
	if aio == "" {
		aio = string(v1alpha1.IOThreads)
	}
	cache := blockCache{Direct: direct}

	// Block nodes, bottom of the backing chain first so every node exists before its user.
	type layer struct {
		img        *DiskImage
		file, fmt_ string
	}
	var chain []layer
	for k, cur := 0, &img; cur != nil; k, cur = k+1, cur.Backing {
		if k > maxBacking {
			b.fail(field.Invalid(dp, d.Name, fmt.Sprintf("the backing chain of volume %q is deeper than %d", d.Name, maxBacking)))
			return
		}
		suffix := d.Name
		if k > 0 {
			suffix = fmt.Sprintf("%s.b%d", d.Name, k)
		}
		chain = append(chain, layer{cur, nodeName("file-", suffix), nodeName("drive-", suffix)})
	}
	bad := false
	for k, l := range chain {
		switch l.img.Format {
		case "raw":
			if l.img.Backing != nil {
				b.fail(field.Invalid(dp, d.Name, fmt.Sprintf("volume %q: a raw image cannot have a backing image", d.Name)))
				bad = true
			}
		case "qcow2":
		default:
			what := "the image"
			if k > 0 {
				what = fmt.Sprintf("backing image %d", k)
			}
			b.fail(field.Invalid(dp, l.img.Format, fmt.Sprintf("volume %q: %s has an unsupported format; supported: raw, qcow2", d.Name, what)))
			bad = true
		}
		if !b.checkAbs(machinePath.Child("disks").Key(d.Name), l.img.Path) {
			bad = true
		}
		for _, n := range []string{l.file, l.fmt_} {
			if other, dup := b.nodes[n]; dup {
				b.fail(field.Duplicate(dp, fmt.Sprintf("block node %q (also used by disk %q)", n, other)))
				bad = true
			}
			b.nodes[n] = d.Name
		}
	}
	if bad {
		return
	}
	for k := len(chain) - 1; k >= 0; k-- {
		l := chain[k]
		ro := readOnly || k > 0
		b.devs = append(b.devs, "-blockdev", jsonArg(fileNode{
			Driver: "file", NodeName: l.file, Filename: l.img.Path, AIO: aio, Cache: cache, ReadOnly: ro}))
		fn := formatNode{Driver: l.img.Format, NodeName: l.fmt_, File: l.file, Cache: cache, ReadOnly: ro}
		if l.img.Format == "qcow2" {
			fn.Backing = json.RawMessage("null")
			if k+1 < len(chain) {
				fn.Backing = json.RawMessage(strconv.Quote(chain[k+1].fmt_))
			}
		}
		b.devs = append(b.devs, "-blockdev", jsonArg(fn))
	}

	id := DiskDeviceID(d.Name)
	props := ""
	switch bus := diskBus(d); bus {
	case v1alpha1.DiskBusVirtio:
		props = "virtio-blk-pci,id=" + id + ",bus=" + b.rootPort("port-"+id) + ",addr=0x0"
	case v1alpha1.DiskBusSATA:
		busPath := dp.Child("disk", "bus")
		if cdrom {
			busPath = dp.Child("cdrom", "bus")
		}
		if b.sata >= sataPorts {
			b.fail(field.Invalid(busPath, string(bus), fmt.Sprintf("q35's AHCI controller has %d ports: at most %d sata disks and cdroms", sataPorts, sataPorts)))
			return
		}
		dev := "ide-hd"
		if cdrom {
			dev = "ide-cd"
		} else if readOnly {
			// QEMU's ide-hd refuses a read-only block node ("Block node is read-only").
			b.fail(field.Invalid(dp.Child("disk", "readonly"), true, "a read-only disk cannot use the sata bus; use virtio or scsi"))
			return
		}
		props = fmt.Sprintf("%s,id=%s,bus=ide.%d", dev, id, b.sata)
		b.sata++
	case v1alpha1.DiskBusSCSI:
		dev := "scsi-hd"
		if cdrom {
			dev = "scsi-cd"
		}
		props = fmt.Sprintf("%s,id=%s,bus=%s.0,channel=0,scsi-id=%d,lun=0", dev, id, SCSIControllerID, b.scsi)
		b.scsi++
	default: // validation rejects any other bus; never drop the disk silently
		b.fail(field.NotSupported(dp.Child("disk", "bus"), string(bus), []string{"virtio", "sata", "scsi"}))
		return
	}
	props += ",drive=" + DriveNode(d.Name) + ",write-cache=" + onOff(writeCache)
	if d.Serial != "" {
		props += ",serial=" + optEscape(d.Serial)
	}
	if d.BootOrder != nil {
		props += ",bootindex=" + strconv.FormatUint(uint64(*d.BootOrder), 10)
	}
	b.devs = append(b.devs, "-device", props)
}

// placeOnSparePort reserves spare root port port for what (a placed hot-plugged device), failing
// at p when it is no spare port or already taken.
func (b *builder) placeOnSparePort(p *field.Path, port, what string) bool {
	if k, err := strconv.Atoi(strings.TrimPrefix(port, SpareRootPortPrefix)); err != nil || k < 0 ||
		k >= b.m.SpareRootPorts || HotplugPortID(k) != port {
		b.fail(field.Invalid(p, port, fmt.Sprintf("must be one of the %d spare root ports %s0...",
			b.m.SpareRootPorts, SpareRootPortPrefix)))
		return false
	}
	if other, dup := b.hotPorts[port]; dup {
		b.fail(field.Duplicate(p, fmt.Sprintf("%s (also %s)", port, other)))
		return false
	}
	b.hotPorts[port] = what
	return true
}

// hotplugged re-creates run-time disks on their spare root ports, with the cold-plug defaults
// (cache none, aio threads, write-cache on: the guest-visible part matches HotplugDisk's device).
func (b *builder) hotplugged() {
	hp := machinePath.Child("hotplugged")
	for i, h := range b.m.Hotplugged {
		p := hp.Index(i)
		if msgs := validation.IsDNS1123Label(h.Name); len(msgs) > 0 {
			b.fail(field.Invalid(p.Child("name"), h.Name, strings.Join(msgs, "; ")))
			continue
		}
		if h.Format != "raw" && h.Format != "qcow2" {
			b.fail(field.NotSupported(p.Child("format"), h.Format, []string{"raw", "qcow2"}))
			continue
		}
		if !b.checkAbs(p.Child("path"), h.Path) {
			continue
		}
		if h.Serial != "" && (len(h.Serial) > 20 || !serialRE.MatchString(h.Serial)) {
			b.fail(field.Invalid(p.Child("serial"), h.Serial, "must be at most 20 letters, digits or _.+-"))
			continue
		}
		if !b.placeOnSparePort(p.Child("port"), h.Port, fmt.Sprintf("disk %q", h.Name)) {
			continue
		}
		file, drive := FileNode(h.Name), DriveNode(h.Name)
		dup := false
		for _, n := range []string{file, drive} {
			if other, ok := b.nodes[n]; ok {
				b.fail(field.Duplicate(p.Child("name"), fmt.Sprintf("%s (block node %q, also used by disk %q)", h.Name, n, other)))
				dup = true
			}
			b.nodes[n] = h.Name
		}
		if dup {
			continue
		}
		cache := blockCache{Direct: true}
		b.devs = append(b.devs, "-blockdev", jsonArg(fileNode{
			Driver: "file", NodeName: file, Filename: h.Path, AIO: string(v1alpha1.IOThreads), Cache: cache, ReadOnly: h.ReadOnly}))
		fn := formatNode{Driver: h.Format, NodeName: drive, File: file, Cache: cache, ReadOnly: h.ReadOnly}
		if h.Format == "qcow2" {
			fn.Backing = json.RawMessage("null")
		}
		b.devs = append(b.devs, "-blockdev", jsonArg(fn))
		// The very device HotplugDisk added on the source: a migration only fits a device alike.
		b.devs = append(b.devs, "-device", jsonArg(hotplugDiskDevice(&h)))
	}
}

func onOff(v bool) string {
	if v {
		return "on"
	}
	return "off"
}

func (b *builder) nics() {
	for i := range b.spec.Domain.Devices.Interfaces {
		in := &b.spec.Domain.Devices.Interfaces[i]
		ip := ifacePath.Index(i)
		tap, ok := b.m.Taps[in.Name]
		switch {
		case !ok:
			b.fail(field.Required(ip, fmt.Sprintf("no tap device was created for interface %q", in.Name)))
		case !tapRE.MatchString(tap) || tap == "." || tap == "..":
			b.fail(field.Invalid(machinePath.Child("taps").Key(in.Name), tap, "must be a network interface name: 1-15 letters, digits or _.-"))
			ok = false
		}
		mac, macPath := in.MacAddress, ip.Child("macAddress")
		if mac == "" {
			mac, macPath = b.m.MACs[in.Name], machinePath.Child("macs").Key(in.Name)
			if mac == "" {
				b.fail(field.Required(ip.Child("macAddress"), fmt.Sprintf("no MAC address was given or derived for interface %q", in.Name)))
				continue
			}
		}
		hw, err := parseMAC(mac)
		if err != nil {
			b.fail(field.Invalid(macPath, mac, err.Error()))
			continue
		}
		if !b.uniqueMAC(macPath, hw, in.Name) {
			continue
		}
		if !ok {
			continue
		}
		model := in.Model
		if model == "" || model == "virtio" {
			model = "virtio-net-pci"
		}
		id := NICDeviceID(in.Name)
		var where string
		switch model {
		case "virtio-net-pci", "e1000e":
			where = "bus=" + b.rootPort("port-"+id) + ",addr=0x0"
		case "e1000", "rtl8139":
			where = fmt.Sprintf("bus=pcie.0,addr=%#x", lastFreeSlot-b.legacy)
			b.legacy++
		default: // validation rejects other models
			b.fail(field.NotSupported(ip.Child("model"), in.Model, []string{"virtio", "e1000", "e1000e", "rtl8139"}))
			continue
		}
		// No vhost (/dev/vhost-net is absent) and no option ROM: the API has no network boot, and
		// KubeVirt drops the ROM of interfaces without a boot order too.
		b.devs = append(b.devs,
			"-netdev", "tap,id="+NetdevID(in.Name)+",ifname="+optEscape(tap)+",script=no,downscript=no",
			"-device", model+",id="+id+","+where+",netdev="+NetdevID(in.Name)+",mac="+hw+",romfile=")
	}
}

// uniqueMAC records interface name's MAC hw (QEMU's form), failing at p when another NIC has it.
func (b *builder) uniqueMAC(p *field.Path, hw, name string) bool {
	if other, dup := b.macs[hw]; dup {
		b.fail(field.Duplicate(p, fmt.Sprintf("%s (also interface %q)", hw, other)))
		return false
	}
	b.macs[hw] = name
	return true
}

// hotplugNICs re-creates run-time NICs on their spare root ports with exactly HotplugNIC's device
// (nicDevice, in QEMU's JSON form of -device), which QEMU's migration stream must find: same bus,
// driver, MAC and no option ROM.
func (b *builder) hotplugNICs() {
	hp := machinePath.Child("hotplugNICs")
	for i := range b.m.HotplugNICs {
		n := &b.m.HotplugNICs[i]
		p := hp.Index(i)
		if msgs := validation.IsDNS1123Label(n.Name); len(msgs) > 0 {
			b.fail(field.Invalid(p.Child("name"), n.Name, strings.Join(msgs, "; ")))
			continue
		}
		if b.m.hasInterface(n.Name) || slices.ContainsFunc(b.m.HotplugNICs[:i], func(o PlacedNIC) bool { return o.Name == n.Name }) {
			b.fail(field.Duplicate(p.Child("name"), n.Name))
			continue
		}
		if !tapRE.MatchString(n.Tap) || n.Tap == "." || n.Tap == ".." {
			b.fail(field.Invalid(p.Child("tap"), n.Tap, "must be a network interface name: 1-15 letters, digits or _.-"))
			continue
		}
		_, ok := nicDrivers[orDefault(n.Model, "virtio")]
		if !ok {
			b.fail(field.NotSupported(p.Child("model"), n.Model, slices.Sorted(maps.Keys(nicDrivers))))
			continue
		}
		hw, err := parseMAC(n.MAC)
		if err != nil {
			b.fail(field.Invalid(p.Child("mac"), n.MAC, err.Error()))
			continue
		}
		if !b.uniqueMAC(p.Child("mac"), hw, n.Name) || !b.placeOnSparePort(p.Child("port"), n.Port, fmt.Sprintf("interface %q", n.Name)) {
			continue
		}
		b.devs = append(b.devs,
			"-netdev", "tap,id="+NetdevID(n.Name)+",ifname="+n.Tap+",script=no,downscript=no",
			"-device", jsonArg(nicDevice(&n.NICHotplug, n.Port)))
	}
}

// parseMAC accepts what the API accepts and returns QEMU's form (lower case, colons).
func parseMAC(mac string) (string, error) {
	if !macRE.MatchString(mac) {
		return "", fmt.Errorf("must be six hex octets such as 02:00:00:00:00:01")
	}
	hw, err := net.ParseMAC(strings.ReplaceAll(mac, "-", ":"))
	if err != nil {
		return "", err
	}
	if hw[0]&1 == 1 {
		return "", fmt.Errorf("must be a unicast address (lowest bit of the first octet clear)")
	}
	return hw.String(), nil
}

func (b *builder) spares() {
	n := b.m.SpareRootPorts
	if n < 0 {
		b.fail(field.Invalid(machinePath.Child("spareRootPorts"), n, "must be 0 or more"))
		return
	}
	if n > MaxRootPorts {
		b.fail(field.TooMany(machinePath.Child("spareRootPorts"), n, MaxRootPorts))
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

// checkUnused rejects resolved resources no device uses (a caller bug that would otherwise drop a
// device silently) and a layout that does not fit on pcie.0.
func (b *builder) checkUnused() {
	disks := map[string]bool{}
	for _, d := range b.spec.Domain.Devices.Disks {
		disks[d.Name] = true
	}
	ifaces := map[string]bool{}
	for _, in := range b.spec.Domain.Devices.Interfaces {
		ifaces[in.Name] = true
	}
	for _, k := range sortedKeys(b.m.Disks) {
		if !disks[k] {
			b.fail(field.Invalid(machinePath.Child("disks").Key(k), k, "no disk in spec.domain.devices.disks attaches this volume"))
		}
	}
	for _, k := range sortedKeys(b.m.Taps) {
		if !ifaces[k] {
			b.fail(field.Invalid(machinePath.Child("taps").Key(k), k, "no interface in spec.domain.devices.interfaces uses this tap"))
		}
	}
	for _, k := range sortedKeys(b.m.MACs) {
		if !ifaces[k] {
			b.fail(field.Invalid(machinePath.Child("macs").Key(k), k, "no interface in spec.domain.devices.interfaces has this name"))
		}
	}
	if slots := (len(b.ports)+7)/8 + b.legacy; slots > freeSlots {
		b.fail(field.Invalid(machinePath.Child("spareRootPorts"), b.m.SpareRootPorts, fmt.Sprintf(
			"%d root ports (PCIe devices plus spares) and %d legacy NICs do not fit on pcie.0's %d free slots (eight root ports per slot)",
			len(b.ports), b.legacy, freeSlots)))
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// checkAbs requires an absolute host path without NUL bytes.
func (b *builder) checkAbs(p *field.Path, v string) bool {
	switch {
	case v == "":
		b.fail(field.Required(p, "an absolute host path"))
	case !strings.HasPrefix(v, "/"):
		b.fail(field.Invalid(p, v, "must be an absolute path"))
	case strings.IndexByte(v, 0) >= 0:
		b.fail(field.Invalid(p, v, "must not contain a NUL byte"))
	default:
		return true
	}
	return false
}
