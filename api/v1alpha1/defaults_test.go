package v1alpha1

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

func TestSetDefaultsFillsKubeVirtDefaults(t *testing.T) {
	spec := VirtualMachineInstanceSpec{Domain: DomainSpec{Devices: Devices{
		Disks:      []Disk{{Name: "root"}, {Name: "iso", CDRom: &CDRomTarget{}}, {Name: "data", Disk: &DiskTarget{}}},
		Interfaces: []Interface{{Name: "default"}},
	}}}
	SetDefaults(&spec)
	d := spec.Domain
	checks := []struct {
		field, got, want string
	}{
		{"domain.machine.type", d.Machine.Type, "q35"},
		{"disks[root].disk.bus", string(d.Devices.Disks[0].Disk.Bus), "virtio"},
		{"disks[iso].cdrom.bus", string(d.Devices.Disks[1].CDRom.Bus), "sata"},
		{"disks[data].disk.bus", string(d.Devices.Disks[2].Disk.Bus), "virtio"},
		{"interfaces[default].model", d.Devices.Interfaces[0].Model, "virtio"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.field, c.got, c.want)
		}
	}
	if got := *spec.TerminationGracePeriodSeconds; got != 180 {
		t.Errorf("terminationGracePeriodSeconds = %d, want 180", got)
	}
	if ro := d.Devices.Disks[1].CDRom.ReadOnly; ro == nil || !*ro {
		t.Errorf("cdrom readonly = %v, want true", ro)
	}
	if !*d.Devices.AutoattachSerialConsole || !*d.Devices.AutoattachGraphicsDevice {
		t.Error("serial console and graphics are not attached by default")
	}
}

func TestSetDefaultsKeepsWhatIsSet(t *testing.T) {
	spec := VirtualMachineInstanceSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Domain: DomainSpec{
			Machine: &Machine{Type: "pc-q35-8.2"},
			Devices: Devices{
				AutoattachGraphicsDevice: ptr.To(false),
				Disks:                    []Disk{{Name: "iso", CDRom: &CDRomTarget{Bus: DiskBusSCSI}}},
				Interfaces:               []Interface{{Name: "default", Model: "e1000"}},
			},
		},
	}
	SetDefaults(&spec)
	if *spec.TerminationGracePeriodSeconds != 0 || spec.Domain.Machine.Type != "pc-q35-8.2" ||
		*spec.Domain.Devices.AutoattachGraphicsDevice || spec.Domain.Devices.Disks[0].CDRom.Bus != DiskBusSCSI ||
		spec.Domain.Devices.Interfaces[0].Model != "e1000" {
		t.Fatalf("a set field was overwritten: %+v", spec)
	}
}

func TestSetDefaultsSecureBootWithEFI(t *testing.T) {
	spec := VirtualMachineInstanceSpec{Domain: DomainSpec{Firmware: &Firmware{Bootloader: &Bootloader{EFI: &EFI{}}}}}
	SetDefaults(&spec)
	if sb := spec.Domain.Firmware.Bootloader.EFI.SecureBoot; sb == nil || !*sb {
		t.Errorf("efi.secureBoot = %v, want true as in KubeVirt", sb)
	}
	off := VirtualMachineInstanceSpec{Domain: DomainSpec{Firmware: &Firmware{Bootloader: &Bootloader{EFI: &EFI{SecureBoot: ptr.To(false)}}}}}
	SetDefaults(&off)
	if *off.Domain.Firmware.Bootloader.EFI.SecureBoot {
		t.Error("secureBoot: false was overwritten")
	}
	bios := VirtualMachineInstanceSpec{}
	SetDefaults(&bios)
	if bios.Domain.Firmware != nil {
		t.Errorf("a spec without firmware got one: %+v", bios.Domain.Firmware)
	}
}

