package launcher

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// The disk device kind: its block nodes and its device, in the one form both QEMU's command line
// (-blockdev, -device JSON) and QMP (blockdev-add, device_add) take, so a cold-plugged disk, a
// hot-plugged one and a migration target's copy of a hot-plugged one are the same device.

const (
	sataPorts  = 6 // ICH9 AHCI: ide.0 .. ide.5
	maxBacking = 8 // deepest backing chain accepted
)

var diskBuses = []string{string(machine.BusVirtio), string(machine.BusSATA), string(machine.BusSCSI)}

// cacheMode maps a disk cache mode to QEMU's knobs, as libvirt does:
//
//	none:         cache.direct=on  cache.no-flush=off  write-cache=on  (O_DIRECT; guest flushes reach the disk)
//	writethrough: cache.direct=off cache.no-flush=off  write-cache=off (host page cache; every write is flushed)
//	writeback:    cache.direct=off cache.no-flush=off  write-cache=on  (host page cache; guest flushes honoured)
func cacheMode(c machine.Cache) (direct, writeCache bool) {
	switch c {
	case machine.CacheWriteThrough:
		return false, false
	case machine.CacheWriteBack:
		return false, true
	default:
		return true, true
	}
}

type blockCache struct {
	Direct  bool `json:"direct"`
	NoFlush bool `json:"no-flush"`
}

// fileNode and formatNode are -blockdev's and blockdev-add's JSON objects; field order is the
// output order.
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

// checkDisk checks what a disk must be whatever its bus or moment: its name, enums, serial.
func checkDisk(p machine.Path, d *machine.Disk) machine.FieldErrors {
	var errs machine.FieldErrors
	if err := checkName(p.Child("name"), d.Name); err != nil {
		errs = append(errs, err)
	}
	switch d.Bus {
	case machine.BusVirtio, machine.BusSATA, machine.BusSCSI:
	default:
		errs = append(errs, machine.NotSupported(p.Child("bus"), d.Bus, diskBuses))
	}
	switch d.Cache {
	case machine.CacheNone, machine.CacheWriteThrough, machine.CacheWriteBack:
	default:
		errs = append(errs, machine.NotSupported(p.Child("cache"), d.Cache, []string{"none", "writethrough", "writeback"}))
	}
	switch d.IO {
	case machine.IOThreads:
	case machine.IONative:
		if d.Cache != machine.CacheNone {
			errs = append(errs, machine.Invalid(p.Child("io"), d.IO, "native I/O needs cache none"))
		}
	default:
		errs = append(errs, machine.NotSupported(p.Child("io"), d.IO, []string{"threads", "native"}))
	}
	if d.Serial != "" && (len(d.Serial) > 20 || !machine.IsSerial(d.Serial)) {
		errs = append(errs, machine.Invalid(p.Child("serial"), d.Serial, "must be at most 20 letters, digits or _.+-"))
	}
	if d.CDROM && !d.ReadOnly {
		errs = append(errs, machine.Invalid(p.Child("readOnly"), false, "a cdrom is read-only"))
	}
	if d.Port != "" && (d.Bus != machine.BusVirtio || d.CDROM || d.LUN || d.BootIndex != nil) {
		errs = append(errs, machine.Invalid(p.Child("port"), d.Port, "only a virtio disk without a boot index can be hot-plugged"))
	}
	errs = append(errs, checkLUN(p, d)...)
	return append(errs, checkDiskTuning(p, d)...)
}

// checkLUN checks what a passed-through LUN needs: the scsi bus (scsi-block is a SCSI device) and
// a block device; QEMU's scsi-block has no serial of its own (the guest reads the LUN's).
func checkLUN(p machine.Path, d *machine.Disk) machine.FieldErrors {
	if !d.LUN {
		return nil
	}
	var errs machine.FieldErrors
	if d.Bus != machine.BusSCSI {
		errs = append(errs, machine.NotSupported(p.Child("bus"), d.Bus, []string{string(machine.BusSCSI)}))
	}
	if d.CDROM {
		errs = append(errs, machine.Invalid(p.Child("cdrom"), true, "a disk is either a cdrom or a lun"))
	}
	if d.Serial != "" {
		errs = append(errs, machine.Invalid(p.Child("serial"), d.Serial, "a lun reports its device's own serial number"))
	}
	if c := d.Source.Claim; c == nil || c.Device == "" || c.Overlay {
		errs = append(errs, machine.Invalid(p.Child("source"), "", "a lun passes a block device through: the source must be a block-mode claim's device, without an overlay"))
	}
	return errs
}

