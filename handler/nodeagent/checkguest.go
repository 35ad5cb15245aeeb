package nodeagent

import (
	"encoding/binary"
	"fmt"
)

// The KVM check guest is a 64 KiB firmware image, generated here rather than shipped, that QEMU
// loads with -bios in place of SeaBIOS. It does what a Linux guest does right after the firmware,
// where guests hang on hosts whose nested virtualisation is broken: it switches from real mode to
// protected mode, turns on PAE paging and enters long mode, then programs the legacy PIC and PIT
// and sleeps in HLT until three timer interrupts arrived through a 64-bit IDT. Only then does it
// write checkGuestExitValue to the isa-debug-exit port, which makes QEMU exit with
// CheckGuestSuccess. A fault on the way is a triple fault, which -no-reboot turns into a plain exit
// 0; a guest that never gets its interrupts never exits and the caller's timeout ends it.
//
// QEMU maps the image at the top of the 4 GiB space (where the CPU starts, at 0xFFFFFFF0) and also
// below 1 MiB at checkGuestROMBase, where the code runs after its first far jump. The code only
// reads the ROM: the page tables, the tick counter and the stack are in RAM.
//
// It assumes what QEMU's PC machines (pc and q35) provide: an 8254 PIT whose channel 0 drives the
// master 8259's IRQ0 (through the HPET's legacy pass-through on q35), the 8259 reaching the CPU
// through the local APIC's LINT0, and isa-debug-exit on the ISA bus.
const (
	checkGuestROMSize = 64 << 10
	checkGuestROMBase = 0xF0000
	resetVector       = checkGuestROMSize - 16

	guestPML4     = 0x1000
	guestPDPT     = 0x2000
	guestPD       = 0x3000
	guestTicks    = 0x5000 // dword counting timer interrupts
	guestZeroEnd  = 0x6000 // RAM from guestPML4 up to here is cleared first
	guestStackTop = 0x8000

	apicBase = 0xFEE00000 // local APIC registers

	codeSelector32 = 0x08
	dataSelector   = 0x10
	codeSelector64 = 0x18

	timerVector   = 0x20
	wantTicks     = 3
	pitDivisor    = 1193 // about 1 kHz from the PIT's 1.193182 MHz
	debugExitPort = 0xF4

	// checkGuestExitValue is what the guest writes to isa-debug-exit; QEMU exits with
	// (value << 1) | 1.
	checkGuestExitValue = 0x2A
	// CheckGuestSuccess is QEMU's exit status when the check guest finished.
	CheckGuestSuccess = checkGuestExitValue<<1 | 1
)