// TestSetDefaultsKubeVirtRules checks each of KubeVirt's defaulting rules SetDefaults adopts
// (docs/kubevirt-compat.md), one spec per rule.
func TestSetDefaultsKubeVirtRules(t *testing.T) {
	mem := func(q string) *resource.Quantity { v := resource.MustParse(q); return &v }
	cases := []struct {
		name  string
		spec  VirtualMachineInstanceSpec
		check func(t *testing.T, s *VirtualMachineInstanceSpec)
	}{
		{"a volume without a disk gets a virtio disk, cloud-init included, in volume order; a lun is on scsi",
			VirtualMachineInstanceSpec{
				Domain: DomainSpec{Devices: Devices{Disks: []Disk{{Name: "iso", CDRom: &CDRomTarget{}}, {Name: "san", LUN: &LunTarget{}}}}},
				Volumes: []Volume{
					{Name: "root", VolumeSource: VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "r:1"}}},
					{Name: "iso", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}},
					{Name: "san", VolumeSource: VolumeSource{PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "san"}}},
					{Name: "cloudinit", VolumeSource: VolumeSource{CloudInitNoCloud: &CloudInitNoCloudSource{UserData: "#cloud-config"}}},
				},
			},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				var got []string
				for _, d := range s.Domain.Devices.Disks {
					switch {
					case d.Disk != nil:
						got = append(got, d.Name+":disk:"+string(d.Disk.Bus))
					case d.CDRom != nil:
						got = append(got, d.Name+":cdrom:"+string(d.CDRom.Bus))
					case d.LUN != nil:
						got = append(got, d.Name+":lun:"+string(d.LUN.Bus))
					}
				}
				if want := []string{"iso:cdrom:sata", "san:lun:scsi", "root:disk:virtio", "cloudinit:disk:virtio"}; !slices.Equal(got, want) {
					t.Errorf("disks %v, want %v", got, want)
				}
			}},
		{"no interface and no network: the pod network with masquerade",
			VirtualMachineInstanceSpec{},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				in, n := s.Domain.Devices.Interfaces, s.Networks
				if len(in) != 1 || in[0].Name != "default" || in[0].Masquerade == nil || in[0].Model != "virtio" ||
					len(n) != 1 || n[0].Name != "default" || n[0].Pod == nil {
					t.Errorf("interfaces %+v, networks %+v: want default masquerade on the pod network", in, n)
				}
			}},
		{"an interface on a secondary multus network without a binding gets bridge; the default network keeps masquerade",
			VirtualMachineInstanceSpec{
				Domain: DomainSpec{Devices: Devices{Interfaces: []Interface{{Name: "default"}, {Name: "lab"}}}},
				Networks: []Network{{Name: "default", Multus: &MultusNetwork{NetworkName: "flat", Default: true}},
					{Name: "lab", Multus: &MultusNetwork{NetworkName: "ns/lab"}}},
			},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				in := s.Domain.Devices.Interfaces
				if in[0].Bridge != nil || in[1].Bridge == nil || in[1].Masquerade != nil {
					t.Errorf("interfaces %+v: want default unbound (masquerade) and lab bridge", in)
				}
			}},
		{"autoattachPodInterface false: no network",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Devices: Devices{AutoattachPodInterface: ptr.To(false)}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if len(s.Domain.Devices.Interfaces) != 0 || len(s.Networks) != 0 {
					t.Errorf("interfaces %+v, networks %+v: want none", s.Domain.Devices.Interfaces, s.Networks)
				}
			}},
		{"a network without an interface gets no default",
			VirtualMachineInstanceSpec{Networks: []Network{{Name: "net", Pod: &PodNetwork{}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if len(s.Domain.Devices.Interfaces) != 0 || len(s.Networks) != 1 {
					t.Errorf("interfaces %+v, networks %+v: want them as written", s.Domain.Devices.Interfaces, s.Networks)
				}
			}},
		{"memory.guest from requests.memory",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Resources: ResourceRequirements{
				Requests: corev1.ResourceList{"memory": resource.MustParse("1Gi")}, Limits: corev1.ResourceList{"memory": resource.MustParse("2Gi")}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if g := s.Domain.Memory.Guest; g == nil || g.Cmp(*mem("1Gi")) != 0 {
					t.Errorf("memory.guest %v, want 1Gi", g)
				}
			}},
		{"memory.guest from limits.memory without a request",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Resources: ResourceRequirements{Limits: corev1.ResourceList{"memory": resource.MustParse("2Gi")}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if g := s.Domain.Memory.Guest; g == nil || g.Cmp(*mem("2Gi")) != 0 {
					t.Errorf("memory.guest %v, want 2Gi", g)
				}
			}},
		{"memory.guest one huge page without requests or limits",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Memory: &Memory{Hugepages: &Hugepages{PageSize: "1Gi"}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if g := s.Domain.Memory.Guest; g == nil || g.Cmp(*mem("1Gi")) != 0 {
					t.Errorf("memory.guest %v, want 1Gi", g)
				}
			}},
		{"memory.guest as written",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Memory: &Memory{Guest: mem("256Mi")},
				Resources: ResourceRequirements{Requests: corev1.ResourceList{"memory": resource.MustParse("1Gi")}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if g := s.Domain.Memory.Guest; g.Cmp(*mem("256Mi")) != 0 {
					t.Errorf("memory.guest %v, want 256Mi", g)
				}
			}},
		{"sockets from limits.cpu, rounded up",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Resources: ResourceRequirements{
				Requests: corev1.ResourceList{"cpu": resource.MustParse("4")}, Limits: corev1.ResourceList{"cpu": resource.MustParse("1500m")}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if c := *s.Domain.CPU; c.Sockets != 2 || c.Cores != 1 || c.Threads != 1 {
					t.Errorf("cpu %+v, want 2 sockets of 1 core and 1 thread", c)
				}
			}},
		{"sockets from requests.cpu",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Resources: ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("3")}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if c := *s.Domain.CPU; c.Sockets != 3 || c.Cores != 1 || c.Threads != 1 {
					t.Errorf("cpu %+v, want 3 sockets", c)
				}
			}},
		{"one socket without resources, the model kept",
			VirtualMachineInstanceSpec{Domain: DomainSpec{CPU: &CPU{Model: "qemu64"}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if c := *s.Domain.CPU; c.Sockets != 1 || c.Cores != 1 || c.Threads != 1 || c.Model != "qemu64" {
					t.Errorf("cpu %+v, want 1/1/1 qemu64", c)
				}
			}},
		{"a topology as written",
			VirtualMachineInstanceSpec{Domain: DomainSpec{CPU: &CPU{Cores: 2},
				Resources: ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("8")}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if c := *s.Domain.CPU; c.Sockets != 0 || c.Cores != 2 || c.Threads != 0 {
					t.Errorf("cpu %+v, want cores 2 alone", c)
				}
			}},
		{"machine type empty",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Machine: &Machine{}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if s.Domain.Machine.Type != "q35" {
					t.Errorf("machine.type %q, want q35", s.Domain.Machine.Type)
				}
			}},
		{"cdrom readonly false kept",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Devices: Devices{Disks: []Disk{{Name: "iso", CDRom: &CDRomTarget{ReadOnly: ptr.To(false)}}}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if ro := s.Domain.Devices.Disks[0].CDRom.ReadOnly; *ro {
					t.Error("readonly: false was overwritten")
				}
			}},
		{"an input is a USB tablet, a watchdog an i6300esb that resets, the APIC enabled",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Features: &Features{APIC: &FeatureAPIC{}},
				Devices: Devices{Inputs: []Input{{Name: "t"}, {Name: "v", Bus: InputBusVirtio}}, Watchdog: &Watchdog{Name: "wd"}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				in := s.Domain.Devices.Inputs
				if in[0].Bus != InputBusUSB || in[0].Type != InputTypeTablet || in[1].Bus != InputBusVirtio || in[1].Type != InputTypeTablet {
					t.Errorf("inputs %+v, want a USB tablet and a virtio tablet", in)
				}
				if w := s.Domain.Devices.Watchdog; w.I6300ESB == nil || w.I6300ESB.Action != WatchdogActionReset {
					t.Errorf("watchdog %+v, want i6300esb with action reset", w)
				}
				if a := s.Domain.Features.APIC; a.Enabled == nil || !*a.Enabled || a.EndOfInterrupt {
					t.Errorf("apic %+v, want enabled without endOfInterrupt", a)
				}
			}},
		{"a present feature is enabled",
			VirtualMachineInstanceSpec{Domain: DomainSpec{Features: &Features{ACPI: &FeatureState{}}}},
			func(t *testing.T, s *VirtualMachineInstanceSpec) {
				if f := s.Domain.Features; f.ACPI.Enabled == nil || !*f.ACPI.Enabled || f.SMM != nil {
					t.Errorf("features %+v: want acpi enabled, smm absent", f)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			SetDefaults(&tc.spec)
			tc.check(t, &tc.spec)
			again := tc.spec.DeepCopy()
			SetDefaults(again)
			if !equality.Semantic.DeepEqual(again, &tc.spec) {
				t.Errorf("not idempotent:\n%+v\n%+v", again, tc.spec)
			}
		})
	}
}

