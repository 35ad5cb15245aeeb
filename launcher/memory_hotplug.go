package launcher

import (
	"context"
	"fmt"

	gqmp "github.com/digitalocean/go-qemu/qmp"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// Memory hotplug, as KubeVirt's (memory.maxGuest): the guest boots with MemoryMiB of RAM and QEMU
// holds a virtio-mem device of the room up to MaxMemoryMiB, of which the guest is given
// PluggedMemoryMiB at start. Raising the guest memory raises the device's requested size; the
// guest's virtio_mem driver plugs blocks until it has that much and QEMU reports each change. The
// room costs nothing until plugged: its backend is allocated as the guest touches it.

// MemoryHotplugDeviceID is the virtio-mem device's -device id; memoryHotplugBackendID its memory.
const (
	MemoryHotplugDeviceID  = "memhp"
	memoryHotplugBackendID = "memhp-ram"
)

// maxMemoryMiB is the most memory hotplug may reach: QEMU 7.2 refuses a machine whose memory ends
// beyond the CPU's physical address bits, 40 for its CPU models (1 TiB, less the 4 GiB below the
// PCI hole's top and the alignment of the device memory region). Tried here: 1G,maxmem=960G
// starts, 980G does not. It also keeps sizes in KiB and bytes within an int64.
const maxMemoryMiB = 960 << 10

// memHotplug adds the virtio-mem device when the machine has hotplug room.
func (b *builder) memHotplug() {
	m, p := b.m, machinePath
	if m.MaxMemoryMiB != 0 && (m.MaxMemoryMiB < m.MemoryMiB || m.MaxMemoryMiB > maxMemoryMiB) {
		b.fail(machine.Invalid(p.Child("maxMemoryMiB"), m.MaxMemoryMiB, fmt.Sprintf("must be at least memoryMiB (%d) and at most %d MiB: "+
			"the guest's 40-bit physical address space (QEMU's CPU models) must hold it above the PCI hole", m.MemoryMiB, maxMemoryMiB)))
		return
	}
	room := m.MemoryHotplugRoomMiB()
	if room == 0 {
		if m.PluggedMemoryMiB != 0 {
			b.fail(machine.Invalid(p.Child("pluggedMemoryMiB"), m.PluggedMemoryMiB, "needs hotplug room (maxMemoryMiB above memoryMiB)"))
		}
		return
	}
	switch {
	case m.MemoryMiB%machine.MemoryBlockMiB != 0 || room%machine.MemoryBlockMiB != 0:
		b.fail(machine.Invalid(p.Child("maxMemoryMiB"), m.MaxMemoryMiB,
			fmt.Sprintf("memory hotplug needs memoryMiB and maxMemoryMiB in whole %d MiB blocks", machine.MemoryBlockMiB)))
	case m.HugePageKiB != 0:
		b.fail(machine.Invalid(p.Child("maxMemoryMiB"), m.MaxMemoryMiB, "memory hotplug cannot go with huge pages"))
	case m.PluggedMemoryMiB < 0 || m.PluggedMemoryMiB > room || m.PluggedMemoryMiB%machine.MemoryBlockMiB != 0:
		b.fail(machine.Invalid(p.Child("pluggedMemoryMiB"), m.PluggedMemoryMiB,
			fmt.Sprintf("must be whole %d MiB blocks within the hotplug room of %d MiB", machine.MemoryBlockMiB, room)))
	}
	// reserve=off maps the room with MAP_NORESERVE: unplugged, it takes none of the node's commit
	// limit, and a room larger than the node's memory still starts.
	backend := "memory-backend-ram,reserve=off"
	if ramBackend(m) {
		// The same memory as the boot RAM's: virtiofsd maps all of the guest's RAM.
		backend = "memory-backend-memfd,share=on"
	}
	b.add("-object", fmt.Sprintf("%s,id=%s,size=%dM", backend, memoryHotplugBackendID, room))
	at := slot{driver: "virtio-mem-pci", bus: b.rootPort("port-" + MemoryHotplugDeviceID)}
	b.devs = append(b.devs, "-device", fmt.Sprintf("%s,id=%s,memdev=%s,block-size=%dM,requested-size=%dM%s",
		at.driver, MemoryHotplugDeviceID, memoryHotplugBackendID, machine.MemoryBlockMiB, m.PluggedMemoryMiB, at.opts()))
}

// memoryPath names the machine's memory in errors, as the handler maps them to the spec's fields.
const memoryPath = machinePath + ".memoryMiB"

// SetGuestMemory asks the guest to have guestMiB of memory: the boot RAM plus what the virtio-mem
// device is asked to plug. It returns once QEMU has the request; the guest plugs the blocks after
// (Status reports them). Less than the guest was asked for before is refused (no unplug in place,
// as KubeVirt's), as is more than MaxMemoryMiB or a size out of whole blocks. Asking again for
// what was asked is no error.
func (l *Launcher) SetGuestMemory(ctx context.Context, guestMiB int64) error {
	p, err := l.hotplugProcess("memory")
	if err != nil {
		return err
	}
	l.memPlug.Lock()
	defer l.memPlug.Unlock()
	m := p.Machine()
	room, asked := m.MemoryHotplugRoomMiB(), p.memRequested.Load()
	requested := guestMiB - m.MemoryMiB
	switch {
	case room == 0:
		return machine.Invalid(memoryPath, guestMiB, fmt.Sprintf("the machine has no memory hotplug room (maxMemoryMiB); it has %d MiB until a restart", m.MemoryMiB))
	case requested == asked:
		return nil
	case requested < asked:
		return machine.Invalid(memoryPath, guestMiB, fmt.Sprintf("the guest was given %d MiB and memory is not unplugged in place; restart the VM for less", m.MemoryMiB+asked))
	case requested > room:
		return machine.Invalid(memoryPath, guestMiB, fmt.Sprintf("the machine has room for %d MiB (maxMemoryMiB)", m.MaxMemoryMiB))
	case requested%machine.MemoryBlockMiB != 0:
		return machine.Invalid(memoryPath, guestMiB, fmt.Sprintf("memory is plugged in whole %d MiB blocks", machine.MemoryBlockMiB))
	}
	if err := p.Monitor().SetMemoryDeviceRequestedSize(ctx, MemoryHotplugDeviceID, requested<<20); err != nil {
		return fmt.Errorf("plug memory up to %d MiB: %w", guestMiB, err)
	}
	p.memRequested.Store(requested)
	l.notify()
	return nil
}

// memoryStatus is the guest's memory with hotplug room; nil without.
func (p *Process) memoryStatus() *protocol.MemoryStatus {
	m := p.Machine()
	if m.MemoryHotplugRoomMiB() == 0 {
		return nil
	}
	return &protocol.MemoryStatus{
		BootMiB:      m.MemoryMiB,
		RequestedMiB: m.MemoryMiB + p.memRequested.Load(),
		PluggedMiB:   m.MemoryMiB + p.memPlugged.Load(),
	}
}

// refreshMemorySize reads what the virtio-mem device has plugged and was asked for: a migration
// target's device arrives as the source had it, with no size event.
func (p *Process) refreshMemorySize(ctx context.Context) {
	if p.Machine().MemoryHotplugRoomMiB() == 0 {
		return
	}
	size, err := p.Monitor().MemoryDeviceSize(ctx, MemoryHotplugDeviceID)
	if err != nil {
		p.log.Error(err, "read the virtio-mem device's size after the migration")
		return
	}
	p.memPlugged.Store(size >> 20)
	p.mu.Lock()
	p.notifyLocked()
	p.mu.Unlock()
}

// onMemorySizeChange records what the guest has plugged, from the device's event.
func (p *Process) onMemorySizeChange(ev gqmp.Event) bool {
	if id, _ := ev.Data["id"].(string); id != MemoryHotplugDeviceID {
		return false
	}
	size, ok := ev.Data["size"].(float64)
	if !ok {
		return false
	}
	p.memPlugged.Store(int64(size) >> 20)
	return true
}