// maxDiskQueues is QEMU's limit on a virtio device's queues (VIRTIO_QUEUE_MAX).
const maxDiskQueues = 1024

// checkDiskTuning checks the knobs only a virtio disk has, and shareable's need of cache none.
func checkDiskTuning(p machine.Path, d *machine.Disk) machine.FieldErrors {
	var errs machine.FieldErrors
	virtio := d.Bus == machine.BusVirtio && !d.CDROM
	if d.Queues > 0 && (!virtio || d.Queues > maxDiskQueues) {
		errs = append(errs, machine.Invalid(p.Child("queues"), d.Queues, fmt.Sprintf("only a virtio disk has request queues, at most %d", maxDiskQueues)))
	}
	if d.IOThread != "" && !virtio {
		errs = append(errs, machine.Invalid(p.Child("ioThread"), d.IOThread, "only a virtio disk has an I/O thread"))
	}
	if d.Shareable && d.Cache != machine.CacheNone {
		errs = append(errs, machine.Invalid(p.Child("shareable"), true, "a shareable disk needs cache none"))
	}
	return append(errs, checkBlockSize(p.Child("blockSize"), d)...)
}

// checkBlockSize checks a disk's block sizes against QEMU's limits (machine.BlockSize.Problems):
// a hard disk's only.
func checkBlockSize(p machine.Path, d *machine.Disk) machine.FieldErrors {
	if d.BlockSize == nil {
		return nil
	}
	if d.CDROM || d.LUN {
		return machine.FieldErrors{machine.Invalid(p, "set", "only a hard disk takes a block size")}
	}
	var errs machine.FieldErrors
	for _, pr := range d.BlockSize.Problems(d.Bus == machine.BusSATA) {
		errs = append(errs, machine.Invalid(p.Child(pr.Field), pr.Value, pr.Detail))
	}
	return errs
}

// blockSizeProp is one of a disk device's block size properties, by QEMU's name.
type blockSizeProp struct {
	name  string
	value uint32
}

// blockSizeProps are a disk device's block size properties.
func blockSizeProps(bs *machine.BlockSize) []blockSizeProp {
	if bs == nil {
		return nil
	}
	props := []blockSizeProp{{"logical_block_size", bs.Logical}, {"physical_block_size", bs.Physical}}
	if bs.DiscardGranularity != 0 {
		props = append(props, blockSizeProp{"discard_granularity", bs.DiscardGranularity})
	}
	return props
}

// checkIOThread checks that the disk at p names one of the machine's I/O threads, if any.
func checkIOThread(p machine.Path, d *machine.Disk, threads []string) *machine.FieldError {
	if d.IOThread == "" || slices.Contains(threads, d.IOThread) {
		return nil
	}
	return machine.NotSupported(p.Child("ioThread"), d.IOThread, threads)
}

// ioThreads adds the machine's I/O threads, before the disks that name them. Their ids share
// QEMU's object namespace with the launcher's own objects, hence the prefix.
func (b *builder) ioThreads() {
	for i, id := range b.m.IOThreads {
		p := machinePath.Child("ioThreads").Index(i)
		if !b.unique(p, "I/O thread", id) {
			continue
		}
		if !strings.HasPrefix(id, machine.IOThreadPrefix) {
			b.fail(machine.Invalid(p, id, "must start with "+machine.IOThreadPrefix))
			continue
		}
		b.devs = append(b.devs, "-object", jsonArg(map[string]string{"qom-type": "iothread", "id": id}))
	}
}

// blockLayer is one image of a disk's backing chain with its node names.
type blockLayer struct {
	img        *DiskImage
	file, fmt_ string
}

