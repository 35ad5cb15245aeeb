package v1alpha1

// The defaults below are KubeVirt's, applied in one place: SetDefaults. The node agent's
// translation to a machine description calls it on a copy of the spec today; the defaulting
// webhook the KubeVirt-compatibility work adds will call it to record them in the stored object.
// Choices that depend on the node rather than the spec (the CPU model under emulation, the cache
// and I/O mode QEMU gets) stay in the translation.

const (
	// DefaultTerminationGracePeriodSeconds is the guest's shutdown time when the instance sets
	// none, as in KubeVirt.
	DefaultTerminationGracePeriodSeconds int64 = 180
	// DefaultMachineType is the QEMU machine type when the spec names none.
	DefaultMachineType = "q35"
	// DefaultInterfaceModel is the emulated network card when an interface names none.
	DefaultInterfaceModel = "virtio"
)

// TerminationGracePeriodSeconds is the instance's shutdown grace period: its own, else the
// default. The launcher pod's grace period and the launcher's shutdown both derive from it.
func TerminationGracePeriodSeconds(spec *VirtualMachineInstanceSpec) int64 {
	if spec.TerminationGracePeriodSeconds != nil {
		return *spec.TerminationGracePeriodSeconds
	}
	return DefaultTerminationGracePeriodSeconds
}

// SetDefaults fills what spec leaves to a default: the machine type, the grace period, each disk's
// target and bus, a cdrom's read-only flag, each interface's model, the serial console, the
// graphics device and an EFI bootloader's secureBoot (true, as KubeVirt reads an unset one). It is
// idempotent and sets only fields that are unset.
func SetDefaults(spec *VirtualMachineInstanceSpec) {
	d := &spec.Domain
	if d.Machine == nil {
		d.Machine = &Machine{}
	}
	if efi := EFIBootloader(d); efi != nil {
		efi.SecureBoot = trueUnlessSet(efi.SecureBoot)
	}
	if d.Machine.Type == "" {
		d.Machine.Type = DefaultMachineType
	}
	if spec.TerminationGracePeriodSeconds == nil {
		g := DefaultTerminationGracePeriodSeconds
		spec.TerminationGracePeriodSeconds = &g
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

// DefaultDisk fills one disk's defaults (also for a disk hot-plugged into a running instance): a
// disk with no target is a hard disk, a hard disk's bus is virtio, a cdrom's is sata and a cdrom
// is read-only.
func DefaultDisk(disk *Disk) {
	if disk.Disk == nil && disk.CDRom == nil {
		disk.Disk = &DiskTarget{}
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

func trueUnlessSet(b *bool) *bool {
	if b != nil {
		return b
	}
	t := true
	return &t
}
