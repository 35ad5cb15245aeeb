package translate_test

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
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
		MemoryMiB: 128, SerialConsole: true, Graphics: true, GracePeriodSeconds: 180, GuestAgent: true,
		// A containerDisk is writable unless the spec says readonly: the launcher puts an overlay on it.
		Disks: []machine.Disk{{Name: "root", Bus: machine.BusVirtio, Cache: machine.CacheNone, IO: machine.IOThreads,
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

// KubeVirt's memory quantities in decimal units reach QEMU rounded up to a whole MiB, as libvirt
// rounds them for KubeVirt.
func TestGuestMemoryRoundsUpToMiB(t *testing.T) {
	for q, want := range map[string]int64{"1024M": 977, "1G": 954, "256.5Mi": 257, "512Mi": 512, "1": 1} {
		v := validVMI()
		v.Spec.Domain.Memory = nil
		v.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(q)}
		m, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs})
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if m.MemoryMiB != want {
			t.Errorf("%s: the guest gets %d MiB, want %d", q, m.MemoryMiB, want)
		}
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
	if !reflect.DeepEqual(m.CPU, machine.CPU{Model: "max", VCPUs: 4, Sockets: 2, Cores: 2, Threads: 1}) || m.MemoryMiB != 1024 {
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

// TestCloudInit: a cloud-init volume becomes a cloud-init disk source with KubeVirt's meta-data
// (NoCloud: the SMBIOS UUID as instance-id; ConfigDrive: <name>.<namespace> with the UUID beside it;
// the hostname is spec.hostname, else the name up to its first dot), base64 decoded, and Secrets
// left for the launcher to read from its pod.
func TestCloudInit(t *testing.T) {
	const fwUUID = "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab"
	withVolume := func(src v1alpha1.VolumeSource, mutate func(v *v1alpha1.VirtualMachineInstance)) *machine.CloudInit {
		t.Helper()
		v := validVMI()
		v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: "cidata", CDRom: &v1alpha1.CDRomTarget{}})
		v.Spec.Volumes = append(v.Spec.Volumes, v1alpha1.Volume{Name: "cidata", VolumeSource: src})
		if mutate != nil {
			mutate(v)
		}
		m, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs})
		if err != nil {
			t.Fatal(err)
		}
		d := m.Disks[1]
		if !d.CDROM || !d.ReadOnly || d.Bus != machine.BusSATA || d.Source.CloudInit == nil {
			t.Fatalf("disk %+v: want a read-only sata cdrom with a cloud-init source", d)
		}
		return d.Source.CloudInit
	}

	got := withVolume(v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{
		UserDataBase64: "I2Nsb3VkLWNvbmZpZwo=", NetworkDataSecretRef: &corev1.LocalObjectReference{Name: "net"}}}, nil)
	want := &machine.CloudInit{DataSource: machine.CloudInitNoCloud, InstanceID: uid, Hostname: "vm1",
		UserData: machine.CloudInitData{Inline: "#cloud-config\n"}, NetworkData: machine.CloudInitData{FromSecret: true}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("noCloud:\n%+v\nwant\n%+v", got, want)
	}

	got = withVolume(v1alpha1.VolumeSource{CloudInitConfigDrive: &v1alpha1.CloudInitConfigDriveSource{
		UserDataSecretRef: &corev1.LocalObjectReference{Name: "ud"}, NetworkData: "version: 2"}}, func(v *v1alpha1.VirtualMachineInstance) {
		v.Name = "web.example"
		v.Spec.Domain.Firmware = &v1alpha1.Firmware{UUID: fwUUID}
	})
	want = &machine.CloudInit{DataSource: machine.CloudInitConfigDrive, InstanceID: "web.example.default", UUID: fwUUID, Hostname: "web",
		UserData: machine.CloudInitData{FromSecret: true}, NetworkData: machine.CloudInitData{Inline: "version: 2"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("configDrive:\n%+v\nwant\n%+v", got, want)
	}

	got = withVolume(v1alpha1.VolumeSource{CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config"}}, func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Hostname = "db-0"
		v.Spec.Domain.Firmware = &v1alpha1.Firmware{UUID: fwUUID}
	})
	if got.InstanceID != fwUUID || got.Hostname != "db-0" || got.UserData.Inline != "#cloud-config" {
		t.Errorf("noCloud with a firmware UUID and spec.hostname: %+v", got)
	}
}

