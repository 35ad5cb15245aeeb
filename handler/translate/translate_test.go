package translate_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
)

const uid = "0f8fad5b-d9cb-469f-a165-70867728950e"

// validVMI is the instance each case changes one thing in: a disk, an interface, a kernel.
func validVMI() *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Name, v.Namespace, v.UID = "vm1", "default", uid
	v.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("128Mi"))}
	v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root", Disk: &v1alpha1.DiskTarget{}}}
	v.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
		ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.com/disk:1"}}}}
	v.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
	v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	return v
}

var hostNICs = map[string]machine.NIC{"default": {Tap: "tap0", MAC: "02:00:00:00:00:01"}}

// TestDefaults: what the spec leaves open is decided here, once, as KubeVirt decides it.
func TestDefaults(t *testing.T) {
	m, err := translate.Machine(validVMI(), translate.Host{Emulation: true, NICs: hostNICs})
	if err != nil {
		t.Fatal(err)
	}
	want := &machine.Machine{
		Name: "vm1", Namespace: "default", UID: uid, UUID: uid, Type: "q35", Accel: machine.AccelTCG,
		CPU:       machine.CPU{Model: "qemu64", VCPUs: 1, Sockets: 1, Cores: 1, Threads: 1},
		MemoryMiB: 128, SerialConsole: true, Graphics: true, GracePeriodSeconds: 180,
		Disks: []machine.Disk{{Name: "root", Bus: machine.BusVirtio, ReadOnly: true, Cache: machine.CacheNone, IO: machine.IOThreads,
			Source: machine.Source{Container: &machine.Container{Image: machine.ImageRef{Ref: "example.com/disk:1"}}}}},
		NICs: []machine.NIC{{Name: "default", Tap: "tap0", MAC: "02:00:00:00:00:01", Model: machine.NICVirtio}},
	}
	if !reflect.DeepEqual(m, want) {
		got, _ := json.MarshalIndent(m, "", " ")
		exp, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("machine\n%s\nwant\n%s", got, exp)
	}

	kvm, err := translate.Machine(validVMI(), translate.Host{NICs: hostNICs})
	if err != nil || kvm.Accel != machine.AccelKVM || kvm.CPU.Model != "host" {
		t.Errorf("under KVM: %+v, %v; want kvm with the host CPU", kvm, err)
	}
}

// TestDecisions: each spec field reaches the machine as it says.
func TestDecisions(t *testing.T) {
	v := validVMI()
	s := &v.Spec
	s.TerminationGracePeriodSeconds = ptr.To[int64](30)
	s.StartStrategy = ptr.To(v1alpha1.StartStrategyPaused)
	s.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 2, Model: "max"}
	s.Domain.Memory = nil
	s.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
	s.Domain.Firmware = &v1alpha1.Firmware{UUID: "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab", Serial: "s-1"}
	s.Domain.Devices.AutoattachGraphicsDevice = ptr.To(false)
	s.Domain.Devices.Disks[0] = v1alpha1.Disk{Name: "root", CDRom: &v1alpha1.CDRomTarget{}, BootOrder: ptr.To[uint32](1)}
	s.Domain.Devices.Interfaces[0].MacAddress = "02:00:00:00:00:aa"
	s.Domain.Devices.Interfaces[0].Model = "e1000e"
	m, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs})
	if err != nil {
		t.Fatal(err)
	}
	if m.GracePeriodSeconds != 30 || !m.StartPaused || m.Graphics || !m.SerialConsole {
		t.Errorf("grace %d, startPaused %v, graphics %v, serial %v", m.GracePeriodSeconds, m.StartPaused, m.Graphics, m.SerialConsole)
	}
	if m.CPU != (machine.CPU{Model: "max", VCPUs: 4, Sockets: 2, Cores: 2, Threads: 1}) || m.MemoryMiB != 1024 {
		t.Errorf("cpu %+v, memory %d MiB", m.CPU, m.MemoryMiB)
	}
	if m.UUID != "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab" || m.SMBIOSSerial != "s-1" {
		t.Errorf("uuid %s serial %s: the firmware's", m.UUID, m.SMBIOSSerial)
	}
	if d := m.Disks[0]; !d.CDROM || !d.ReadOnly || d.Bus != machine.BusSATA || *d.BootIndex != 1 {
		t.Errorf("cdrom %+v: want a read-only sata cdrom with boot index 1", d)
	}
	if n := m.NICs[0]; n.MAC != "02:00:00:00:00:aa" || n.Model != machine.NICE1000E {
		t.Errorf("nic %+v: the spec's MAC and model win over the host's", n)
	}
}

