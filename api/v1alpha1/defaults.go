package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The defaults below are KubeVirt's (docs/kubevirt-compat.md lists each rule with its source in
// KubeVirt), applied in two steps:
//
//   - SetDefaults is KubeVirt's defaulting of a new instance, which its mutating webhook records in
//     the stored object: the defaults that add devices or derive values from other fields (an
//     interface on the pod network, a disk for each volume without one, the CPU topology and the
//     guest memory from resources), then FillDefaults. qvirt-controller's mutating webhook calls it
//     when a VirtualMachineInstance is created, the validating webhook on a copy of a
//     VirtualMachine's template (as KubeVirt's VM admitter does), and run mode on the manifest it
//     reads.
//   - FillDefaults fills the fields left unset (machine type, grace period, buses, models, ...). The
//     node agent's translation applies only this, so an instance stored before the webhook
//     recorded defaults runs with the devices it was admitted with.
//
// A VirtualMachine itself records only its template's machine type (SetVirtualMachineDefaults),
// as KubeVirt's VM mutator does: pinned at creation, it does not change under a running VM when
// the default does; the rest is recorded in each instance the VM creates.
//
// Choices that depend on the node rather than the spec (the CPU model under emulation, the cache
// and I/O mode QEMU gets) stay in the translation.

const (
	// DefaultTerminationGracePeriodSeconds is the guest's shutdown time when the instance sets
	// none. KubeVirt falls back to 30 s when the field is unset (v1.DefaultGracePeriodSeconds) and
	// virtctl writes 180 into the VMs it creates; qvirt has defaulted to 180 from the start.
	DefaultTerminationGracePeriodSeconds int64 = 180
	// DefaultMachineType is the QEMU machine type when the spec names none.
	DefaultMachineType = "q35"
	// DefaultInterfaceModel is the emulated network card when an interface names none.
	DefaultInterfaceModel = "virtio"
	// DefaultPodInterfaceName names the interface and network SetDefaults attaches when the spec
	// has neither (KubeVirt's DefaultPodNetwork and DefaultMasqueradeNetworkInterface).
	DefaultPodInterfaceName = "default"
)

// TerminationGracePeriodSeconds is the instance's shutdown grace period: its own, else the
// default. The launcher pod's grace period and the launcher's shutdown both derive from it.
func TerminationGracePeriodSeconds(spec *VirtualMachineInstanceSpec) int64 {
	if spec.TerminationGracePeriodSeconds != nil {
		return *spec.TerminationGracePeriodSeconds
	}
	return DefaultTerminationGracePeriodSeconds
}

// SetVirtualMachineDefaults is KubeVirt's VM mutator: the template's machine type, and nothing
// else of the template.
func SetVirtualMachineDefaults(spec *VirtualMachineSpec) {
	setMachineType(&spec.Template.Spec.Domain)
}

// SetDefaults applies KubeVirt's defaulting of a new instance to spec, in KubeVirt's order: the
// machine type, the guest memory and the CPU topology from resources, an interface on the pod
// network when none is given, a disk for every volume without one, then FillDefaults. It is
// idempotent and sets only what is unset.
func SetDefaults(spec *VirtualMachineInstanceSpec) {
	setMachineType(&spec.Domain)
	setGuestMemory(&spec.Domain)
	setCPUTopology(&spec.Domain)
	setPodInterface(spec)
	setSecondaryBindings(spec)
	SetVolumeDisks(spec)
	setAutoattachedDevices(&spec.Domain.Devices)
	FillDefaults(spec)
}

// setAutoattachedDevices records the devices KubeVirt attaches unless told not to: the memory
// balloon (autoattachMemBalloon, true when unset) and, with autoattachInputDevice true, a USB
// tablet when the spec has no input (KubeVirt's default-0). Recorded at creation rather than
// filled in later, so an instance keeps the devices it started with (a migration target must).
func setAutoattachedDevices(dev *Devices) {
	dev.AutoattachMemBalloon = trueUnlessSet(dev.AutoattachMemBalloon)
	if a := dev.AutoattachInputDevice; a != nil && *a && len(dev.Inputs) == 0 {
		dev.Inputs = []Input{{Name: "default-0", Type: InputTypeTablet, Bus: InputBusUSB}}
	}
}