// diskChain is a disk's image chain, top first, checked; nil when it has errors.
func diskChain(p machine.Path, name string, img *DiskImage) ([]blockLayer, machine.FieldErrors) {
	var chain []blockLayer
	var errs machine.FieldErrors
	for k, cur := 0, img; cur != nil; k, cur = k+1, cur.Backing {
		if k > maxBacking {
			return nil, machine.FieldErrors{machine.Invalid(p, name, fmt.Sprintf("the backing chain is deeper than %d", maxBacking))}
		}
		suffix := name
		if k > 0 {
			suffix = fmt.Sprintf("%s.b%d", name, k)
		}
		what := "the image"
		if k > 0 {
			what = fmt.Sprintf("backing image %d", k)
		}
		switch cur.Format {
		case "raw":
			if cur.Backing != nil {
				errs = append(errs, machine.Invalid(p, name, "a raw image cannot have a backing image"))
			}
		case "qcow2":
		default:
			errs = append(errs, machine.Invalid(p, cur.Format, fmt.Sprintf("%s has an unsupported format; supported: raw, qcow2", what)))
		}
		if err := absPath(p, cur.Path); err != nil {
			errs = append(errs, err)
		}
		chain = append(chain, blockLayer{cur, nodeName("file-", suffix), nodeName("drive-", suffix)})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return chain, nil
}

// blockNodes are the block nodes of a disk, bottom of the backing chain first so every node exists
// before its user: alternately a file node and the format node over it.
func blockNodes(d *machine.Disk, chain []blockLayer) []any {
	direct, _ := cacheMode(d.Cache)
	cache := blockCache{Direct: direct}
	readOnly := d.ReadOnly || chain[0].img.ReadOnly
	var nodes []any
	for k := len(chain) - 1; k >= 0; k-- {
		l := chain[k]
		ro := readOnly || k > 0
		driver := "file"
		if l.img.Device {
			driver = "host_device"
		}
		nodes = append(nodes, fileNode{Driver: driver, NodeName: l.file, Filename: l.img.Path, AIO: string(d.IO), Cache: cache, ReadOnly: ro})
		fn := formatNode{Driver: l.img.Format, NodeName: l.fmt_, File: l.file, Cache: cache, ReadOnly: ro}
		if l.img.Format == "qcow2" {
			// Never follow a backing file named inside an image.
			fn.Backing = json.RawMessage("null")
			if k+1 < len(chain) {
				fn.Backing = json.RawMessage(strconv.Quote(chain[k+1].fmt_))
			}
		}
		nodes = append(nodes, fn)
	}
	return nodes
}

// virtioDiskDevice is a virtio disk's device on root port port, for -device (JSON) and device_add.
func virtioDiskDevice(d *machine.Disk, port string) qmp.Device {
	_, writeCache := cacheMode(d.Cache)
	props := map[string]any{"drive": DriveNode(d.Name), "write-cache": onOff(writeCache)}
	if d.Serial != "" {
		props["serial"] = d.Serial
	}
	if d.BootIndex != nil {
		props["bootindex"] = *d.BootIndex
	}
	if d.Queues > 0 {
		props["num-queues"] = d.Queues
	}
	if d.IOThread != "" {
		props["iothread"] = d.IOThread
	}
	if d.Shareable {
		props["share-rw"] = true
	}
	for _, bp := range blockSizeProps(d.BlockSize) {
		props[bp.name] = bp.value
	}
	return qmp.Device{Driver: "virtio-blk-pci", ID: DiskDeviceID(d.Name), Bus: port, Props: props}
}

// disks lays out every disk: the scsi controller first if any disk needs it, cold disks in order,
// then hot-plugged ones on their spare ports.
func (b *builder) disks() {
	bootSeen := false
	for i := range b.m.Disks {
		d := &b.m.Disks[i]
		bootSeen = bootSeen || d.BootIndex != nil
		if d.Bus == machine.BusSCSI && !b.scsiCtl {
			// One controller for all scsi disks and cdroms, placed before the disks that use it.
			b.scsiCtl = true
			at := b.virtioSlot("virtio-scsi-pci", SCSIControllerID)
			if at.addr == "" {
				at.addr = "0x0"
			}
			queues := ""
			if b.m.CPU.MaxSockets != 0 {
				// QEMU sizes it by the vCPUs at start, which a migration target after a vCPU
				// hotplug would not share.
				queues = ",num_queues=1"
			}
			b.devs = append(b.devs, "-device", at.driver+",id="+SCSIControllerID+queues+at.opts())
		}
	}
	if bootSeen {
		// Disks without a boot index are not tried, as in KubeVirt.
		b.add("-boot", "strict=on")
	}
	for _, hot := range []bool{false, true} {
		for i := range b.m.Disks {
			if d := &b.m.Disks[i]; (d.Port != "") == hot {
				b.disk(machinePath.Child("disks").Index(i), d)
			}
		}
	}
}

func (b *builder) disk(p machine.Path, d *machine.Disk) {
	if errs := checkDisk(p, d); len(errs) > 0 {
		b.errs = append(b.errs, errs...)
		return
	}
	if !b.unique(p.Child("name"), "disk", d.Name) {
		return
	}
	if err := checkIOThread(p, d, b.m.IOThreads); err != nil {
		b.fail(err)
		return
	}
	img, ok := b.m.Images[d.Name]
	if !ok {
		b.fail(machine.Required(machinePath.Child("images").Key(d.Name), "no image was resolved for the disk"))
		return
	}
	chain, errs := diskChain(machinePath.Child("images").Key(d.Name), d.Name, &img)
	if len(errs) > 0 {
		b.errs = append(b.errs, errs...)
		return
	}
	for _, l := range chain {
		for _, n := range []string{l.file, l.fmt_} {
			if other, dup := b.nodes[n]; dup {
				b.fail(machine.Duplicate(p.Child("name"), fmt.Sprintf("block node %q (also used by disk %q)", n, other)))
				return
			}
			b.nodes[n] = d.Name
		}
	}
	props, ok := b.diskDevice(p, d, img.ReadOnly)
	if !ok {
		return
	}
	for _, n := range blockNodes(d, chain) {
		b.devs = append(b.devs, "-blockdev", jsonArg(n))
	}
	b.devs = append(b.devs, "-device", props)
}

// diskDevice is the -device argument of a disk, reserving its place on its bus.
func (b *builder) diskDevice(p machine.Path, d *machine.Disk, imgReadOnly bool) (string, bool) {
	id := DiskDeviceID(d.Name)
	switch d.Bus {
	case machine.BusVirtio:
		if d.Port == "" {
			return jsonArg(b.virtioSlot("virtio-blk-pci", id).place(virtioDiskDevice(d, ""))), true
		}
		if !b.placeOnSparePort(p.Child("port"), d.Port, fmt.Sprintf("disk %q", d.Name)) {
			return "", false
		}
		return jsonArg(virtioDiskDevice(d, d.Port)), true
	case machine.BusSATA:
		if b.sata >= sataPorts {
			b.fail(machine.Invalid(p.Child("bus"), d.Bus, fmt.Sprintf("q35's AHCI controller has %d ports: at most %d sata disks and cdroms", sataPorts, sataPorts)))
			return "", false
		}
		dev := "ide-hd"
		if d.CDROM {
			dev = "ide-cd"
		} else if d.ReadOnly || imgReadOnly {
			// QEMU's ide-hd refuses a read-only block node ("Block node is read-only").
			b.fail(machine.Invalid(p.Child("readOnly"), true, "a read-only disk cannot use the sata bus; use virtio or scsi"))
			return "", false
		}
		props := fmt.Sprintf("%s,id=%s,bus=ide.%d", dev, id, b.sata)
		b.sata++
		return props + b.diskProps(d), true
	default: // scsi; checkDisk refused any other bus
		if d.LUN {
			return b.lunDevice(d), true
		}
		dev := "scsi-hd"
		if d.CDROM {
			dev = "scsi-cd"
		}
		props := fmt.Sprintf("%s,id=%s,bus=%s.0,channel=0,scsi-id=%d,lun=0", dev, id, SCSIControllerID, b.scsi)
		b.scsi++
		return props + b.diskProps(d), true
	}
}

// lunDevice is a passed-through LUN's -device argument: scsi-block, which forwards the guest's
// SCSI commands to the device (SG_IO). It has no write cache or serial of its own: the LUN's are
// the guest's.
func (b *builder) lunDevice(d *machine.Disk) string {
	props := fmt.Sprintf("scsi-block,id=%s,bus=%s.0,channel=0,scsi-id=%d,lun=0,drive=%s", DiskDeviceID(d.Name), SCSIControllerID, b.scsi, DriveNode(d.Name))
	b.scsi++
	if d.BootIndex != nil {
		props += ",bootindex=" + strconv.FormatUint(uint64(*d.BootIndex), 10)
	}
	if d.Shareable {
		props += ",share-rw=on"
	}
	return props
}

// diskProps are the QemuOpts properties every non-virtio disk device takes.
func (b *builder) diskProps(d *machine.Disk) string {
	_, writeCache := cacheMode(d.Cache)
	props := ",drive=" + DriveNode(d.Name) + ",write-cache=" + onOff(writeCache)
	if d.Serial != "" {
		props += ",serial=" + optEscape(d.Serial)
	}
	if d.BootIndex != nil {
		props += ",bootindex=" + strconv.FormatUint(uint64(*d.BootIndex), 10)
	}
	if d.Shareable {
		props += ",share-rw=on"
	}
	for _, bp := range blockSizeProps(d.BlockSize) {
		props += fmt.Sprintf(",%s=%d", bp.name, bp.value)
	}
	return props
}