// FillDefaults, which the node agent's translation applies, adds no device and derives nothing:
// an instance stored before admission recorded defaults keeps the devices it was admitted with.
func TestFillDefaultsAddsNoDevice(t *testing.T) {
	spec := VirtualMachineInstanceSpec{
		Domain:  DomainSpec{Resources: ResourceRequirements{Requests: corev1.ResourceList{"cpu": resource.MustParse("2"), "memory": resource.MustParse("1Gi")}}},
		Volumes: []Volume{{Name: "v", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}}},
	}
	FillDefaults(&spec)
	if d := spec.Domain; len(d.Devices.Disks) != 0 || len(d.Devices.Interfaces) != 0 || len(spec.Networks) != 0 || d.CPU != nil || d.Memory != nil {
		t.Fatalf("FillDefaults added a device or a derived value: %+v", spec)
	}
}

// The VM mutator records only the template's machine type.
func TestSetVirtualMachineDefaults(t *testing.T) {
	vm := VirtualMachineSpec{Template: VirtualMachineInstanceTemplateSpec{Spec: VirtualMachineInstanceSpec{
		Volumes: []Volume{{Name: "v", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}}},
	}}}
	SetVirtualMachineDefaults(&vm)
	s := vm.Template.Spec
	if s.Domain.Machine == nil || s.Domain.Machine.Type != "q35" {
		t.Fatalf("machine %+v, want q35", s.Domain.Machine)
	}
	if len(s.Domain.Devices.Disks) != 0 || s.TerminationGracePeriodSeconds != nil || len(s.Networks) != 0 {
		t.Fatalf("the VM mutator changed more than the machine type: %+v", s)
	}
}