func TestMachineErrors(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(v *v1alpha1.VirtualMachineInstance)
		host   translate.Host
		path   string
	}{
		{"fractional MiB", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Memory.Guest = ptr.To(resource.MustParse("1000M"))
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.memory.guest"},
		{"fractional MiB from requests", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Memory = nil
			v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256.5Mi")}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.resources.requests.memory"},
		{"host-passthrough under emulation", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.CPU = &v1alpha1.CPU{Model: "host-passthrough"}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.cpu.model"},
		{"host-model", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.CPU = &v1alpha1.CPU{Model: "host-model"}
		}, translate.Host{NICs: hostNICs}, "spec.domain.cpu.model"},
		{"an interface without a host side", func(*v1alpha1.VirtualMachineInstance) {}, translate.Host{Emulation: true},
			"spec.domain.devices.interfaces[0]"},
		{"a volume qvirt cannot run", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Volumes[0].VolumeSource = v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.volumes[0].persistentVolumeClaim: Forbidden: the persistentVolumeClaim volume is not supported by this version of qvirt"},
		{"a volume qvirt cannot run, on a migration target", func(v *v1alpha1.VirtualMachineInstance) {
			// NotRealised is left to the source's admission; the translation still cannot describe it.
			v.Spec.Volumes[0].VolumeSource = v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}
		}, translate.Host{Emulation: true, NICs: hostNICs, SkipNotRealised: true}, "spec.volumes[root]"},
		{"not realised by this version", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.evictionStrategy"},
		{"validation runs first", func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Volumes[0].Name = "other" },
			translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.devices.disks[0].name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := validVMI()
			c.mutate(v)
			m, err := translate.Machine(v, c.host)
			if err == nil {
				t.Fatalf("translated it: %+v", m)
			}
			if !strings.Contains(err.Error(), c.path) {
				t.Errorf("want an error at %s, got %v", c.path, err)
			}
		})
	}
}

func TestHotplugDisk(t *testing.T) {
	p := field.NewPath("spec", "domain", "devices", "disks").Index(1)
	empty := v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}}}
	d, err := translate.HotplugDisk(&v1alpha1.Disk{Name: "data", Serial: "D1"}, &empty, nil, p)
	if err != nil {
		t.Fatal(err)
	}
	want := machine.Disk{Name: "data", Serial: "D1", Bus: machine.BusVirtio, Cache: machine.CacheNone, IO: machine.IOThreads,
		Source: machine.Source{Empty: &machine.Empty{CapacityBytes: 8 << 20}}}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("hot disk %+v, want %+v", d, want)
	}
	for name, tc := range map[string]struct {
		disk v1alpha1.Disk
		vol  v1alpha1.Volume
		path string
	}{
		"cdrom":          {v1alpha1.Disk{Name: "data", CDRom: &v1alpha1.CDRomTarget{}}, empty, "spec.domain.devices.disks[1].cdrom"},
		"sata bus":       {v1alpha1.Disk{Name: "data", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSATA}}, empty, "spec.domain.devices.disks[1].disk.bus"},
		"container disk": {v1alpha1.Disk{Name: "data"}, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "x"}}}, "spec.volumes[data].containerDisk"},
	} {
		if _, err := translate.HotplugDisk(&tc.disk, &tc.vol, nil, p); err == nil || !strings.Contains(err.Error(), tc.path) {
			t.Errorf("%s: want an error at %s, got %v", name, tc.path, err)
		}
	}
}

// FuzzMachine: the machine of every valid spec the fuzzer finds either translates to a
// description the launcher's argv builder accepts (its images resolved) or is refused with a
// field error: the node agent never sends what the launcher must refuse for its content.
func FuzzMachine(f *testing.F) {
	seed, _ := json.Marshal(validVMI().Spec)
	f.Add(seed, true)
	f.Fuzz(func(t *testing.T, js []byte, emulation bool) {
		v := validVMI()
		v.Spec = v1alpha1.VirtualMachineInstanceSpec{}
		if err := json.Unmarshal(js, &v.Spec); err != nil {
			return
		}
		nics := map[string]machine.NIC{}
		for i, in := range v.Spec.Domain.Devices.Interfaces {
			nics[in.Name] = machine.NIC{Tap: "tap" + string(rune('a'+i%26)), MAC: "02:00:00:00:00:01"}
		}
		m, err := translate.Machine(v, translate.Host{Emulation: emulation, NICs: nics})
		if err != nil {
			var agg interface{ Errors() []error }
			if !errors.As(err, &agg) || len(agg.Errors()) == 0 {
				t.Fatalf("error without field errors: %T %v", err, err)
			}
			return
		}
		if len(m.NICs) > 1 {
			return // several NICs of one fuzzed MAC: the node agent gives each its own
		}
		lm := &launcher.Machine{Machine: *m, RunDir: "/run/q", Images: map[string]launcher.DiskImage{}}
		if m.Kernel != nil {
			lm.KernelFile, lm.InitrdFile = "/k", "/i"
		}
		for _, d := range m.Disks {
			lm.Images[d.Name] = launcher.DiskImage{Path: "/images/" + d.Name, Format: "raw"}
		}
		if _, err := launcher.BuildArgv(lm); err != nil && !strings.Contains(err.Error(), "AHCI") && !strings.Contains(err.Error(), "sata bus") {
			t.Fatalf("a translated machine is refused by the launcher: %v", err)
		}
	})
}

// TestMigrationTargetRunsWhatItsSourceRuns: a spec admitted by an older version, with what this one
// does not realise but could run (an evictionStrategy nothing acts on), still migrates.
func TestMigrationTargetRunsWhatItsSourceRuns(t *testing.T) {
	v := validVMI()
	v.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	if _, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs, SkipNotRealised: true}); err != nil {
		t.Fatalf("the migration target's machine is refused: %v", err)
	}
}
