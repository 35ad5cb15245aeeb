package v1alpha1

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// runningVMI is an instance as it runs: booted with root and cidata, and with "hot" attached
// later (its volume status says hot-plugged).
func runningVMI() *VirtualMachineInstance {
	vm := validVM()
	vmi := &VirtualMachineInstance{Spec: *vm.Spec.Template.Spec.DeepCopy()}
	vmi.Name = "vm1"
	vmi.Spec.Domain.Devices.Disks = append(vmi.Spec.Domain.Devices.Disks, Disk{Name: "hot", Disk: &DiskTarget{Bus: DiskBusVirtio}})
	vmi.Spec.Volumes = append(vmi.Spec.Volumes, Volume{Name: "hot", VolumeSource: VolumeSource{
		HostDisk: &HostDisk{Path: "/var/lib/qvirt/hot.img", Type: HostDiskExists}}})
	vmi.Status.VolumeStatus = []VolumeStatus{
		{Name: "root", Phase: VolumeReady}, {Name: "cidata", Phase: VolumeReady},
		{Name: "hot", Phase: VolumeReady, Hotplugged: true},
	}
	return vmi
}

// hotplugUpdate is the one valid update the cases below start from: add the emptyDisk "data"
// and remove the hot-plugged "hot".
func hotplugUpdate(old *VirtualMachineInstance) *VirtualMachineInstance {
	vmi := old.DeepCopy()
	s := &vmi.Spec
	s.Domain.Devices.Disks = append(s.Domain.Devices.Disks[:2], Disk{Name: "data", Disk: &DiskTarget{Bus: DiskBusVirtio}, Serial: "DATA1"})
	s.Volumes = append(s.Volumes[:2], Volume{Name: "data", VolumeSource: VolumeSource{
		EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}})
	return vmi
}

