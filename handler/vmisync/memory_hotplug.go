package vmisync

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// EventMemoryPlugged is the Event reason of a memory hotplug request.
const EventMemoryPlugged = "MemoryPlugged"

// syncMemory asks the launcher for the memory the spec has and the guest was not asked for
// (memory hotplug: a user raised spec.domain.memory.guest, up to maxGuest, which admission
// checked). Never during a migration: a target starts with the memory the source's guest was given
// (status.memory) and, once it runs the guest, its own agent asks for the rest here. Failures are
// recorded as Events and retried.
func (r *Reconciler) syncMemory(ctx context.Context, v *v1alpha1.VirtualMachineInstance, st *protocol.Status) error {
	want := v1alpha1.GuestMemoryMiB(&v.Spec.Domain)
	if st.Memory == nil || st.Phase != protocol.PhaseRunning || !v.DeletionTimestamp.IsZero() ||
		openMigration(v) != nil || want <= st.Memory.RequestedMiB {
		return nil
	}
	lc := r.launchers.client(v.UID)
	defer lc.Close()
	if err := lc.SetGuestMemory(ctx, want); err != nil {
		return r.hotplugFailed(v, fmt.Errorf("plug memory up to %d MiB: %s%w", want, specFieldOf(v, err), err))
	}
	r.Recorder.Eventf(v, corev1.EventTypeNormal, EventMemoryPlugged, "The guest was asked to take %d MiB of memory (it had %d MiB)",
		want, st.Memory.RequestedMiB)
	return nil
}

// memoryStatus is status.memory from what the launcher reports, within what the spec allows (the
// launcher is the tenant's); nil without memory hotplug.
func memoryStatus(v *v1alpha1.VirtualMachineInstance, st *protocol.Status) *v1alpha1.MemoryStatus {
	m := v.Spec.Domain.Memory
	if st.Memory == nil || m == nil || m.MaxGuest == nil {
		return nil
	}
	ceiling := v1alpha1.QuantityMiB(m.MaxGuest)
	mib := func(n int64) *resource.Quantity {
		return resource.NewQuantity(min(max(n, 0), ceiling)<<20, resource.BinarySI)
	}
	return &v1alpha1.MemoryStatus{
		GuestAtBoot:    mib(st.Memory.BootMiB),
		GuestRequested: mib(st.Memory.RequestedMiB),
		GuestCurrent:   mib(st.Memory.PluggedMiB),
	}
}

// sourceMemory gives a migration target with memory hotplug room the memory the source's guest
// booted with and was asked to have (status.memory), not the spec's: a spec raised while the
// migration was made was not plugged on the source, and the virtio-mem device must arrive as the
// source has it. The target's node agent asks for the rest once the guest has arrived.
func sourceMemory(v *v1alpha1.VirtualMachineInstance, m *machine.Machine) error {
	if m.MemoryHotplugRoomMiB() == 0 {
		return nil
	}
	s := v.Status.Memory
	if s == nil || s.GuestAtBoot == nil || s.GuestRequested == nil {
		return fmt.Errorf("status.memory %+v: the source's memory is unknown; a target with memory hotplug room must start with the source's", s)
	}
	boot, asked := v1alpha1.QuantityMiB(s.GuestAtBoot), v1alpha1.QuantityMiB(s.GuestRequested)
	if boot == 0 || asked < boot || asked > m.MaxMemoryMiB || boot%machine.MemoryBlockMiB != 0 || asked%machine.MemoryBlockMiB != 0 {
		return fmt.Errorf("status.memory: the source's guest booted with %d MiB and was asked for %d MiB, "+
			"which is no whole number of 2 MiB blocks within maxGuest (%d MiB)", boot, asked, m.MaxMemoryMiB)
	}
	m.MemoryMiB, m.PluggedMemoryMiB = boot, asked-boot
	return nil
}