// TestConfigVolumes: each config volume becomes a config disk with its volume label (KubeVirt's
// cfgdata when none; a serviceAccount volume has none to set), attached as its disk says; the
// machine description names no object, so the node agent reads none.
func TestConfigVolumes(t *testing.T) {
	v := validVMI()
	for _, vol := range []v1alpha1.Volume{
		{Name: "sec", VolumeSource: v1alpha1.VolumeSource{Secret: &v1alpha1.SecretVolumeSource{SecretName: "app", VolumeLabel: "APPSECRET"}}},
		{Name: "cm", VolumeSource: v1alpha1.VolumeSource{ConfigMap: &v1alpha1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app"}}}},
		{Name: "sa", VolumeSource: v1alpha1.VolumeSource{ServiceAccount: &v1alpha1.ServiceAccountVolumeSource{ServiceAccountName: "default"}}},
		{Name: "info", VolumeSource: v1alpha1.VolumeSource{DownwardAPI: &v1alpha1.DownwardAPIVolumeSource{VolumeLabel: "INFO"}}},
	} {
		v.Spec.Volumes = append(v.Spec.Volumes, vol)
		v.Spec.Domain.Devices.Disks = append(v.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: vol.Name, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	}
	v.Spec.Domain.Devices.Disks[2].Disk, v.Spec.Domain.Devices.Disks[2].CDRom = nil, &v1alpha1.CDRomTarget{}
	m, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		cfg   machine.Config
		cdrom bool
		bus   machine.Bus
	}{
		{machine.Config{Kind: "secret", Label: "APPSECRET"}, false, machine.BusVirtio},
		{machine.Config{Kind: "configMap", Label: "cfgdata"}, true, machine.BusSATA},
		{machine.Config{Kind: "serviceAccount", Label: "cfgdata"}, false, machine.BusVirtio},
		{machine.Config{Kind: "downwardAPI", Label: "INFO"}, false, machine.BusVirtio},
	}
	for i, w := range want {
		d := m.Disks[i+1]
		if d.Source.Config == nil || *d.Source.Config != w.cfg || d.CDROM != w.cdrom || d.Bus != w.bus {
			t.Errorf("disk %s: %+v (config %+v), want config %+v, cdrom %v on %s", d.Name, d, d.Source.Config, w.cfg, w.cdrom, w.bus)
		}
	}
}

// TestFirmware: the bootloader and SMM reach the machine as KubeVirt reads them, and the host CPU
// models need KVM.
func TestFirmware(t *testing.T) {
	describe := func(emulation bool, mutate func(s *v1alpha1.VirtualMachineInstanceSpec)) *machine.Machine {
		t.Helper()
		v := validVMI()
		mutate(&v.Spec)
		m, err := translate.Machine(v, translate.Host{Emulation: emulation, NICs: hostNICs})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := describe(true, func(*v1alpha1.VirtualMachineInstanceSpec) {}); m.Firmware.EFI != nil || m.Firmware.SerialBIOS || m.SMM != nil {
		t.Errorf("no bootloader: firmware %+v smm %v, want SeaBIOS and QEMU's SMM default", m.Firmware, m.SMM)
	}
	m := describe(true, func(s *v1alpha1.VirtualMachineInstanceSpec) {
		s.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
		s.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{}}
	})
	if m.Firmware.EFI == nil || !m.Firmware.EFI.SecureBoot || m.SMM == nil || !*m.SMM {
		t.Errorf("efi: {} with smm: {}: firmware %+v smm %v, want secure boot (KubeVirt's default) and SMM on", m.Firmware, m.SMM)
	}
	m = describe(true, func(s *v1alpha1.VirtualMachineInstanceSpec) {
		s.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false)}}}
		s.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{Enabled: ptr.To(false)}}
	})
	if m.Firmware.EFI == nil || m.Firmware.EFI.SecureBoot || m.SMM == nil || *m.SMM {
		t.Errorf("efi without secure boot, smm off: firmware %+v smm %v", m.Firmware, m.SMM)
	}
	m = describe(true, func(s *v1alpha1.VirtualMachineInstanceSpec) {
		s.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{BIOS: &v1alpha1.BIOS{UseSerial: ptr.To(true)}}}
	})
	if m.Firmware.EFI != nil || !m.Firmware.SerialBIOS {
		t.Errorf("bios.useSerial: firmware %+v, want SeaBIOS on the serial console", m.Firmware)
	}
	for _, model := range []string{"host-model", "host-passthrough"} {
		m = describe(false, func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.CPU = &v1alpha1.CPU{Model: model} })
		if m.Accel != machine.AccelKVM || m.CPU.Model != "host" {
			t.Errorf("%s under KVM: accel %s cpu %q, want QEMU's host model", model, m.Accel, m.CPU.Model)
		}
	}
}

