package launcher

import (
	"context"
	"fmt"
	"slices"

	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// cpuPath names the machine's CPU in errors, as the handler maps them to the spec's fields.
const cpuPath = machinePath + ".cpu"

// SetSockets hot-plugs vCPUs until the guest has sockets sockets of the machine's cores and
// threads, as KubeVirt's CPU hotplug does (a socket at a time; libvirt's setvcpus). The new vCPUs
// are ACPI-hotplugged: the guest sees them present and onlines them (a Linux guest through udev, or
// /sys/devices/system/cpu/cpuN/online). Fewer sockets than the guest has are refused (no unplug:
// QEMU would need the guest to eject the vCPUs, which KubeVirt does not do in place either), as
// are more than the machine's MaxSockets. Asking again for what the guest has is no error.
func (l *Launcher) SetSockets(ctx context.Context, sockets uint32) error {
	p, err := l.hotplugProcess("vCPUs")
	if err != nil {
		return err
	}
	// One plug at a time: a retry that overlaps a slow one would add the same vCPUs twice.
	l.cpuPlug.Lock()
	defer l.cpuPlug.Unlock()
	cpu := p.Machine().CPU
	have := p.sockets.Load()
	switch {
	case sockets == have:
		return nil
	case sockets < have:
		return machine.Invalid(cpuPath.Child("sockets"), sockets, fmt.Sprintf("the guest has %d sockets and vCPUs cannot be unplugged; restart the VM for fewer", have))
	case sockets > cpu.MaxSockets:
		return machine.Invalid(cpuPath.Child("sockets"), sockets, fmt.Sprintf("the machine has room for %d sockets (maxSockets)", max(cpu.MaxSockets, cpu.Sockets)))
	}
	places, err := p.Monitor().QueryHotpluggableCPUs(ctx)
	if err != nil {
		return fmt.Errorf("query-hotpluggable-cpus: %w", err)
	}
	for _, place := range freePlaces(places, sockets) {
		dev := qmp.Device{Driver: place.Type, ID: vcpuID(place.Props), Props: place.Props}
		if err := p.Monitor().DeviceAdd(ctx, dev); err != nil {
			return fmt.Errorf("plug vCPU %s: %w", dev.ID, err)
		}
	}
	p.sockets.Store(sockets)
	l.notify()
	return nil
}

// hotplugProcess is the QEMU a vCPU or memory plug goes to. A plug is refused during a migration:
// the target starts with what the source had when it was made, and its node agent plugs the rest
// once it runs the guest.
func (l *Launcher) hotplugProcess(what string) (*Process, error) {
	p, err := l.process()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	migrating := l.migration != nil && !migrationDone(l.migration.Status)
	l.mu.Unlock()
	if migrating {
		return nil, &ConflictError{Msg: what + " cannot be plugged during a migration; the target's node agent plugs the rest once it runs the guest"}
	}
	return p, nil
}

// freePlaces are the places without a vCPU in the first sockets sockets, in topology order.
func freePlaces(places []qmp.HotpluggableCPU, sockets uint32) []qmp.HotpluggableCPU {
	var out []qmp.HotpluggableCPU
	for _, pl := range places {
		if pl.QOMPath == "" && topologyID(pl.Props, "socket-id") < int(sockets) {
			out = append(out, pl)
		}
	}
	slices.SortFunc(out, func(a, b qmp.HotpluggableCPU) int {
		for _, k := range []string{"socket-id", "core-id", "thread-id"} {
			if c := topologyID(a.Props, k) - topologyID(b.Props, k); c != 0 {
				return c
			}
		}
		return 0
	})
	return out
}

// topologyID is one of a place's topology properties (JSON numbers); 0 when absent.
func topologyID(props map[string]any, key string) int {
	v, _ := props[key].(float64)
	return int(v)
}

// vcpuID is the device id of the vCPU at a place: vcpu-<socket>-<core>-<thread>.
func vcpuID(props map[string]any) string {
	return fmt.Sprintf("vcpu-%d-%d-%d", topologyID(props, "socket-id"), topologyID(props, "core-id"), topologyID(props, "thread-id"))
}

// Sockets is how many sockets of vCPUs the guest has now.
func (p *Process) Sockets() uint32 { return p.sockets.Load() }
