package launcher

import (
	"strconv"
	"strings"

	"github.com/qvirt/qvirt/machine"
)

// The firmware device kind: what the guest finds before its operating system runs. The machine
// type with its accelerator, ACPI and SMM, the SMBIOS system table, the firmware (SeaBIOS, QEMU's
// default, or OVMF on two flash chips), and either a direct kernel boot (-kernel, -initrd,
// -append, which OVMF supports too) or, without one, the firmware booting from the disks' boot
// indexes (disk.go). All of it is fixed when QEMU starts, so it has only a cold form.
//
// OVMF's flash: pflash0 is the code, read-only; pflash1 is the machine's own variable store, a
// copy of the build's template the resolver made (resolve_host.go). QEMU carries both flash
// chips' contents in a live migration, like RAM, and the target writes what it received to its
// own copy of the template once the guest runs there (pflash_cfi01's post-load), so the
// variables go with the guest. The Secure Boot build keeps its variables behind SMM: the flash is
// "secure" (writable only from SMM) and the machine needs smm=on.

// Block node names of OVMF's flash chips; disks' nodes start with "file-" or "drive-".
const (
	EFICodeNode = "efi-code"
	EFIVarsNode = "efi-vars"
)

// pflashFile and pflashFormat are the -blockdev nodes of a flash chip: the file and its raw
// format, which the machine's pflash0/pflash1 property names. The host page cache is used: the
// variable store is small and rarely written, and it may live on a tmpfs, which refuses O_DIRECT.
type pflashFile struct {
	Driver   string `json:"driver"`
	NodeName string `json:"node-name"`
	Filename string `json:"filename"`
	ReadOnly bool   `json:"read-only"`
}

type pflashFormat struct {
	Driver   string `json:"driver"`
	NodeName string `json:"node-name"`
	File     string `json:"file"`
	ReadOnly bool   `json:"read-only"`
}

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

// machineType: machine type, accelerator, ACPI, SMM, the HPET and PIT, and the firmware's flash.
func (b *builder) machineType() {
	m := b.m
	if !machine.IsMachineType(m.Type) {
		b.fail(machine.Invalid(machinePath.Child("type"), m.Type, "must be a QEMU machine type such as q35"))
	}
	if m.Accel != machine.AccelKVM && m.Accel != machine.AccelTCG {
		b.fail(machine.NotSupported(machinePath.Child("accel"), m.Accel, []string{string(machine.AccelKVM), string(machine.AccelTCG)}))
	}
	mopt := m.Type
	if m.NoACPI {
		mopt += ",acpi=off"
	}
	if m.SMM != nil {
		mopt += ",smm=" + onOff(*m.SMM)
	}
	if m.Clock.NoHPET {
		mopt += ",hpet=off"
	}
	if m.Clock.NoPIT {
		mopt += ",pit=off"
	}
	if m.Firmware.SerialBIOS {
		// SeaBIOS then also writes its screen to the first serial port (its "sercon").
		mopt += ",graphics=off"
	}
	switch {
	case m.CPU.NUMAPassthrough:
		// The guest's NUMA node names the RAM (numa.go); KubeVirt's mapping also keeps the pages
		// from being merged with other guests' (<nosharepages/>), which would move them off the node.
		mopt += ",mem-merge=off"
	case ramBackend(m):
		mopt += ",memory-backend=" + GuestRAMID
	}
	if m.Firmware.EFI != nil {
		mopt += ",pflash0=" + EFICodeNode + ",pflash1=" + EFIVarsNode
	}
	b.add("-machine", mopt)
	accel := string(m.Accel)
	if m.Accel == machine.AccelTCG {
		accel += ",tb-size=" + strconv.Itoa(machine.TCGTranslationBufferMiB)
	}
	b.add("-accel", accel)
	b.efi()
}

// efi: OVMF's flash chips, whose files the caller resolved on this host; nothing for SeaBIOS.
func (b *builder) efi() {
	m, fp := b.m, machinePath.Child("firmware")
	efi := m.Firmware.EFI
	if efi == nil {
		if m.EFICode != "" || m.EFIVars != "" {
			b.fail(machine.Forbidden(fp.Child("efi"), "OVMF's files were resolved but the machine boots SeaBIOS"))
		}
		return
	}
	if m.Firmware.SerialBIOS {
		b.fail(machine.Forbidden(fp.Child("serialBIOS"), "SeaBIOS's serial output needs the BIOS firmware, and the machine boots EFI"))
	}
	if efi.SecureBoot && (m.SMM == nil || !*m.SMM) {
		b.fail(machine.Required(machinePath.Child("smm"), "EFI secure boot needs SMM on"))
	}
	ep := fp.Child("efi")
	codeOK := b.checkAbs(ep.Child("code"), m.EFICode)
	varsOK := b.checkAbs(ep.Child("vars"), m.EFIVars)
	if !codeOK || !varsOK {
		return
	}
	if efi.SecureBoot {
		b.add("-global", "driver=cfi.pflash01,property=secure,value=on")
	}
	for _, chip := range []struct {
		node, path string
		readOnly   bool
	}{{EFICodeNode, m.EFICode, true}, {EFIVarsNode, m.EFIVars, false}} {
		file := chip.node + "-file"
		b.add("-blockdev", jsonArg(pflashFile{Driver: "file", NodeName: file, Filename: chip.path, ReadOnly: chip.readOnly}),
			"-blockdev", jsonArg(pflashFormat{Driver: "raw", NodeName: chip.node, File: file, ReadOnly: chip.readOnly}))
	}
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