// TestPodVolumes: claims (of persistentVolumeClaim, dataVolume and ephemeral volumes) and host
// disks are described as the launcher pod holds them: a filesystem claim's disk.img in its mount at the capacity less 5.5%, a block claim's device, an
// ephemeral volume's claim under an overlay, a host disk under its directory's mount and confined
// to it; what the pod does not hold is an error naming the field.
func TestPodVolumes(t *testing.T) {
	v := validVMI()
	disk := func(name string) v1alpha1.Disk { return v1alpha1.Disk{Name: name, Disk: &v1alpha1.DiskTarget{}} }
	claim := func(name string) *v1alpha1.PersistentVolumeClaimVolumeSource {
		return &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: name}
	}
	v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{disk("root"), disk("raw"), disk("golden"), disk("data")}
	v.Spec.Volumes = []v1alpha1.Volume{
		{Name: "root", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: claim("root-pvc")}},
		// A dataVolume volume is CDI's claim of the DataVolume's name.
		{Name: "raw", VolumeSource: v1alpha1.VolumeSource{DataVolume: &v1alpha1.DataVolumeSource{Name: "raw-pvc"}}},
		{Name: "golden", VolumeSource: v1alpha1.VolumeSource{Ephemeral: &v1alpha1.EphemeralVolumeSource{PersistentVolumeClaim: claim("golden-pvc")}}},
		{Name: "data", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/qvirt/default/vms/data.img",
			Type: v1alpha1.HostDiskExistsOrCreate, Capacity: ptr.To(resource.MustParse("1Gi"))}}},
	}
	pod := &translate.PodVolumes{
		HostDisks: map[string]string{"/var/lib/qvirt/default": "/var/run/qvirt/host-disks/var/lib/qvirt/default"},
		Claims: map[string]translate.Claim{"root-pvc": {CapacityBytes: 1 << 30}, "raw-pvc": {Block: true},
			"golden-pvc": {CapacityBytes: 64 << 20}},
	}
	m, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs, Pod: pod})
	if err != nil {
		t.Fatal(err)
	}
	want := []machine.Source{
		{Claim: &machine.Claim{Name: "root-pvc", Dir: "/var/run/qvirt/claims/root", ImageBytes: 967 << 20}},
		{Claim: &machine.Claim{Name: "raw-pvc", Device: "/dev/qvirt-claims/raw"}},
		{Claim: &machine.Claim{Name: "golden-pvc", Dir: "/var/run/qvirt/claims/golden", ImageBytes: 60 << 20, Overlay: true}},
		{HostFile: &machine.HostFile{Path: "/var/run/qvirt/host-disks/var/lib/qvirt/default/vms/data.img", Format: "raw",
			CreateBytes: 1 << 30, Root: "/var/run/qvirt/host-disks/var/lib/qvirt/default"}},
	}
	lun := v.DeepCopy()
	lun.Spec.Domain.Devices.Disks[1] = v1alpha1.Disk{Name: "raw", LUN: &v1alpha1.LunTarget{ReadOnly: true}}
	lm, err := translate.Machine(lun, translate.Host{Emulation: true, NICs: hostNICs, Pod: pod})
	if err != nil {
		t.Fatalf("a lun on a block-mode DataVolume's claim: %v", err)
	}
	if d := lm.Disks[1]; !d.LUN || d.Bus != machine.BusSCSI || !d.ReadOnly || !reflect.DeepEqual(d.Source, want[1]) {
		t.Errorf("the lun translates to %+v, want a read-only LUN on scsi over %+v", d, want[1].Claim)
	}
	for i, d := range m.Disks {
		if !reflect.DeepEqual(d.Source, want[i]) {
			got, _ := json.Marshal(d.Source)
			exp, _ := json.Marshal(want[i])
			t.Errorf("disk %s: source %s, want %s", d.Name, got, exp)
		}
		if d.ReadOnly {
			t.Errorf("disk %s is read-only", d.Name)
		}
	}

	for name, tc := range map[string]struct {
		mutate func(v *v1alpha1.VirtualMachineInstance, pod *translate.PodVolumes)
		want   string
	}{
		"a claim the node agent did not find": {func(_ *v1alpha1.VirtualMachineInstance, pod *translate.PodVolumes) {
			delete(pod.Claims, "root-pvc")
		}, `spec.volumes[root].persistentVolumeClaim.claimName: Not found: "root-pvc"`},
		"a DataVolume's claim the node agent did not find": {func(_ *v1alpha1.VirtualMachineInstance, pod *translate.PodVolumes) {
			delete(pod.Claims, "raw-pvc")
		}, `spec.volumes[raw].dataVolume.name: Not found: "raw-pvc"`},
		"a claim too small for a disk image": {func(_ *v1alpha1.VirtualMachineInstance, pod *translate.PodVolumes) {
			pod.Claims["golden-pvc"] = translate.Claim{CapacityBytes: 1 << 20}
		}, "spec.volumes[golden].ephemeral.persistentVolumeClaim.claimName: Invalid value: \"golden-pvc\": the claim's capacity, 1048576 bytes, is too small"},
		"a host disk in a directory the pod does not mount": {func(v *v1alpha1.VirtualMachineInstance, _ *translate.PodVolumes) {
			v.Spec.Volumes[3].HostDisk.Path = "/var/lib/qvirt/other/data.img"
		}, "spec.volumes[data].hostDisk.path: Forbidden: /var/lib/qvirt/other/data.img is in no host directory the launcher pod mounts"},
		"a lun on a filesystem-mode claim": {func(v *v1alpha1.VirtualMachineInstance, _ *translate.PodVolumes) {
			v.Spec.Domain.Devices.Disks[0] = v1alpha1.Disk{Name: "root", LUN: &v1alpha1.LunTarget{}}
		}, `spec.domain.devices.disks[0].lun: Invalid value: "root": a lun passes a block device through: the volume must be a claim of volumeMode Block, and claim root-pvc has volumeMode Filesystem`},
		"a host disk in a directory whose name extends the mounted one": {func(v *v1alpha1.VirtualMachineInstance, _ *translate.PodVolumes) {
			v.Spec.Volumes[3].HostDisk.Path = "/var/lib/qvirt/default2/data.img"
		}, "spec.volumes[data].hostDisk.path: Forbidden"},
	} {
		t.Run(name, func(t *testing.T) {
			v := v.DeepCopy()
			pod := &translate.PodVolumes{HostDisks: maps.Clone(pod.HostDisks), Claims: maps.Clone(pod.Claims)}
			tc.mutate(v, pod)
			_, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs, Pod: pod})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error with %q, got %v", tc.want, err)
			}
		})
	}
}

