package v1alpha1

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/utils/ptr"
)

// nicVMI is a running instance without a pod interface: it booted with the interface "lab", a
// bridge NIC on a Multus network (accepted at creation), so a NIC can be hot-plugged into it.
func nicVMI() *VirtualMachineInstance {
	vmi := runningVMI()
	vmi.Spec.Domain.Devices.Interfaces = []Interface{{Name: "lab", Bridge: &InterfaceBridge{}, MacAddress: "02:00:00:00:00:01"}}
	vmi.Spec.Networks = []Network{{Name: "lab", Multus: &MultusNetwork{NetworkName: "lab-net"}}}
	vmi.Status.Interfaces = []VirtualMachineInstanceNetworkInterface{{Name: "lab", MAC: "02:00:00:00:00:01"}}
	return vmi
}

// nicUpdate is the one valid NIC hotplug the cases below start from: add "hot", a masquerade NIC
// on the pod network.
func nicUpdate(old *VirtualMachineInstance) *VirtualMachineInstance {
	vmi := old.DeepCopy()
	vmi.Spec.Domain.Devices.Interfaces = append(vmi.Spec.Domain.Devices.Interfaces,
		Interface{Name: "hot", Masquerade: &InterfaceMasquerade{}, Ports: []Port{{Port: 22}}, MacAddress: "02:00:00:00:00:02"})
	vmi.Spec.Networks = append(vmi.Spec.Networks, Network{Name: "hot", Pod: &PodNetwork{}})
	return vmi
}

// withHotNIC is nicVMI after the node agent plugged nicUpdate's "hot" and said so in the status.
func withHotNIC() *VirtualMachineInstance {
	vmi := nicUpdate(nicVMI())
	vmi.Status.Interfaces = append(vmi.Status.Interfaces,
		VirtualMachineInstanceNetworkInterface{Name: "hot", MAC: "02:00:00:00:00:02", Hotplugged: true})
	return vmi
}

func TestValidateNICHotplugUpdate(t *testing.T) {
	accepted := map[string]func() (old, vmi *VirtualMachineInstance){
		"add a masquerade NIC": func() (*VirtualMachineInstance, *VirtualMachineInstance) {
			return nicVMI(), nicUpdate(nicVMI())
		},
		"add a bridge NIC with model virtio": func() (*VirtualMachineInstance, *VirtualMachineInstance) {
			v := nicUpdate(nicVMI())
			v.Spec.Domain.Devices.Interfaces[1] = Interface{Name: "hot", Bridge: &InterfaceBridge{}, Model: "virtio"}
			return nicVMI(), v
		},
		"add a NIC with neither binding (masquerade)": func() (*VirtualMachineInstance, *VirtualMachineInstance) {
			v := nicUpdate(nicVMI())
			v.Spec.Domain.Devices.Interfaces[1] = Interface{Name: "hot"}
			return nicVMI(), v
		},
		"remove a hot-plugged NIC": func() (*VirtualMachineInstance, *VirtualMachineInstance) {
			return withHotNIC(), nicVMI()
		},
	}
	for name, mk := range accepted {
		t.Run("accepted: "+name, func(t *testing.T) {
			old, vmi := mk()
			if errs := ValidateVirtualMachineInstanceUpdate(old, vmi); len(errs) != 0 {
				t.Fatalf("refused: %v", errs)
			}
		})
	}

	const (
		ifaces = "spec.domain.devices.interfaces"
		nets   = "spec.networks"
	)
	cases := []struct {
		name   string
		old    func() *VirtualMachineInstance
		mutate func(old, vmi *VirtualMachineInstance)
		path   string
		msg    string
	}{
		{"added NIC without its network", nicVMI, func(_, v *VirtualMachineInstance) { v.Spec.Networks = v.Spec.Networks[:1] },
			ifaces + "[1].name", ""},
		{"added NIC on a multus network", nicVMI, func(_, v *VirtualMachineInstance) {
			v.Spec.Networks[1] = Network{Name: "hot", Multus: &MultusNetwork{NetworkName: "other"}}
			v.Spec.Domain.Devices.Interfaces[1].Masquerade = nil
		}, nets + "[1].multus", "a multus network cannot be hot-plugged"},
		{"added e1000 NIC", nicVMI, func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Interfaces[1].Model = "e1000e" },
			ifaces + "[1].model", `Unsupported value: "e1000e"`},
		{"added NIC with both bindings", nicVMI, func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces[1].Bridge = &InterfaceBridge{}
		}, ifaces + "[1].bridge", "one binding"},
		{"added NIC with a MAC already in use", nicVMI, func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces[1].MacAddress = "02:00:00:00:00:01"
		}, ifaces + "[1].macAddress", "Duplicate"},
		{"second pod NIC", withHotNIC, func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces = append(v.Spec.Domain.Devices.Interfaces, Interface{Name: "hot2"})
			v.Spec.Networks = append(v.Spec.Networks, Network{Name: "hot2", Pod: &PodNetwork{}})
		}, ifaces + "[2]", `interface "hot" already uses the pod network`},
		{"pod NIC swapped for another in one update", withHotNIC, func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces[1].Name = "hot2"
			v.Spec.Networks[1].Name = "hot2"
		}, ifaces + "[1]", "remove it before adding another"},
		{"pod NIC added to the sample instance", runningVMI, nil, ifaces + "[1]", `interface "default" already uses the pod network`},
		{"boot NIC removed", nicVMI, func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces = v.Spec.Domain.Devices.Interfaces[1:]
			v.Spec.Networks = v.Spec.Networks[1:]
		}, ifaces + "[lab]", "status.interfaces[].hotplugged"},
		{"boot network removed with its NIC", nicVMI, func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces = v.Spec.Domain.Devices.Interfaces[1:]
			v.Spec.Networks = v.Spec.Networks[1:]
		}, nets + "[lab]", "was attached at start"},
		{"hot NIC removed before the status says hot-plugged", withHotNIC, func(o, v *VirtualMachineInstance) {
			o.Status.Interfaces[1].Hotplugged = false
			v.Spec.Domain.Devices.Interfaces = v.Spec.Domain.Devices.Interfaces[:1]
			v.Spec.Networks = v.Spec.Networks[:1]
		}, ifaces + "[hot]", "was attached at start"},
		{"hot NIC's ports changed", withHotNIC, func(o, v *VirtualMachineInstance) {
			*v = *o.DeepCopy()
			v.Spec.Domain.Devices.Interfaces[1].Ports = nil
		}, ifaces + "[1].ports", `interface "hot" is attached`},
		{"boot NIC's binding changed", nicVMI, func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces[0].Bridge = nil
		}, ifaces + "[0].bridge", `interface "lab" is attached`},
		{"boot network's attachment changed", nicVMI, func(_, v *VirtualMachineInstance) {
			v.Spec.Networks[0].Multus.NetworkName = "lab-net2"
		}, nets + "[0].multus.networkName", `network "lab" is in use`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := tc.old()
			vmi := nicUpdate(old)
			if tc.mutate != nil {
				tc.mutate(old, vmi)
			}
			errs := ValidateVirtualMachineInstanceUpdate(old, vmi)
			for _, e := range errs {
				if e.Field == tc.path && strings.Contains(e.Error(), tc.msg) {
					return
				}
			}
			t.Fatalf("want an error at %s with %q, got %v", tc.path, tc.msg, errs)
		})
	}
}