// FuzzSetDefaults feeds arbitrary instance specs to SetDefaults: it must never panic, must be
// idempotent, must leave every volume attached by a disk, and must leave a spec valid before it
// valid after, but for the CPU count it derives from resources (requests.cpu: 300 asks for more
// vCPUs than a guest gets, and is refused naming spec.domain.cpu, as in KubeVirt).
func FuzzSetDefaults(f *testing.F) {
	f.Add([]byte(`{"domain":{"devices":{}},"volumes":[{"name":"a","emptyDisk":{"capacity":"1Mi"}}]}`))
	f.Add([]byte(`{"domain":{"machine":{"type":""},"resources":{"limits":{"cpu":"1e12","memory":"1Gi"}},"devices":{"disks":[{"name":"c","cdrom":{"readonly":false}}]}},"volumes":[{"name":"c","emptyDisk":{"capacity":"1Mi"}}]}`))
	f.Add([]byte(`{"domain":{"memory":{"guest":"1Gi"},"resources":{"requests":{"cpu":"300"}},"devices":{}}}`))
	f.Add([]byte(`{"domain":{"cpu":{"cores":2},"devices":{"autoattachPodInterface":false}},"networks":[{"name":"n","pod":{}}]}`))
	f.Add([]byte(`{"domain":{"devices":{},"features":{"hyperv":{"vpindex":{"enabled":false},"synictimer":{"direct":{}},"evmcs":{},"tlbflush":{"direct":{}},"spinlocks":{}}},` +
		`"clock":{"timezone":"Asia/Kolkata","timer":{"hyperv":{},"rtc":{"tickPolicy":"catchup"}}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var spec VirtualMachineInstanceSpec
		if json.Unmarshal(data, &spec) != nil {
			return
		}
		valid := len(ValidateVirtualMachineInstanceSpec(spec.DeepCopy(), field.NewPath("spec"))) == 0
		SetDefaults(&spec)
		again := spec.DeepCopy()
		SetDefaults(again)
		if !equality.Semantic.DeepEqual(again, &spec) {
			t.Fatalf("not idempotent:\n%+v\n%+v", again, spec)
		}
		disks := map[string]bool{}
		for _, d := range spec.Domain.Devices.Disks {
			disks[d.Name] = true
		}
		for _, v := range spec.Volumes {
			if !disks[v.Name] {
				t.Fatalf("volume %q has no disk after SetDefaults", v.Name)
			}
		}
		for _, e := range ValidateVirtualMachineInstanceSpec(&spec, field.NewPath("spec")) {
			if valid && !strings.HasPrefix(e.Field, "spec.domain.cpu") {
				t.Fatalf("a valid spec is invalid after SetDefaults: %v", e)
			}
		}
	})
}