// CheckGuestImage returns the check guest's firmware image.
func CheckGuestImage() ([]byte, error) {
	a := newAssembler()

	// Real mode, CS=0xF000: load the GDT and enter 32-bit protected mode.
	a.label("start16")
	a.emit(0xFA)                               // cli
	a.emit(0x2E, 0x66, 0x0F, 0x01, 0x16)       // lgdt cs:[gdtr] (32-bit base)
	a.ref16("gdtr")                            //
	a.emit(0x0F, 0x20, 0xC0)                   // mov eax, cr0
	a.emit(0x0C, 0x01)                         // or al, 1 (PE)
	a.emit(0x0F, 0x22, 0xC0)                   // mov cr0, eax
	a.emit(0x66, 0xEA)                         // jmp dword far codeSelector32:start32
	a.ref32("start32")                         //
	a.imm16(codeSelector32)                    //
	a.label("start32")                         // 32-bit protected mode, flat segments
	a.emit(0x66, 0xB8)                         // mov ax, dataSelector
	a.imm16(dataSelector)                      //
	a.emit(0x8E, 0xD8, 0x8E, 0xC0, 0x8E, 0xD0) // mov ds, ax; mov es, ax; mov ss, ax
	a.emit(0xBC)                               // mov esp, guestStackTop
	a.imm32(guestStackTop)                     //
	a.emit(0xFC)                               // cld
	a.emit(0xBF)                               // mov edi, guestPML4
	a.imm32(guestPML4)                         //
	a.emit(0xB9)                               // mov ecx, dwords to clear
	a.imm32((guestZeroEnd - guestPML4) / 4)    //
	a.emit(0x31, 0xC0)                         // xor eax, eax
	a.emit(0xF3, 0xAB)                         // rep stosd
	// Identity-map the first 2 MiB with one large page: PML4[0] → PDPT[0] → PD[0] (2 MiB, RW).
	for _, e := range [][2]uint32{{guestPML4, guestPDPT | 3}, {guestPDPT, guestPD | 3}, {guestPD, 0x83}} {
		a.emit(0xC7, 0x05) // mov dword [addr], value
		a.imm32(e[0])
		a.imm32(e[1])
	}
	// Route the PIC through the local APIC as firmware does: software-enable the APIC (a
	// disabled one keeps its LVT entries masked), LINT0 ExtINT, LINT1 NMI. Done before paging,
	// whose 2 MiB map does not reach the APIC's page.
	for _, e := range [][2]uint32{{apicBase + 0xF0, 0x1FF}, {apicBase + 0x350, 0x700}, {apicBase + 0x360, 0x400}} {
		a.emit(0xC7, 0x05) // mov dword [addr], value
		a.imm32(e[0])
		a.imm32(e[1])
	}
	a.emit(0xB8)                   // mov eax, guestPML4
	a.imm32(guestPML4)             //
	a.emit(0x0F, 0x22, 0xD8)       // mov cr3, eax
	a.emit(0x0F, 0x20, 0xE0)       // mov eax, cr4
	a.emit(0x83, 0xC8, 0x20)       // or eax, 0x20 (PAE)
	a.emit(0x0F, 0x22, 0xE0)       // mov cr4, eax
	a.emit(0xB9)                   // mov ecx, IA32_EFER
	a.imm32(0xC0000080)            //
	a.emit(0x0F, 0x32)             // rdmsr
	a.emit(0x0D)                   // or eax, 0x100 (LME)
	a.imm32(0x100)                 //
	a.emit(0x0F, 0x30)             // wrmsr
	a.emit(0x0F, 0x20, 0xC0)       // mov eax, cr0
	a.emit(0x0D)                   // or eax, 0x80000000 (PG): long mode is active now
	a.imm32(0x80000000)            //
	a.emit(0x0F, 0x22, 0xC0)       // mov cr0, eax
	a.emit(0xEA)                   // jmp far codeSelector64:start64
	a.ref32("start64")             //
	a.imm16(codeSelector64)        //
	a.label("start64")             // 64-bit mode
	a.emit(0x66, 0xB8)             // mov ax, dataSelector
	a.imm16(dataSelector)          //
	a.emit(0x8E, 0xD8, 0x8E, 0xD0) // mov ds, ax; mov ss, ax
	a.emit(0xBC)                   // mov esp, guestStackTop (zero-extends into rsp)
	a.imm32(guestStackTop)         //
	a.emit(0xB8)                   // mov eax, idtr
	a.ref32("idtr")                //
	a.emit(0x0F, 0x01, 0x18)       // lidt [rax]
	// PIC: master's IRQs at timerVector, only IRQ0 unmasked; the slave masked.
	for _, out := range [][2]byte{
		{0x11, 0x20}, {timerVector, 0x21}, {0x04, 0x21}, {0x01, 0x21}, {0xFE, 0x21}, {0xFF, 0xA1},
		// PIT channel 0, rate generator, divisor low then high byte.
		{0x34, 0x43}, {pitDivisor & 0xFF, 0x40}, {pitDivisor >> 8, 0x40},
	} {
		a.emit(0xB0, out[0], 0xE6, out[1]) // mov al, value; out port, al
	}
	a.emit(0xFB) // sti
	a.label("wait")
	a.emit(0xF4)                                           // hlt until an interrupt
	a.emit(0x83, 0x3C, 0x25)                               // cmp dword [guestTicks], wantTicks
	a.imm32(guestTicks)                                    //
	a.emit(wantTicks)                                      //
	a.emit(0x72)                                           // jb wait
	a.rel8("wait")                                         //
	a.emit(0xFA)                                           // cli
	a.emit(0xB0, checkGuestExitValue, 0xE6, debugExitPort) // mov al, value; out debugExitPort, al
	a.label("halt")
	a.emit(0xF4, 0xEB) // hlt; jmp halt (not reached: QEMU has exited)
	a.rel8("halt")

	// Timer interrupt handler: count, acknowledge at the PIC, return.
	a.label("irq0")
	a.emit(0xFF, 0x04, 0x25) // inc dword [guestTicks]
	a.imm32(guestTicks)
	a.emit(0x50, 0xB0, 0x20, 0xE6, 0x20, 0x58) // push rax; mov al, 0x20; out 0x20, al (EOI); pop rax
	a.emit(0x48, 0xCF)                         // iretq

	// GDT: null, 32-bit code, data, 64-bit code; accessed bits preset so the CPU never writes to
	// the ROM.
	a.align(8)
	a.label("gdt")
	a.emit(make([]byte, 8)...)
	a.emit(0xFF, 0xFF, 0, 0, 0, 0x9B, 0xCF, 0)
	a.emit(0xFF, 0xFF, 0, 0, 0, 0x93, 0xCF, 0)
	a.emit(0xFF, 0xFF, 0, 0, 0, 0x9B, 0xAF, 0)
	a.label("gdtr")
	a.imm16(4*8 - 1)
	a.ref32("gdt")

	a.align(8)
	a.label("idtr")
	a.imm16((timerVector+1)*16 - 1)
	a.ref32("idt")
	a.imm32(0)

	// IDT: vectors below timerVector are not present (a fault there triple-faults, which ends
	// QEMU under -no-reboot), timerVector is a 64-bit interrupt gate to irq0.
	a.align(16)
	a.label("idt")
	a.emit(make([]byte, timerVector*16)...)
	a.refLo16("irq0")
	a.imm16(codeSelector64)
	a.emit(0, 0x8E) // IST 0; present, DPL 0, 64-bit interrupt gate
	a.refHi16("irq0")
	a.imm32(0) // bits 63..32 of the handler
	a.imm32(0) // reserved

	// Reset vector: from CS base 0xFFFF0000 to the low alias, CS=0xF000.
	if err := a.org(resetVector); err != nil {
		return nil, err
	}
	a.emit(0xEA) // jmp far 0xF000:start16
	a.ref16("start16")
	a.imm16(checkGuestROMBase >> 4)
	if err := a.org(checkGuestROMSize); err != nil {
		return nil, err
	}
	return a.link()
}

