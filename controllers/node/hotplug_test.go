package node

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
)

// TestSplitHotpluggedNICs: a migration target keeps the interfaces the guest booted with, gets the
// ones hot-plugged on the source placed on their root ports with the target pod's host side, and
// leaves the ones not attached yet to be hot-plugged after the migration.
func TestSplitHotpluggedNICs(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "cold"}, {Name: "hot", Model: "e1000e"}, {Name: "pending"}}
	v.Spec.Networks = []v1alpha1.Network{{Name: "cold"}, {Name: "hot"}, {Name: "pending"}}
	v.Status.Interfaces = []v1alpha1.VirtualMachineInstanceNetworkInterface{
		{Name: "cold", MAC: "02:00:00:00:00:01"},
		{Name: "hot", MAC: "02:00:00:00:00:02", Hotplugged: true, RootPort: "hotplug1"},
	}
	dhcp := &launcher.DHCPConfig{Interface: "k6t-br"}
	setups := []launcher.InterfaceSetup{
		{Name: "cold", Tap: "tap0", MAC: "02:00:00:00:00:01"},
		{Name: "hot", Tap: "tap1", MAC: "02:00:00:00:00:02", DHCP: dhcp},
		{Name: "pending", Tap: "tap2", MAC: "02:00:00:00:00:03"},
	}

	spec := *v.Spec.DeepCopy()
	kept, placed, err := splitHotpluggedNICs(v, &spec, setups)
	if err != nil {
		t.Fatal(err)
	}
	wantPlaced := []launcher.PlacedNIC{{Port: "hotplug1",
		NICHotplug: launcher.NICHotplug{Name: "hot", Tap: "tap1", MAC: "02:00:00:00:00:02", Model: "e1000e", DHCP: dhcp}}}
	if !reflect.DeepEqual(placed, wantPlaced) {
		t.Errorf("placed %+v, want %+v", placed, wantPlaced)
	}
	if len(kept) != 1 || kept[0].Name != "cold" {
		t.Errorf("setups for the target's spec %+v, want cold's alone", kept)
	}
	if len(spec.Domain.Devices.Interfaces) != 1 || spec.Domain.Devices.Interfaces[0].Name != "cold" ||
		len(spec.Networks) != 1 || spec.Networks[0].Name != "cold" {
		t.Errorf("target spec interfaces %+v networks %+v, want cold's alone", spec.Domain.Devices.Interfaces, spec.Networks)
	}
	if len(v.Spec.Domain.Devices.Interfaces) != 3 || len(v.Spec.Networks) != 3 {
		t.Error("the instance's own spec changed")
	}

	t.Run("nothing hot-plugged leaves spec and setups alone", func(t *testing.T) {
		v := v.DeepCopy()
		v.Spec.Domain.Devices.Interfaces, v.Spec.Networks = v.Spec.Domain.Devices.Interfaces[:1], v.Spec.Networks[:1]
		spec := *v.Spec.DeepCopy()
		kept, placed, err := splitHotpluggedNICs(v, &spec, setups[:1])
		if err != nil || placed != nil || len(kept) != 1 || len(spec.Domain.Devices.Interfaces) != 1 || len(spec.Networks) != 1 {
			t.Errorf("got setups %+v placed %+v err %v, spec %+v", kept, placed, err, spec.Domain.Devices.Interfaces)
		}
	})

	t.Run("a hot-plugged interface without its root port is an error", func(t *testing.T) {
		v := v.DeepCopy()
		v.Status.Interfaces[1].RootPort = ""
		spec := *v.Spec.DeepCopy()
		_, _, err := splitHotpluggedNICs(v, &spec, setups)
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
	st := &launcher.Status{NICs: []launcher.NICStatus{{Name: "cold", MAC: "02:00:00:00:00:01"},
		{Name: "hot", MAC: "02:00:00:00:00:02", Hotplugged: true, Port: "hotplug1"}}}
	got := interfaces(v, nil, st)
	want := []v1alpha1.VirtualMachineInstanceNetworkInterface{{Name: "cold", MAC: "02:00:00:00:00:01"},
		{Name: "hot", MAC: "02:00:00:00:00:02", Hotplugged: true, RootPort: "hotplug1"}}
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
	st := &launcher.Status{
		Disks: []launcher.DiskStatus{{Name: "root"}},
		NICs:  []launcher.NICStatus{{Name: "default", Hotplugged: true}},
	}
	if err := unplugPending(v, st); err != nil {
		t.Errorf("nothing being unplugged: %v", err)
	}
	st.Disks = append(st.Disks, launcher.DiskStatus{Name: "old", Hotplugged: true})
	if err := unplugPending(v, st); err == nil || !strings.Contains(err.Error(), `disk "old" is still being unplugged`) {
		t.Errorf("a disk being unplugged: %v", err)
	}
	st.Disks = st.Disks[:1]
	st.NICs = append(st.NICs, launcher.NICStatus{Name: "gone", Hotplugged: true})
	if err := unplugPending(v, st); err == nil || !strings.Contains(err.Error(), `interface "gone" is still being unplugged`) {
		t.Errorf("an interface being unplugged: %v", err)
	}
}
