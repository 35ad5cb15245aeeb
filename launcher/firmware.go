package launcher

import (
	"strings"

	"github.com/qvirt/qvirt/machine"
)

// The firmware device kind: what the guest finds before its operating system runs. The machine
// type with its accelerator and ACPI, the SMBIOS system table, and either a direct kernel boot
// (-kernel, -initrd, -append) or, without one, the machine type's BIOS booting from the disks'
// boot indexes (disk.go). All of it is fixed when QEMU starts, so it has only a cold form.

// smbios: the SMBIOS type 1 (system) table, when the machine has a serial number. Its UUID is the
// machine's, as -uuid sets it for the table without a serial.
func (b *builder) smbios() {
	m := b.m
	if m.SMBIOSSerial != "" && !machine.IsSerial(m.SMBIOSSerial) {
		b.fail(machine.Invalid(machinePath.Child("smbiosSerial"), m.SMBIOSSerial, "may hold only letters, digits and _.+-"))
	}
	if m.SMBIOSSerial != "" {
		b.add("-smbios", "type=1,serial="+optEscape(m.SMBIOSSerial)+",uuid="+m.UUID)
	}
}

// machineType: machine type, accelerator, ACPI.
func (b *builder) machineType() {
	m := b.m
	if !machine.IsMachineType(m.Type) {
		b.fail(machine.Invalid(machinePath.Child("type"), m.Type, "must be a QEMU machine type such as q35"))
	}
	if m.Accel != machine.AccelKVM && m.Accel != machine.AccelTCG {
		b.fail(machine.NotSupported(machinePath.Child("accel"), m.Accel, []string{string(machine.AccelKVM), string(machine.AccelTCG)}))
	}
	mopt := m.Type + ",accel=" + string(m.Accel)
	if m.NoACPI {
		mopt += ",acpi=off"
	}
	b.add("-machine", mopt)
}

// kernelBoot: a direct kernel boot, whose files the caller resolved on this host; nothing without
// one (the BIOS boots from the disks).
func (b *builder) kernelBoot() {
	kb, kp := b.m.Kernel, machinePath.Child("kernel")
	if kb == nil {
		if b.m.KernelFile != "" || b.m.InitrdFile != "" {
			b.fail(machine.Forbidden(kp, "a kernel or initrd was resolved but the machine boots no kernel"))
		}
		return
	}
	if b.m.KernelFile == "" {
		b.fail(machine.Required(kp.Child("kernelPath"), "no kernel was resolved"))
	} else {
		b.checkAbs(kp.Child("kernelPath"), b.m.KernelFile)
	}
	if b.m.InitrdFile == "" && kb.InitrdPath != "" {
		b.fail(machine.Required(kp.Child("initrdPath"), "no initrd was resolved"))
	} else if b.m.InitrdFile != "" {
		b.checkAbs(kp.Child("initrdPath"), b.m.InitrdFile)
	}
	if strings.IndexByte(kb.Args, 0) >= 0 {
		b.fail(machine.Invalid(kp.Child("args"), kb.Args, "must not contain a NUL byte"))
	}
	b.add("-kernel", b.m.KernelFile)
	if b.m.InitrdFile != "" {
		b.add("-initrd", b.m.InitrdFile)
	}
	if kb.Args != "" {
		b.add("-append", kb.Args)
	}
}