// assembler lays out machine code with labels: references are patched by link once every label is
// known. Offsets are from the start of the image; ref32 and friends turn them into addresses of
// the low alias.
type assembler struct {
	b      []byte
	labels map[string]int
	fixups []fixup
}

type fixupKind int

const (
	fixOffset16 fixupKind = iota // 16-bit offset within the image (real mode, CS=0xF000)
	fixAddr32                    // 32-bit linear address
	fixAddrLo16                  // bits 15..0 of the linear address
	fixAddrHi16                  // bits 31..16 of the linear address
	fixRel8                      // signed 8-bit displacement from the end of the field
)

type fixup struct {
	at    int
	label string
	kind  fixupKind
}

func newAssembler() *assembler { return &assembler{labels: map[string]int{}} }

func (a *assembler) emit(b ...byte)   { a.b = append(a.b, b...) }
func (a *assembler) imm16(v uint16)   { a.b = binary.LittleEndian.AppendUint16(a.b, v) }
func (a *assembler) imm32(v uint32)   { a.b = binary.LittleEndian.AppendUint32(a.b, v) }
func (a *assembler) label(l string)   { a.labels[l] = len(a.b) }
func (a *assembler) ref16(l string)   { a.ref(l, fixOffset16, 2) }
func (a *assembler) ref32(l string)   { a.ref(l, fixAddr32, 4) }
func (a *assembler) refLo16(l string) { a.ref(l, fixAddrLo16, 2) }
func (a *assembler) refHi16(l string) { a.ref(l, fixAddrHi16, 2) }
func (a *assembler) rel8(l string)    { a.ref(l, fixRel8, 1) }

func (a *assembler) ref(l string, k fixupKind, size int) {
	a.fixups = append(a.fixups, fixup{at: len(a.b), label: l, kind: k})
	a.b = append(a.b, make([]byte, size)...)
}

func (a *assembler) align(n int) {
	for len(a.b)%n != 0 {
		a.b = append(a.b, 0)
	}
}

// org pads with zeros up to offset, which must not be behind the code already laid out.
func (a *assembler) org(offset int) error {
	if len(a.b) > offset {
		return fmt.Errorf("check guest: code reaches offset %#x, past %#x", len(a.b), offset)
	}
	a.b = append(a.b, make([]byte, offset-len(a.b))...)
	return nil
}

func (a *assembler) link() ([]byte, error) {
	for _, f := range a.fixups {
		off, ok := a.labels[f.label]
		if !ok {
			return nil, fmt.Errorf("check guest: undefined label %q", f.label)
		}
		addr := uint32(checkGuestROMBase + off)
		switch f.kind {
		case fixOffset16:
			binary.LittleEndian.PutUint16(a.b[f.at:], uint16(off))
		case fixAddr32:
			binary.LittleEndian.PutUint32(a.b[f.at:], addr)
		case fixAddrLo16:
			binary.LittleEndian.PutUint16(a.b[f.at:], uint16(addr))
		case fixAddrHi16:
			binary.LittleEndian.PutUint16(a.b[f.at:], uint16(addr>>16))
		case fixRel8:
			d := off - (f.at + 1)
			if d < -128 || d > 127 {
				return nil, fmt.Errorf("check guest: jump to %q out of rel8 range (%d)", f.label, d)
			}
			a.b[f.at] = byte(int8(d))
		}
	}
	return a.b, nil
}