func TestAddedInterfacesAndPodInterface(t *testing.T) {
	old := nicVMI()
	vmi := nicUpdate(old)
	if got := AddedInterfaces(old, vmi); !slices.Equal(got, []int{1}) {
		t.Fatalf("added interfaces %v, want [1]", got)
	}
	if got := PodInterface(&old.Spec); got != "" {
		t.Fatalf("pod interface of an instance on multus only: %q", got)
	}
	if got := PodInterface(&vmi.Spec); got != "hot" {
		t.Fatalf("pod interface %q, want hot", got)
	}
}

// A bridge NIC hot-plugged on the pod network ends live migration, as one present at start does.
func TestLiveMigratableWithHotpluggedNIC(t *testing.T) {
	old := nicVMI()
	old.Spec.Domain.Devices.Interfaces, old.Spec.Networks = nil, nil
	old.Status.Interfaces = nil
	// So that only the NIC decides: shared host disk, read-only root.
	old.Spec.Volumes[2].HostDisk.Shared = ptr.To(true)
	old.Spec.Domain.Devices.Disks[0].Disk.ReadOnly = true
	if ok, reason, _ := LiveMigratable(&old.Spec); !ok {
		t.Fatalf("an instance without NICs is not migratable: %s", reason)
	}
	masq := nicUpdate(old)
	if errs := ValidateVirtualMachineInstanceUpdate(old, masq); len(errs) != 0 {
		t.Fatalf("masquerade hotplug refused: %v", errs)
	}
	if ok, reason, _ := LiveMigratable(&masq.Spec); !ok {
		t.Fatalf("a hot-plugged masquerade NIC made the instance not migratable: %s", reason)
	}
	bridge := masq.DeepCopy()
	bridge.Spec.Domain.Devices.Interfaces[0] = Interface{Name: "hot", Bridge: &InterfaceBridge{}}
	if errs := ValidateVirtualMachineInstanceUpdate(old, bridge); len(errs) != 0 {
		t.Fatalf("bridge hotplug refused: %v", errs)
	}
	ok, reason, msg := LiveMigratable(&bridge.Spec)
	if ok || reason != InterfaceNotLiveMigratableReason || !strings.Contains(msg, `"hot"`) {
		t.Fatalf("hot-plugged bridge NIC: migratable=%v reason=%s message=%q, want %s naming hot", ok, reason, msg, InterfaceNotLiveMigratableReason)
	}
}