func TestMachineErrors(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(v *v1alpha1.VirtualMachineInstance)
		host   translate.Host
		path   string
	}{
		{"no memory", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Memory = nil
			v.Spec.Domain.Resources.Requests = nil
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.memory.guest"},
		{"host-passthrough under emulation", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.CPU = &v1alpha1.CPU{Model: "host-passthrough"}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.cpu.model"},
		{"host-model under emulation", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.CPU = &v1alpha1.CPU{Model: "host-model"}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.cpu.model: Invalid value: \"host-model\": the host CPU model needs KVM"},
		{"secure boot without smm", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.features.smm"},
		{"persistent EFI variables", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false), Persistent: ptr.To(true)}}}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.firmware.bootloader.efi.persistent"},
		{"an interface without a host side", func(*v1alpha1.VirtualMachineInstance) {}, translate.Host{Emulation: true},
			"spec.domain.devices.interfaces[0]"},
		{"a claim outside a launcher pod", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Volumes[0].VolumeSource = v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.volumes[root].persistentVolumeClaim.claimName: Forbidden: a claim is attached only in a launcher pod"},
		{"a dataVolume outside a launcher pod", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Volumes[0].VolumeSource = v1alpha1.VolumeSource{DataVolume: &v1alpha1.DataVolumeSource{Name: "dv"}}
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.volumes[root].dataVolume.name: Forbidden: a claim is attached only in a launcher pod"},
		{"a volume the host cannot give, on a migration target", func(v *v1alpha1.VirtualMachineInstance) {
			// NotRealised is left to the source's admission; the translation still cannot describe it.
			v.Spec.Volumes[0].VolumeSource = v1alpha1.VolumeSource{DataVolume: &v1alpha1.DataVolumeSource{Name: "dv"}}
		}, translate.Host{Emulation: true, NICs: hostNICs, SkipNotRealised: true}, "spec.volumes[root]"},
		{"not realised by this version", func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Domain.Devices.AutoattachVSOCK = ptr.To(true)
		}, translate.Host{Emulation: true, NICs: hostNICs}, "spec.domain.devices.autoattachVSOCK"},
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
	d, err := translate.HotplugDisk(&v1alpha1.DomainSpec{}, &v1alpha1.Disk{Name: "data", Serial: "D1"}, &empty, nil, p)
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
		"cdrom":                {v1alpha1.Disk{Name: "data", CDRom: &v1alpha1.CDRomTarget{}}, empty, "spec.domain.devices.disks[1].cdrom"},
		"sata bus":             {v1alpha1.Disk{Name: "data", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSATA}}, empty, "spec.domain.devices.disks[1].disk.bus"},
		"container disk":       {v1alpha1.Disk{Name: "data"}, v1alpha1.Volume{Name: "data", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "x"}}}, "spec.volumes[data].containerDisk"},
		"dedicated I/O thread": {v1alpha1.Disk{Name: "data", DedicatedIOThread: ptr.To(true)}, empty, "spec.domain.devices.disks[1].dedicatedIOThread"},
	} {
		if _, err := translate.HotplugDisk(&v1alpha1.DomainSpec{}, &tc.disk, &tc.vol, nil, p); err == nil || !strings.Contains(err.Error(), tc.path) {
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
	windows, _ := json.Marshal(windowsVMI().Spec)
	f.Add(windows, true)
	f.Add(windows, false)
	f.Add([]byte(`{"domain":{"devices":{"filesystems":[{"name":"cm","virtiofs":{}}]}},"volumes":[{"name":"cm","configMap":{"name":"app"}}]}`), true)
	f.Add([]byte(`{"domain":{"features":{"hypervPassthrough":{}},"clock":{"timezone":"Asia/Kolkata","timer":{"hyperv":{},"kvm":{"present":false}}},"devices":{}}}`), false)
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
		if m.Firmware.EFI != nil {
			lm.EFICode, lm.EFIVars = "/fw/code.fd", "/fw/vars.fd"
		}
		for _, d := range m.Disks {
			lm.Images[d.Name] = launcher.DiskImage{Path: "/images/" + d.Name, Format: "raw"}
		}
		if off := m.Clock.RTCOffsetSeconds; off != 0 {
			lm.RTCStart = rtcStart.Add(time.Duration(off) * time.Second)
		}
		if _, err := launcher.BuildArgv(lm); err != nil && !strings.Contains(err.Error(), "AHCI") && !strings.Contains(err.Error(), "sata bus") {
			t.Fatalf("a translated machine is refused by the launcher: %v", err)
		}
	})
}