func TestValidateVirtualMachineInstanceUpdate(t *testing.T) {
	old := runningVMI()
	if errs := ValidateVirtualMachineInstanceUpdate(old, hotplugUpdate(old)); len(errs) != 0 {
		t.Fatalf("the base update must be valid, got %v", errs)
	}
	const (
		disks = "spec.domain.devices.disks"
		vols  = "spec.volumes"
	)
	cases := []struct {
		name   string
		mutate func(old, vmi *VirtualMachineInstance)
		path   string
	}{
		{"memory", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Memory.Guest = ptr.To(resource.MustParse("512Mi")) }, "spec.domain.memory.guest"},
		{"cpu cores", func(_, v *VirtualMachineInstance) { v.Spec.Domain.CPU.Cores = 4 }, "spec.domain.cpu.cores"},
		{"cpu removed", func(_, v *VirtualMachineInstance) { v.Spec.Domain.CPU = nil }, "spec.domain.cpu"},
		{"machine added", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Machine = &Machine{Type: "q35"} }, "spec.domain.machine"},
		{"resources", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Resources.OvercommitGuestOverhead = true }, "spec.domain.resources.overcommitGuestOverhead"},
		{"serial console", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.AutoattachSerialConsole = ptr.To(false) }, "spec.domain.devices.autoattachSerialConsole"},
		{"interface MAC", func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Interfaces[0].MacAddress = "02:00:00:00:00:09"
		}, "spec.domain.devices.interfaces[0].macAddress"},
		{"node selector", func(_, v *VirtualMachineInstance) { v.Spec.NodeSelector = map[string]string{"a": "b"} }, "spec.nodeSelector"},
		{"hostname", func(_, v *VirtualMachineInstance) { v.Spec.Hostname = "other" }, "spec.hostname"},
		{"grace period", func(_, v *VirtualMachineInstance) { v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5) }, "spec.terminationGracePeriodSeconds"},
		{"networks", func(_, v *VirtualMachineInstance) { v.Spec.Networks[0].Pod.VMNetworkCIDR = "10.1.0.0/24" }, "spec.networks[0].pod.vmNetworkCIDR"},
		{"boot disk removed", func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Disks = v.Spec.Domain.Devices.Disks[1:]
			v.Spec.Volumes = v.Spec.Volumes[1:]
		}, disks + "[root]"},
		{"boot volume removed with its disk", func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Disks = v.Spec.Domain.Devices.Disks[1:]
			v.Spec.Volumes = v.Spec.Volumes[1:]
		}, vols + "[root]"},
		{"hot disk removed without hotplugged status", func(o, _ *VirtualMachineInstance) {
			o.Status.VolumeStatus[2].Hotplugged = false
		}, disks + "[hot]"},
		{"boot disk serial changed", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Disks[0].Serial = "X" }, disks + "[0].serial"},
		{"boot disk bus changed", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Disks[0].Disk.Bus = DiskBusSCSI }, disks + "[0].disk.bus"},
		{"boot volume image changed", func(_, v *VirtualMachineInstance) {
			v.Spec.Volumes[0].ContainerDisk.Image = "example/disk:2"
		}, vols + "[0].containerDisk.image"},
		{"hot volume path changed", func(o, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, *o.Spec.Domain.Devices.Disks[2].DeepCopy())
			v.Spec.Volumes = append(v.Spec.Volumes, *o.Spec.Volumes[2].DeepCopy())
			v.Spec.Volumes[3].HostDisk.Path = "/var/lib/qvirt/other.img"
		}, vols + "[3].hostDisk.path"},
		{"added cdrom", func(_, v *VirtualMachineInstance) {
			v.Spec.Domain.Devices.Disks[2] = Disk{Name: "data", CDRom: &CDRomTarget{Bus: DiskBusSATA}}
		}, disks + "[2].cdrom"},
		{"added disk on sata", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Disks[2].Disk.Bus = DiskBusSATA }, disks + "[2].disk.bus"},
		{"added disk with a boot order", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Disks[2].BootOrder = ptr.To[uint32](2) }, disks + "[2].bootOrder"},
		{"added disk with writeback cache", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Disks[2].Cache = CacheWriteBack }, disks + "[2].cache"},
		{"added disk with native io", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Disks[2].IO = IONative }, disks + "[2].io"},
		{"added disk with a bad serial", func(_, v *VirtualMachineInstance) { v.Spec.Domain.Devices.Disks[2].Serial = "a b" }, disks + "[2].serial"},
		{"added disk without volume", func(_, v *VirtualMachineInstance) { v.Spec.Volumes = v.Spec.Volumes[:2] }, disks + "[2].name"},
		{"added container disk", func(_, v *VirtualMachineInstance) {
			v.Spec.Volumes[2].VolumeSource = VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "example/data:1"}}
		}, vols + "[2].containerDisk"},
		{"added claim", func(_, v *VirtualMachineInstance) {
			v.Spec.Volumes[2].VolumeSource = VolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "data"}}
		}, vols + "[2].persistentVolumeClaim"},
		{"added empty disk of no size", func(_, v *VirtualMachineInstance) {
			v.Spec.Volumes[2].EmptyDisk.Capacity = resource.MustParse("0")
		}, vols + "[2].emptyDisk.capacity"},
		{"added host disk with a relative path", func(_, v *VirtualMachineInstance) {
			v.Spec.Volumes[2].VolumeSource = VolumeSource{HostDisk: &HostDisk{Path: "data.img", Type: HostDiskExists}}
		}, vols + "[2].hostDisk.path"},
		{"added volume with two sources", func(_, v *VirtualMachineInstance) {
			v.Spec.Volumes[2].HostDisk = &HostDisk{Path: "/var/lib/qvirt/d.img", Type: HostDiskExists}
		}, vols + "[2]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			old := runningVMI()
			vmi := hotplugUpdate(old)
			tc.mutate(old, vmi)
			errs := ValidateVirtualMachineInstanceUpdate(old, vmi)
			if !hasPath(errs, tc.path) {
				t.Fatalf("want an error at %s, got %v", tc.path, errs)
			}
		})
	}
}

// TestDisableHotplugRefusesHotplug: an instance created with disableHotplug takes no hot-plug,
// each list refused naming the field that disables it.
func TestDisableHotplugRefusesHotplug(t *testing.T) {
	old := runningVMI()
	old.Spec.Domain.Devices.DisableHotplug = true
	vmi := hotplugUpdate(old)
	vmi.Spec.Domain.Devices.DisableHotplug = true
	errs := ValidateVirtualMachineInstanceUpdate(old, vmi)
	got := map[string]bool{}
	for _, e := range errs {
		if strings.Contains(e.Detail, "spec.domain.devices.disableHotplug") {
			got[e.Field] = true
		}
	}
	if !got["spec.domain.devices.disks"] || !got["spec.volumes"] {
		t.Fatalf("errors %v, want the disks and volumes refused naming spec.domain.devices.disableHotplug", errs)
	}
}

