package vmisync

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// TestPlaceHotplugged: a migration target keeps the disks and interfaces the guest booted with,
// gets the ones hot-plugged on the source placed on their root ports (with the target pod's host
// side for NICs), and leaves the ones not attached yet to be hot-plugged after the migration.
func TestPlaceHotplugged(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Status.VolumeStatus = []v1alpha1.VolumeStatus{
		{Name: "root", Phase: v1alpha1.VolumeReady},
		{Name: "data", Phase: v1alpha1.VolumeReady, Hotplugged: true, Target: "hotplug0"},
		{Name: "later", Phase: v1alpha1.VolumePending, Hotplugged: true},
	}
	v.Status.Interfaces = []v1alpha1.VirtualMachineInstanceNetworkInterface{
		{Name: "cold", MAC: "02:00:00:00:00:01"},
		{Name: "hot", MAC: "02:00:00:00:00:02", Hotplugged: true, RootPort: "hotplug1"},
	}
	dhcp := &machine.DHCP{Interface: "k6t-br"}
	desc := func() *machine.Machine {
		return &machine.Machine{
			Disks: []machine.Disk{{Name: "root"}, {Name: "data"}, {Name: "later"}},
			NICs: []machine.NIC{{Name: "cold", Tap: "tap0"}, {Name: "hot", Tap: "tap1", Model: machine.NICE1000E, DHCP: dhcp},
				{Name: "pending", Tap: "tap2"}},
		}
	}
	m := desc()
	if err := placeHotplugged(v, m); err != nil {
		t.Fatal(err)
	}
	wantDisks := []machine.Disk{{Name: "root"}, {Name: "data", Port: "hotplug0"}}
	if !reflect.DeepEqual(m.Disks, wantDisks) {
		t.Errorf("disks %+v, want %+v", m.Disks, wantDisks)
	}
	wantNICs := []machine.NIC{{Name: "cold", Tap: "tap0"}, {Name: "hot", Tap: "tap1", Model: machine.NICE1000E, DHCP: dhcp, Port: "hotplug1"}}
	if !reflect.DeepEqual(m.NICs, wantNICs) {
		t.Errorf("nics %+v, want %+v", m.NICs, wantNICs)
	}

	t.Run("a hot-plugged interface without its root port is an error", func(t *testing.T) {
		v := v.DeepCopy()
		v.Status.Interfaces[1].RootPort = ""
		err := placeHotplugged(v, desc())
		var fe *field.Error
		if !errors.As(err, &fe) || fe.Field != "status.interfaces[hot].rootPort" {
			t.Errorf("want an error at status.interfaces[hot].rootPort, got %v", err)
		}
	})
}

// TestInterfacesCarryTheRootPort: the launcher's port of a hot-plugged NIC reaches the instance's
// status, where the target node's agent reads it.
func TestInterfacesCarryTheRootPort(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	st := &protocol.Status{NICs: []protocol.NICStatus{{Name: "cold", MAC: "02:00:00:00:00:01"},
		{Name: "hot", MAC: "02:00:00:00:00:02", Hotplugged: true, Port: "hotplug1"}}}
	got := interfaces(v, nil, st)
	want := []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "cold", MAC: "02:00:00:00:00:01", InfoSource: "domain"},
		{Name: "hot", MAC: "02:00:00:00:00:02", Hotplugged: true, RootPort: "hotplug1", InfoSource: "domain"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("interfaces %+v, want %+v", got, want)
	}
}

// A migration does not start while the guest still holds a hot-plugged device the spec dropped:
// the target would lack it. Devices still to be plugged are fine (the target plugs them later).
func TestUnplugPendingBlocksMigration(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}, {Name: "new"}}
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default"}}
	st := &protocol.Status{
		Disks: []protocol.DiskStatus{{Name: "root"}},
		NICs:  []protocol.NICStatus{{Name: "default", Hotplugged: true}},
	}
	if err := unplugPending(v, st); err != nil {
		t.Errorf("nothing being unplugged: %v", err)
	}
	st.Disks = append(st.Disks, protocol.DiskStatus{Name: "old", Hotplugged: true})
	if err := unplugPending(v, st); err == nil || !strings.Contains(err.Error(), `disk "old" is still being unplugged`) {
		t.Errorf("a disk being unplugged: %v", err)
	}
	st.Disks = st.Disks[:1]
	st.NICs = append(st.NICs, protocol.NICStatus{Name: "gone", Hotplugged: true})
	if err := unplugPending(v, st); err == nil || !strings.Contains(err.Error(), `interface "gone" is still being unplugged`) {
		t.Errorf("an interface being unplugged: %v", err)
	}
}