// TestMigrationTargetRunsWhatItsSourceRuns: a spec admitted by an older version, with what this one
// does not keep but could run (EFI variables asked to persist, in a pod without the backend-storage
// claim an older version did not make: they last as long as the instance), still migrates.
func TestMigrationTargetRunsWhatItsSourceRuns(t *testing.T) {
	v := validVMI()
	v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false), Persistent: ptr.To(true)}}}
	if _, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs}); err == nil {
		t.Fatal("persistent EFI variables without the backend-storage claim are accepted")
	}
	if _, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs, SkipNotRealised: true}); err != nil {
		t.Fatalf("the migration target's machine is refused: %v", err)
	}
}

// TestDiskTuning lays out KubeVirt's disk tuning (its user guide's "IOThreads" examples):
// blockMultiQueue gives each virtio disk a queue per vCPU; dedicatedIOThread a thread of the
// disk's own; the others share one thread (policy shared, or none but a dedicated disk) or a pool
// of twice the vCPUs less the dedicated threads, round robin (auto). A cdrom and a sata disk get none, and
// a disk hot-plugged later gets what the whole description gives it (a migration target's).
func TestDiskTuning(t *testing.T) {
	empty := func(name string) v1alpha1.Volume {
		return v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}}}
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	vmi.Name, vmi.Namespace, vmi.UID = "tuned", "ns", "5b1ee53c-79b2-4d1c-a1c9-8d0d7d1e6b09"
	spec := &vmi.Spec
	spec.Domain.CPU = &v1alpha1.CPU{Cores: 2}
	spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))}
	spec.Domain.Devices.BlockMultiQueue = ptr.To(true)
	spec.Domain.Devices.Disks = []v1alpha1.Disk{
		{Name: "a"}, {Name: "b", DedicatedIOThread: ptr.To(true)}, {Name: "c"},
		{Name: "d", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSATA}}, {Name: "e"}, {Name: "f"}, {Name: "g"},
	}
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		spec.Volumes = append(spec.Volumes, empty(n))
	}
	type tuning struct {
		queues uint32
		thread string
	}
	for _, tc := range []struct {
		policy  *v1alpha1.IOThreadsPolicy
		threads []string
		disks   map[string]tuning
	}{
		{nil, []string{"iothread-shared", "iothread-disk-1"}, map[string]tuning{
			"a": {2, "iothread-shared"}, "b": {2, "iothread-disk-1"}, "c": {2, "iothread-shared"}, "d": {0, ""}, "g": {2, "iothread-shared"}}},
		{ptr.To(v1alpha1.IOThreadsPolicyShared), []string{"iothread-shared", "iothread-disk-1"}, map[string]tuning{
			"a": {2, "iothread-shared"}, "b": {2, "iothread-disk-1"}, "c": {2, "iothread-shared"}, "d": {0, ""}, "g": {2, "iothread-shared"}}},
		{ptr.To(v1alpha1.IOThreadsPolicyAuto), []string{"iothread-0", "iothread-1", "iothread-2", "iothread-disk-1"}, map[string]tuning{
			"a": {2, "iothread-0"}, "b": {2, "iothread-disk-1"}, "c": {2, "iothread-1"}, "d": {0, ""}, "e": {2, "iothread-2"},
			"f": {2, "iothread-0"}, "g": {2, "iothread-1"}}},
	} {
		spec.Domain.IOThreadsPolicy = tc.policy
		m, err := translate.Machine(vmi, translate.Host{Emulation: true})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(m.IOThreads, tc.threads) {
			t.Errorf("policy %v: I/O threads %v, want %v", tc.policy, m.IOThreads, tc.threads)
		}
		for name, want := range tc.disks {
			d := m.Disk(name)
			if got := (tuning{d.Queues, d.IOThread}); got != want {
				t.Errorf("policy %v: disk %s has %+v, want %+v", tc.policy, name, got, want)
			}
		}
		// The last disk, hot-plugged into the running instance, gets the same as in the whole
		// description.
		hot, err := translate.HotplugDisk(&spec.Domain, &spec.Domain.Devices.Disks[6], &spec.Volumes[6], nil, field.NewPath("spec", "domain", "devices", "disks").Index(6))
		if err != nil {
			t.Fatal(err)
		}
		if got := (tuning{hot.Queues, hot.IOThread}); got != tc.disks["g"] {
			t.Errorf("policy %v: the hot-plugged disk has %+v, want %+v", tc.policy, got, tc.disks["g"])
		}
	}
}

// TestPersistentStateOnTheClaim: a persistent TPM and persistent EFI variables are kept in the
// directory where the launcher pod mounts the backend-storage claim; without them, nowhere.
func TestPersistentStateOnTheClaim(t *testing.T) {
	v := validVMI()
	v.Spec.Domain.Devices.TPM = &v1alpha1.TPMDevice{Persistent: ptr.To(true)}
	v.Spec.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false), Persistent: ptr.To(true)}}}
	pod := &translate.PodVolumes{StateDir: podlayout.StateDir}
	m, err := translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs, Pod: pod})
	if err != nil {
		t.Fatal(err)
	}
	if want := (machine.State{Dir: podlayout.StateDir, EFIVars: true, TPM: true}); m.State == nil || *m.State != want {
		t.Errorf("state %+v, want %+v", m.State, want)
	}
	v.Spec.Domain.Devices.TPM.Persistent = nil
	v.Spec.Domain.Firmware.Bootloader.EFI.Persistent = ptr.To(false)
	if m, err = translate.Machine(v, translate.Host{Emulation: true, NICs: hostNICs, Pod: pod}); err != nil || m.State != nil {
		t.Errorf("without persistence: state %+v, %v; want none", m.State, err)
	}
}