func TestImmutableFieldMessages(t *testing.T) {
	old := runningVMI()
	vmi := old.DeepCopy()
	vmi.Spec.Domain.Memory.Guest = ptr.To(resource.MustParse("1Gi"))
	errs := ValidateVirtualMachineInstanceUpdate(old, vmi)
	want := "spec.domain.memory.guest is immutable; only volumes, disks, interfaces and networks can be hot-plugged"
	if len(errs) != 1 || errs[0].Type != field.ErrorTypeForbidden || errs[0].Detail != want {
		t.Fatalf("want one Forbidden %q, got %v", want, errs)
	}
}

func TestUnchangedSpecAlwaysAccepted(t *testing.T) {
	// An instance created under older rules (here: a sata hot disk) must still take metadata
	// updates, or its finalizers could never be removed.
	old := runningVMI()
	old.Spec.Domain.Devices.Disks[2].Disk.Bus = DiskBusSATA
	old.Spec.Domain.Memory = nil
	vmi := old.DeepCopy()
	vmi.Finalizers = []string{GracefulShutdownFinalizer}
	vmi.Status.VolumeStatus = nil
	if errs := ValidateVirtualMachineInstanceUpdate(old, vmi); len(errs) != 0 {
		t.Fatalf("metadata-only update refused: %v", errs)
	}
}

func TestAddedVolumes(t *testing.T) {
	old := runningVMI()
	if got := AddedVolumes(old, hotplugUpdate(old)); !slices.Equal(got, []int{2}) {
		t.Fatalf("added volumes %v, want [2]", got)
	}
	if got := AddedVolumes(old, old); len(got) != 0 {
		t.Fatalf("added volumes of an unchanged spec %v, want none", got)
	}
}

// The CRD must freeze exactly the fields the Go validator freezes: one CEL rule per field of
// HotplugImmutableFields on the VMI's spec, with the same message.
func TestCRDFreezesEveryImmutableField(t *testing.T) {
	data, err := os.ReadFile("../../config/crd/bases/qvirt.io_virtualmachineinstances.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Rules []struct{ Rule, Message, FieldPath string } `json:"x-kubernetes-validations"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &crd); err != nil || len(crd.Spec.Versions) != 1 {
		t.Fatalf("parse CRD: %v (%d versions)", err, len(crd.Spec.Versions))
	}
	rules := map[string]string{}
	for _, r := range crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Rules {
		// The per-item rules on the hot-pluggable interfaces and networks are not freezes.
		if strings.Contains(r.Rule, "oldSelf") && r.FieldPath != ".domain.devices.interfaces" && r.FieldPath != ".networks" {
			rules[r.FieldPath] = r.Message
		}
	}
	fields := HotplugImmutableFields()
	if len(fields) < 15 {
		t.Fatalf("only %d immutable fields found: %v", len(fields), fields)
	}
	for _, f := range fields {
		if got, want := rules["."+f], ImmutableMessage("spec."+f); got != want {
			t.Errorf("CRD rule for spec.%s: message %q, want %q (add the XValidation marker on VirtualMachineInstance.Spec)", f, got, want)
		}
	}
	if len(rules) != len(fields) {
		t.Errorf("the VMI spec has %d transition rules for %d immutable fields", len(rules), len(fields))
	}
}