// FillDefaults fills what spec leaves unset field by field: the machine type, the grace period,
// each disk's target and bus, a cdrom's read-only flag, each interface's model, each input's bus
// and type, the watchdog's model and action, the sound card's model, the serial console, the graphics device, an EFI
// bootloader's secureBoot (true, as KubeVirt reads an unset one), each present feature's
// enabled flag, the Hyper-V spinlock retries and the Hyper-V features others need. It adds no
// device and is idempotent.
func FillDefaults(spec *VirtualMachineInstanceSpec) {
	d := &spec.Domain
	setMachineType(d)
	if efi := EFIBootloader(d); efi != nil {
		efi.SecureBoot = trueUnlessSet(efi.SecureBoot)
	}
	if spec.TerminationGracePeriodSeconds == nil {
		g := DefaultTerminationGracePeriodSeconds
		spec.TerminationGracePeriodSeconds = &g
	}
	if f := d.Features; f != nil {
		defaultFeature(f.ACPI)
		defaultFeature(f.SMM)
		if f.APIC != nil {
			f.APIC.Enabled = trueUnlessSet(f.APIC.Enabled) // SetDefaults_FeatureAPIC
		}
		fillHypervDefaults(f)
	}
	for i := range d.Devices.Inputs {
		defaultInput(&d.Devices.Inputs[i])
	}
	if w := d.Devices.Watchdog; w != nil {
		defaultWatchdog(w)
	}
	for i := range d.Devices.PanicDevices {
		if pd := &d.Devices.PanicDevices[i]; pd.Model == nil {
			// libvirt's x86 default, which KubeVirt leaves it to pick.
			m := PanicIsa
			pd.Model = &m
		}
	}
	if snd := d.Devices.Sound; snd != nil && snd.Model == "" {
		snd.Model = SoundModelICH9
	}
	for i := range d.Devices.Disks {
		DefaultDisk(&d.Devices.Disks[i])
	}
	for i := range d.Devices.Interfaces {
		DefaultInterface(&d.Devices.Interfaces[i])
	}
	d.Devices.AutoattachSerialConsole = trueUnlessSet(d.Devices.AutoattachSerialConsole)
	d.Devices.AutoattachGraphicsDevice = trueUnlessSet(d.Devices.AutoattachGraphicsDevice)
}

// setMachineType is KubeVirt's setDefaultMachineType: q35 when the machine or its type is unset
// (`machine: {type: ""}` included).
func setMachineType(d *DomainSpec) {
	if d.Machine == nil {
		d.Machine = &Machine{}
	}
	if d.Machine.Type == "" {
		d.Machine.Type = DefaultMachineType
	}
}

// setGuestMemory is KubeVirt's setGuestMemory: without memory.guest, the guest gets
// resources.requests.memory, else resources.limits.memory, else one huge page of
// memory.hugepages.pageSize.
func setGuestMemory(d *DomainSpec) {
	if d.Memory != nil && d.Memory.Guest != nil {
		return
	}
	var guest *resource.Quantity
	switch {
	case !d.Resources.Requests.Memory().IsZero():
		guest = d.Resources.Requests.Memory()
	case !d.Resources.Limits.Memory().IsZero():
		guest = d.Resources.Limits.Memory()
	case d.Memory != nil && d.Memory.Hugepages != nil && d.Memory.Hugepages.PageBytes() > 0:
		guest = resource.NewQuantity(d.Memory.Hugepages.PageBytes(), resource.BinarySI)
	default:
		return
	}
	if d.Memory == nil {
		d.Memory = &Memory{}
	}
	d.Memory.Guest = guest
}

// setCPUTopology is KubeVirt's SetDefaultGuestCPUTopology: when no socket, core or thread count is
// set, one core and one thread per socket, and as many sockets as resources.limits.cpu (else
// resources.requests.cpu, else one) asks for, rounded up.
func setCPUTopology(d *DomainSpec) {
	if c := d.CPU; c != nil && (c.Sockets != 0 || c.Cores != 0 || c.Threads != 0) {
		return
	}
	if d.CPU == nil {
		d.CPU = &CPU{}
	}
	sockets := int64(1)
	if q, ok := d.Resources.Limits[corev1.ResourceCPU]; ok {
		sockets = q.Value()
	} else if q, ok := d.Resources.Requests[corev1.ResourceCPU]; ok {
		sockets = q.Value()
	}
	// Validation refuses more than MaxVCPUs; the clamp only keeps a huge quantity from wrapping
	// around into an acceptable count.
	d.CPU.Sockets = uint32(min(max(sockets, 1), MaxVCPUs+1))
	d.CPU.Cores, d.CPU.Threads = 1, 1
}