// TestMatchVolumeBlockSizesReachTheTarget: the block sizes a source launcher read from a disk's
// volume go into the instance's status, and a migration target's machine gives the guest those,
// for a cold and a hot-plugged disk alike; a target whose source reported none is refused naming
// the status field rather than started with sizes of its own.
func TestMatchVolumeBlockSizesReachTheTarget(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}, {Name: "data"}}
	st := &protocol.Status{Phase: protocol.PhaseRunning,
		Disks: []protocol.DiskStatus{{Name: "root", BlockSize: &machine.BlockSize{Logical: 4096, Physical: 4096, DiscardGranularity: 4096}},
			{Name: "data", Hotplugged: true, BlockSize: &machine.BlockSize{Logical: 512, Physical: 4096}}},
		Hotplugged: []machine.Disk{{Name: "data", Port: "hotplug0"}}}
	v.Status.VolumeStatus = volumes(v, st, nil)
	if bs := v.Status.VolumeStatus[0].BlockSize; bs == nil || bs.Logical != 4096 || bs.DiscardGranularity == nil || *bs.DiscardGranularity != 4096 {
		t.Fatalf("status of root records block sizes %+v, want 4096/4096/4096", bs)
	}
	if bs := v.Status.VolumeStatus[1].BlockSize; bs == nil || bs.Physical != 4096 || bs.DiscardGranularity != nil {
		t.Fatalf("status of data records block sizes %+v, want 512/4096 and no granularity", bs)
	}

	desc := func() *machine.Machine {
		return &machine.Machine{Disks: []machine.Disk{{Name: "root", MatchVolumeBlockSize: true}, {Name: "data", MatchVolumeBlockSize: true}}}
	}
	m := desc()
	if err := targetMachine(v, m); err != nil {
		t.Fatal(err)
	}
	want := []machine.Disk{
		{Name: "root", MatchVolumeBlockSize: true, BlockSize: &machine.BlockSize{Logical: 4096, Physical: 4096, DiscardGranularity: 4096}},
		{Name: "data", MatchVolumeBlockSize: true, BlockSize: &machine.BlockSize{Logical: 512, Physical: 4096}, Port: "hotplug0"}}
	if !reflect.DeepEqual(m.Disks, want) {
		t.Errorf("target disks %+v, want %+v", m.Disks, want)
	}

	v.Status.VolumeStatus[0].BlockSize = nil
	err := targetMachine(v, desc())
	var fe *field.Error
	if !errors.As(err, &fe) || fe.Field != "status.volumeStatus[0].blockSize" || !strings.Contains(fe.Detail, `disk "root"`) {
		t.Errorf("target without the source's sizes: %v, want an error at status.volumeStatus[0].blockSize naming the disk", err)
	}
}

// TestTargetStartsWithTheSourcesSockets: with CPU hotplug room, a migration target starts with the
// sockets the source's guest has (status.currentCPUTopology), not the spec's, which may have been
// raised without the source plugging them yet; unknown sockets refuse the target.
func TestTargetStartsWithTheSourcesSockets(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 3, Cores: 2, Threads: 1, MaxSockets: 4}
	newMachine := func() *machine.Machine {
		return &machine.Machine{CPU: machine.CPU{Sockets: 3, Cores: 2, Threads: 1, VCPUs: 6, MaxSockets: 4}}
	}
	if err := targetMachine(v, newMachine()); err == nil {
		t.Errorf("a target with hotplug room and no status.currentCPUTopology was made")
	}
	v.Status.CurrentCPUTopology = &v1alpha1.CPUTopology{Sockets: 2, Cores: 2, Threads: 1}
	m := newMachine()
	if err := targetMachine(v, m); err != nil {
		t.Fatal(err)
	}
	if m.CPU.Sockets != 2 || m.CPU.VCPUs != 4 {
		t.Errorf("target CPU %+v, want the source's 2 sockets (4 vCPUs)", m.CPU)
	}
}

// TestTargetStartsWithTheSourcesMemory: with memory hotplug room, a migration target boots with
// the memory the source's guest booted with and has its virtio-mem device start at what the source
// was asked for (status.memory), not the spec's, which may have been raised meanwhile; unknown or
// impossible figures refuse the target.
func TestTargetStartsWithTheSourcesMemory(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	newMachine := func() *machine.Machine {
		return &machine.Machine{CPU: machine.CPU{Sockets: 1, Cores: 1, Threads: 1, VCPUs: 1}, MemoryMiB: 2048, MaxMemoryMiB: 4096}
	}
	if err := targetMachine(v, newMachine()); err == nil {
		t.Errorf("a target with memory hotplug room and no status.memory was made")
	}
	q := func(s string) *resource.Quantity { r := resource.MustParse(s); return &r }
	v.Status.Memory = &v1alpha1.MemoryStatus{GuestAtBoot: q("1Gi"), GuestRequested: q("5Gi"), GuestCurrent: q("1Gi")}
	if err := targetMachine(v, newMachine()); err == nil {
		t.Errorf("a target asked for more than maxGuest was made")
	}
	v.Status.Memory.GuestRequested = q("1536Mi")
	m := newMachine()
	if err := targetMachine(v, m); err != nil {
		t.Fatal(err)
	}
	if m.MemoryMiB != 1024 || m.PluggedMemoryMiB != 512 {
		t.Errorf("target boots with %d MiB and %d MiB plugged, want the source's 1024 and 512", m.MemoryMiB, m.PluggedMemoryMiB)
	}
}

// TestMemoryStatusBoundsTheLaunchersWord: status.memory comes from the launcher, which the tenant
// controls: figures below zero or beyond maxGuest are clamped to them, and an instance without
// maxGuest gets none whatever the launcher says.
func TestMemoryStatusBoundsTheLaunchersWord(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	one, two := resource.MustParse("1Gi"), resource.MustParse("2Gi")
	v.Spec.Domain.Memory = &v1alpha1.Memory{Guest: &one}
	st := &protocol.Status{Memory: &protocol.MemoryStatus{BootMiB: -5, RequestedMiB: 1 << 40, PluggedMiB: 1536}}
	if got := memoryStatus(v, st); got != nil {
		t.Errorf("an instance without maxGuest got status.memory %+v", got)
	}
	v.Spec.Domain.Memory.MaxGuest = &two
	got := memoryStatus(v, st)
	if got == nil || !got.GuestAtBoot.IsZero() || !got.GuestRequested.Equal(two) || !got.GuestCurrent.Equal(resource.MustParse("1536Mi")) {
		t.Errorf("status.memory %+v, want boot 0, requested clamped to 2Gi, current 1536Mi", got)
	}
}