// FuzzValidateVirtualMachineInstanceUpdate feeds arbitrary pairs of instances ({"old":...,"new":...})
// to the update validator: it must never panic, every error must name a field, an unchanged spec is
// always accepted, and validation is deterministic.
func FuzzValidateVirtualMachineInstanceUpdate(f *testing.F) {
	type pair struct {
		Old *VirtualMachineInstance `json:"old"`
		New *VirtualMachineInstance `json:"new"`
	}
	old, nic := runningVMI(), nicVMI()
	for _, p := range []pair{{old, hotplugUpdate(old)}, {hotplugUpdate(old), old}, {old, old},
		{nic, nicUpdate(nic)}, {withHotNIC(), nic}, {nic, withHotNIC()}, {old, nicUpdate(old)}} {
		data, _ := json.Marshal(p)
		f.Add(data)
	}
	f.Add([]byte(`{"old":{"spec":{"volumes":[{"name":"x","emptyDisk":{"capacity":"1Gi"}}]}},"new":{"spec":{}}}`))
	f.Add([]byte(`{"old":{"spec":{}},"new":{"spec":{"domain":{"devices":{"interfaces":[{"name":"n","model":"e1000"}]}},"networks":[{"name":"n","multus":{}}]}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var p pair
		if json.Unmarshal(data, &p) != nil || p.Old == nil || p.New == nil {
			return
		}
		errs := ValidateVirtualMachineInstanceUpdate(p.Old, p.New)
		for _, e := range errs {
			if e.Field == "" {
				t.Fatalf("error without a field path: %v", e)
			}
		}
		if again := ValidateVirtualMachineInstanceUpdate(p.Old, p.New); len(again) != len(errs) {
			t.Fatalf("validation is not deterministic: %d then %d errors", len(errs), len(again))
		}
		if same := ValidateVirtualMachineInstanceUpdate(p.Old, p.Old.DeepCopy()); len(same) != 0 {
			t.Fatalf("an unchanged spec was refused: %v", same)
		}
	})
}

// TestSocketsUpdate: a running instance with maxSockets may grow its sockets up to maxSockets
// (CPU hotplug); shrinking them, going past maxSockets, changing another CPU field, or any sockets
// change without maxSockets is refused naming the field.
func TestSocketsUpdate(t *testing.T) {
	vmi := func(sockets, maxSockets uint32, cores uint32) *VirtualMachineInstance {
		v := &VirtualMachineInstance{}
		v.Spec.Domain.CPU = &CPU{Sockets: sockets, Cores: cores, Threads: 1, MaxSockets: maxSockets}
		v.Spec.Domain.Memory = &Memory{Guest: ptr.To(resource.MustParse("128Mi"))}
		return v
	}
	for _, tc := range []struct {
		name     string
		old, new *VirtualMachineInstance
		path     string
	}{
		{"grow within maxSockets", vmi(1, 4, 1), vmi(3, 4, 1), ""},
		{"grow to maxSockets", vmi(1, 4, 1), vmi(4, 4, 1), ""},
		{"shrink", vmi(2, 4, 1), vmi(1, 4, 1), "spec.domain.cpu.sockets"},
		{"past maxSockets", vmi(1, 4, 1), vmi(5, 4, 1), "spec.domain.cpu.sockets"},
		{"another CPU field", vmi(1, 4, 1), vmi(2, 4, 2), "spec.domain.cpu.cores"},
		{"maxSockets itself", vmi(1, 4, 1), vmi(1, 8, 1), "spec.domain.cpu.maxSockets"},
		{"without maxSockets", vmi(1, 0, 1), vmi(2, 0, 1), "spec.domain.cpu.sockets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateVirtualMachineInstanceUpdate(tc.old, tc.new)
			if tc.path == "" && len(errs) != 0 || tc.path != "" && !hasPath(errs, tc.path) {
				t.Errorf("errors %v, want %s", errs, map[bool]string{true: "none", false: "one at " + tc.path}[tc.path == ""])
			}
		})
	}
}

// TestGuestMemoryUpdate: a running instance with maxGuest may grow memory.guest up to maxGuest
// (memory hotplug) in whole 2Mi blocks; shrinking it, going past maxGuest, part of a block, or any
// change without maxGuest is refused naming the field.
func TestGuestMemoryUpdate(t *testing.T) {
	vmi := func(guest, maxGuest string) *VirtualMachineInstance {
		v := &VirtualMachineInstance{}
		v.Spec.Domain.Memory = &Memory{Guest: ptr.To(resource.MustParse(guest))}
		if maxGuest != "" {
			v.Spec.Domain.Memory.MaxGuest = ptr.To(resource.MustParse(maxGuest))
		}
		return v
	}
	for _, tc := range []struct {
		name     string
		old, new *VirtualMachineInstance
		path     string
	}{
		{"grow within maxGuest", vmi("1Gi", "4Gi"), vmi("1536Mi", "4Gi"), ""},
		{"grow to maxGuest", vmi("1Gi", "4Gi"), vmi("4Gi", "4Gi"), ""},
		{"shrink", vmi("2Gi", "4Gi"), vmi("1Gi", "4Gi"), "spec.domain.memory.guest"},
		{"past maxGuest", vmi("1Gi", "4Gi"), vmi("5Gi", "4Gi"), "spec.domain.memory.guest"},
		{"part of a block", vmi("1Gi", "4Gi"), vmi("1025Mi", "4Gi"), "spec.domain.memory.guest"},
		{"maxGuest itself", vmi("1Gi", "4Gi"), vmi("1Gi", "8Gi"), "spec.domain.memory.maxGuest"},
		{"without maxGuest", vmi("1Gi", ""), vmi("2Gi", ""), "spec.domain.memory.guest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := ValidateVirtualMachineInstanceUpdate(tc.old, tc.new)
			if tc.path == "" && len(errs) != 0 || tc.path != "" && !hasPath(errs, tc.path) {
				t.Errorf("errors %v, want %s", errs, map[bool]string{true: "none", false: "one at " + tc.path}[tc.path == ""])
			}
		})
	}
}