// setPodInterface is KubeVirt's SetDefaultNetworkInterface: an instance with no interface and no
// network gets interface "default" with the masquerade binding on the pod network, unless
// autoattachPodInterface is false. KubeVirt's binding here is its configuration's
// defaultNetworkInterface (bridge unless configured); qvirt's is masquerade, the binding that
// live-migrates.
func setPodInterface(spec *VirtualMachineInstanceSpec) {
	dev := &spec.Domain.Devices
	if a := dev.AutoattachPodInterface; a != nil && !*a {
		return
	}
	if len(spec.Networks) != 0 || len(dev.Interfaces) != 0 {
		return
	}
	dev.Interfaces = []Interface{{Name: DefaultPodInterfaceName, Masquerade: &InterfaceMasquerade{}}}
	spec.Networks = []Network{{Name: DefaultPodInterfaceName, Pod: &PodNetwork{}}}
}

// setSecondaryBindings gives an interface on a secondary (Multus, not default) network with no
// binding the bridge binding, the only one such a network has: qvirt's default binding,
// masquerade, needs the pod network.
func setSecondaryBindings(spec *VirtualMachineInstanceSpec) {
	for i := range spec.Domain.Devices.Interfaces {
		in := &spec.Domain.Devices.Interfaces[i]
		if in.Masquerade != nil || in.Bridge != nil || in.Binding != nil {
			continue
		}
		if n := spec.Network(in.Name); n != nil && n.IsSecondary() {
			in.Bridge = &InterfaceBridge{}
		}
	}
}

// SetVolumeDisks is KubeVirt's SetDefaultVolumeDisk: every volume no disk attaches gets a disk of
// its name (a hard disk, DefaultDisk), whatever its source: cloud-init volumes included.
func SetVolumeDisks(spec *VirtualMachineInstanceSpec) {
	dev := &spec.Domain.Devices
	has := make(map[string]bool, len(dev.Disks)+len(dev.Filesystems))
	for _, d := range dev.Disks {
		has[d.Name] = true
	}
	// A volume a filesystem shares is no disk (KubeVirt counts disks and filesystems alike).
	for _, f := range dev.Filesystems {
		has[f.Name] = true
	}
	for _, v := range spec.Volumes {
		if !has[v.Name] {
			dev.Disks = append(dev.Disks, Disk{Name: v.Name})
			has[v.Name] = true
		}
	}
}

// DefaultDisk fills one disk's defaults (also for a disk hot-plugged into a running instance): a
// disk with no target is a hard disk (KubeVirt's SetDefaults_DiskDevice), a hard disk's bus is
// virtio, a cdrom's is sata, a lun's scsi, and a cdrom whose readonly is unset is read-only
// (SetDefaults_CDRomTarget). An explicit `readonly: false` stays as written, as in KubeVirt; the
// cdrom is attached read-only either way.
func DefaultDisk(disk *Disk) {
	if disk.Disk == nil && disk.CDRom == nil && disk.LUN == nil {
		disk.Disk = &DiskTarget{}
	}
	if t := disk.LUN; t != nil && t.Bus == "" {
		t.Bus = DiskBusSCSI
	}
	if t := disk.Disk; t != nil && t.Bus == "" {
		t.Bus = DiskBusVirtio
	}
	if t := disk.CDRom; t != nil {
		if t.Bus == "" {
			t.Bus = DiskBusSATA
		}
		t.ReadOnly = trueUnlessSet(t.ReadOnly)
	}
}

// DefaultInterface fills one interface's defaults: the virtio model.
func DefaultInterface(in *Interface) {
	if in.Model == "" {
		in.Model = DefaultInterfaceModel
	}
}

// defaultInput is KubeVirt's setDefaults_Input: a tablet on USB.
func defaultInput(in *Input) {
	if in.Bus == "" {
		in.Bus = InputBusUSB
	}
	if in.Type == "" {
		in.Type = InputTypeTablet
	}
}

// defaultWatchdog is KubeVirt's SetAmd64Watchdog: an i6300esb whose action is reset.
func defaultWatchdog(w *Watchdog) {
	if w.I6300ESB == nil {
		w.I6300ESB = &I6300ESBWatchdog{}
	}
	if w.I6300ESB.Action == "" {
		w.I6300ESB.Action = WatchdogActionReset
	}
}

// defaultFeature is KubeVirt's SetDefaults_FeatureState: a feature that is present is enabled
// unless it says otherwise.
func defaultFeature(f *FeatureState) {
	if f != nil {
		f.Enabled = trueUnlessSet(f.Enabled)
	}
}

func trueUnlessSet(b *bool) *bool {
	if b != nil {
		return b
	}
	t := true
	return &t
}
