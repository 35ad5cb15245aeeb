package launcher

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/machine"
)

var update = flag.Bool("update", false, "rewrite launcher/testdata/*.golden from BuildArgv's output")

const goldenRoot = "/srv/qvirt"

type argvCase struct {
	name string
	m    *Machine
}

// host is what the node agent and the launcher resolve for a golden case's spec.
type host struct {
	emulation bool
	nics      map[string]machine.NIC
	// ports places disks and NICs on spare root ports, as for a migration target.
	ports map[string]string
	// pod is what the launcher pod holds for claims; nil translates outside a pod.
	pod *translate.PodVolumes
	m   *Machine // RunDir, images, kernel, spare ports, incoming
}

// argvCases are the representative machines of the golden files, each a VMI spec translated as
// the node agent does and resolved as a launcher does; root is where their images, kernel and run
// directory live (fixed for the goldens, a temp dir for the QEMU test).
func argvCases(root, runDir string) []argvCase {
	img := func(name string) string { return filepath.Join(root, "images", name) }
	kernel := func(s *v1alpha1.VirtualMachineInstanceSpec) {
		s.Domain.Firmware = &v1alpha1.Firmware{KernelBoot: &v1alpha1.KernelBoot{
			KernelArgs: "console=ttyS0 quiet panic=-1",
			Container: &v1alpha1.KernelBootContainer{Image: "example.com/guest:1",
				KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd.img"},
		}}
	}
	base := func(emulation bool, mutate func(s *v1alpha1.VirtualMachineInstanceSpec, h *host)) *Machine {
		vmi := &v1alpha1.VirtualMachineInstance{}
		vmi.Name, vmi.Namespace, vmi.UID = "vm1", "default", "0f8fad5b-d9cb-469f-a165-70867728950e"
		vmi.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("128Mi"))}
		h := &host{emulation: emulation, nics: map[string]machine.NIC{}, ports: map[string]string{},
			m: &Machine{RunDir: runDir, Images: map[string]DiskImage{}}}
		mutate(&vmi.Spec, h)
		// The goldens cover layouts (several NICs, legacy models) the node agent cannot set up yet.
		desc, err := translate.Machine(vmi, translate.Host{Emulation: emulation, NICs: h.nics, SkipNotRealised: true, Pod: h.pod})
		if err != nil {
			panic(fmt.Sprintf("golden spec: %v", err))
		}
		for i := range desc.Disks {
			desc.Disks[i].Port = h.ports[desc.Disks[i].Name]
		}
		for i := range desc.NICs {
			desc.NICs[i].Port = h.ports[desc.NICs[i].Name]
		}
		h.m.Machine = *desc
		return h.m
	}
	withKernel := func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
		kernel(s)
		h.m.KernelFile, h.m.InitrdFile = filepath.Join(root, "boot", "vmlinuz"), filepath.Join(root, "boot", "initrd.img")
	}
	return []argvCase{
		{"minimal-kernel-boot", base(true, withKernel)},
		{"full", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			withKernel(s, h)
			s.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 2, Threads: 1}
			s.Domain.Memory.Guest = ptr.To(resource.MustParse("256Mi"))
			s.Domain.Firmware.UUID = "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab"
			s.Domain.Firmware.Serial = "qvirt-0001"
			s.Domain.Devices.Disks = []v1alpha1.Disk{
				{Name: "root", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}, BootOrder: ptr.To[uint32](1), Serial: "root-0001",
					BlockSize: &v1alpha1.BlockSize{Custom: &v1alpha1.CustomBlockSize{Logical: 512, Physical: 4096}}},
				{Name: "data", Disk: &v1alpha1.DiskTarget{}, Cache: v1alpha1.CacheWriteBack},
				{Name: "cidata", CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSATA}},
			}
			s.Volumes = []v1alpha1.Volume{
				{Name: "root", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.com/disk:1"}}},
				{Name: "data", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}},
				{Name: "cidata", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.com/cidata:1"}}},
			}
			s.Domain.Devices.Interfaces = []v1alpha1.Interface{
				{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}},
				{Name: "storage", Bridge: &v1alpha1.InterfaceBridge{}, MacAddress: "02-00-00-AA-BB-02"},
			}
			s.Networks = []v1alpha1.Network{
				{Name: "default", Pod: &v1alpha1.PodNetwork{}},
				{Name: "storage", Multus: &v1alpha1.MultusNetwork{NetworkName: "default/storage"}},
			}
			// The writable containerDisk as the launcher resolves it: its overlay over the image.
			h.m.Images["root"] = DiskImage{Path: filepath.Join(runDir, "overlay-root.qcow2"), Format: "qcow2", Ephemeral: true,
				Backing: &DiskImage{Path: img("root.qcow2"), Format: "qcow2", ReadOnly: true}}
			h.m.Images["data"] = DiskImage{Path: img("data.raw"), Format: "raw"}
			h.m.Images["cidata"] = DiskImage{Path: img("cidata.iso"), Format: "raw", ReadOnly: true}
			h.nics["default"] = machine.NIC{Tap: "tap0", MAC: "02:00:00:aa:bb:01"}
			h.nics["storage"] = machine.NIC{Tap: "tap1"}
			h.m.SpareRootPorts = 4
		})},
		{"scsi", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			withKernel(s, h)
			s.Domain.Devices.AutoattachGraphicsDevice = ptr.To(false)
			s.Domain.Devices.Disks = []v1alpha1.Disk{
				{Name: "root", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSCSI}, Cache: v1alpha1.CacheNone, IO: v1alpha1.IONative, BootOrder: ptr.To[uint32](2)},
				{Name: "logs", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSCSI}, Cache: v1alpha1.CacheWriteThrough,
					BlockSize: &v1alpha1.BlockSize{Custom: &v1alpha1.CustomBlockSize{Logical: 4096, Physical: 4096, DiscardGranularity: ptr.To[uint32](8192)}}},
				{Name: "shared", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSCSI, ReadOnly: true}, Serial: "shared-1"},
				{Name: "install", CDRom: &v1alpha1.CDRomTarget{Bus: v1alpha1.DiskBusSCSI}, BootOrder: ptr.To[uint32](1)},
				{Name: "scratch", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSATA},
					BlockSize: &v1alpha1.BlockSize{Custom: &v1alpha1.CustomBlockSize{Logical: 512, Physical: 4096}}},
			}
			hostDisk := func(path string) v1alpha1.VolumeSource {
				return v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: path, Type: v1alpha1.HostDiskExists}}
			}
			s.Volumes = []v1alpha1.Volume{
				{Name: "root", VolumeSource: hostDisk("/var/lib/images/root.raw")},
				{Name: "logs", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}},
				{Name: "shared", VolumeSource: hostDisk("/var/lib/images/shared.raw")},
				{Name: "install", VolumeSource: v1alpha1.VolumeSource{ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.com/iso:1"}}},
				{Name: "scratch", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}},
			}
			h.m.Images["root"] = DiskImage{Path: img("root.raw"), Format: "raw"}
			h.m.Images["logs"] = DiskImage{Path: img("logs.qcow2"), Format: "qcow2"}
			h.m.Images["shared"] = DiskImage{Path: img("shared.raw"), Format: "raw"}
			h.m.Images["install"] = DiskImage{Path: img("install.iso"), Format: "raw"}
			h.m.Images["scratch"] = DiskImage{Path: img("scratch.qcow2"), Format: "qcow2"}
		})},
		{"kvm", base(false, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			s.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 2, Threads: 2, Model: "host-passthrough"}
			s.Domain.Memory = nil
			s.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
			s.Domain.Machine = &v1alpha1.Machine{Type: "pc-q35-7.2"}
			s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root", BootOrder: ptr.To[uint32](1)}}
			s.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
				HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.raw", Type: v1alpha1.HostDiskExists}}}}
			h.m.Images["root"] = DiskImage{Path: img("root.raw"), Format: "raw"}
			h.m.SpareRootPorts = 2
		})},
		// Passed-through LUNs need a block device that takes SCSI commands, which these machines
		// do not have: QEMU is not run on this case (TestQEMUTakesLun shows how far it gets).
		{"lun", base(false, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			s.Domain.CPU = &v1alpha1.CPU{Model: "host-passthrough"}
			s.Domain.Devices.Disks = []v1alpha1.Disk{
				{Name: "root", BootOrder: ptr.To[uint32](1)},
				{Name: "san", LUN: &v1alpha1.LunTarget{}},
				{Name: "archive", LUN: &v1alpha1.LunTarget{ReadOnly: true}, Shareable: ptr.To(true)},
			}
			claim := func(name string) v1alpha1.VolumeSource {
				return v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: name}}
			}
			s.Volumes = []v1alpha1.Volume{
				{Name: "root", VolumeSource: claim("root-pvc")},
				{Name: "san", VolumeSource: claim("san-pvc")},
				{Name: "archive", VolumeSource: v1alpha1.VolumeSource{DataVolume: &v1alpha1.DataVolumeSource{Name: "archive-dv"}}},
			}
			h.pod = &translate.PodVolumes{Claims: map[string]translate.Claim{
				"root-pvc": {CapacityBytes: 1 << 30}, "san-pvc": {Block: true}, "archive-dv": {Block: true}}}
			h.m.Images["root"] = DiskImage{Path: "/var/run/qvirt/claims/root/disk.img", Format: "raw"}
			h.m.Images["san"] = DiskImage{Path: "/dev/qvirt/san", Format: "raw", Device: true}
			h.m.Images["archive"] = DiskImage{Path: "/dev/qvirt/archive", Format: "raw", Device: true, ReadOnly: true}
		})},
		{"incoming", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			withKernel(s, h)
			s.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
			s.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
			h.nics["default"] = machine.NIC{Tap: "tap0", MAC: "02:00:00:aa:bb:01"}
			h.m.SpareRootPorts = 4
			h.m.Incoming = true
			// The source had a disk hotplugged on its second spare port.
			s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "hot", Serial: "hot-1"}}
			s.Volumes = []v1alpha1.Volume{{Name: "hot", VolumeSource: v1alpha1.VolumeSource{
				HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/hot.qcow2", Type: v1alpha1.HostDiskExists}}}}
			h.m.Images["hot"] = DiskImage{Path: img("hot.qcow2"), Format: "qcow2"}
			h.ports["hot"] = "hotplug1"
		})},
		{"acpi-off", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			withKernel(s, h)
			s.Domain.Features = &v1alpha1.Features{ACPI: &v1alpha1.FeatureState{Enabled: ptr.To(false)}}
			s.Domain.Devices.AutoattachSerialConsole = ptr.To(false)
			s.Domain.Devices.AutoattachGraphicsDevice = ptr.To(false)
			s.Domain.Devices.Sound = &v1alpha1.SoundDevice{Name: "speaker", Model: v1alpha1.SoundModelAC97}
		})},
		{"efi", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			// OVMF boots a kernel directly too (through fw_cfg); the disks' boot order is OVMF's.
			withKernel(s, h)
			s.Domain.Firmware.Bootloader = &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{SecureBoot: ptr.To(false)}}
			s.Domain.Devices.AutoattachGraphicsDevice = ptr.To(false)
			s.Domain.Devices.Disks = []v1alpha1.Disk{
				{Name: "data", BootOrder: ptr.To[uint32](2)},
				{Name: "root", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSATA}, BootOrder: ptr.To[uint32](1)},
			}
			s.Volumes = []v1alpha1.Volume{
				{Name: "data", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}},
				{Name: "root", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.raw", Type: v1alpha1.HostDiskExists}}},
			}
			h.m.Images["data"] = DiskImage{Path: img("data.raw"), Format: "raw"}
			h.m.Images["root"] = DiskImage{Path: img("root.raw"), Format: "raw"}
			efiFiles(h.m, root, false)
		})},
		{"efi-secure-boot", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			// secureBoot is true by default, as in KubeVirt, and needs SMM.
			s.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{EFI: &v1alpha1.EFI{}}}
			s.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{}}
			s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root", BootOrder: ptr.To[uint32](1)}}
			s.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
				HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.qcow2", Type: v1alpha1.HostDiskExists}}}}
			h.m.Images["root"] = DiskImage{Path: img("root.qcow2"), Format: "qcow2"}
			efiFiles(h.m, root, true)
			s.Domain.Devices.Video = &v1alpha1.VideoDevice{Type: v1alpha1.VideoBochs}
		})},
		{"bios-serial", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			s.Domain.Firmware = &v1alpha1.Firmware{Bootloader: &v1alpha1.Bootloader{BIOS: &v1alpha1.BIOS{UseSerial: ptr.To(true)}}}
			s.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{Enabled: ptr.To(false)}}
			s.Domain.Devices.AutoattachGraphicsDevice = ptr.To(false)
			s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root", BootOrder: ptr.To[uint32](1)}}
			s.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{
				HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.raw", Type: v1alpha1.HostDiskExists}}}}
			h.m.Images["root"] = DiskImage{Path: img("root.raw"), Format: "raw"}
		})},
		{"devices", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			// KubeVirt's devices without a host side: an entropy device, a memory balloon, tablets on
			// both buses, a watchdog and an HD Audio sound card beside a legacy NIC (all in legacy
			// slots), both pvpanic devices, and the APIC's paravirtual EOI.
			withKernel(s, h)
			s.Domain.Features = &v1alpha1.Features{APIC: &v1alpha1.FeatureAPIC{EndOfInterrupt: true}}
			s.Domain.Devices.Rng = &v1alpha1.Rng{}
			s.Domain.Devices.AutoattachMemBalloon = ptr.To(true)
			s.Domain.Devices.Sound = &v1alpha1.SoundDevice{Name: "speaker"}
			s.Domain.Devices.Video = &v1alpha1.VideoDevice{Type: v1alpha1.VideoVirtio}
			s.Domain.Devices.Inputs = []v1alpha1.Input{
				{Name: "tablet", Type: v1alpha1.InputTypeTablet, Bus: v1alpha1.InputBusUSB},
				{Name: "vtablet", Bus: v1alpha1.InputBusVirtio},
				{Name: "tablet2"},
			}
			s.Domain.Devices.Watchdog = &v1alpha1.Watchdog{Name: "wd", I6300ESB: &v1alpha1.I6300ESBWatchdog{Action: v1alpha1.WatchdogActionPoweroff}}
			s.Domain.Devices.PanicDevices = []v1alpha1.PanicDevice{{}, {Model: ptr.To(v1alpha1.PanicPvpanic)}} // isa by default
			s.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Model: "e1000", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
			s.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
			h.nics["default"] = machine.NIC{Tap: "tap0", MAC: "02:00:00:aa:bb:01"}
			h.m.SpareRootPorts = 2
		})},
		{"virtio-transitional", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			// Transitional models in legacy slots for what has one; the tablet stays virtio 1.0 on
			// its root port, and so do the spare ports' hot-plugged devices.
			withKernel(s, h)
			s.Domain.Devices.UseVirtioTransitional = ptr.To(true)
			s.Domain.Devices.Rng = &v1alpha1.Rng{}
			s.Domain.Devices.AutoattachMemBalloon = ptr.To(true)
			s.Domain.Devices.Inputs = []v1alpha1.Input{{Name: "vtablet", Bus: v1alpha1.InputBusVirtio}}
			s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root", BootOrder: ptr.To[uint32](1)},
				{Name: "data", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusSCSI}}, {Name: "hot"}}
			s.Volumes = []v1alpha1.Volume{
				{Name: "root", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.raw", Type: v1alpha1.HostDiskExists}}},
				{Name: "data", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}},
				{Name: "hot", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}},
			}
			h.m.Images["root"] = DiskImage{Path: img("root.raw"), Format: "raw"}
			h.m.Images["data"] = DiskImage{Path: img("data.raw"), Format: "raw"}
			h.m.Images["hot"] = DiskImage{Path: img("hot.raw"), Format: "raw"}
			h.ports["hot"] = HotplugPortID(0) // hot-plugged before: virtio 1.0 on its spare port
			s.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
			s.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
			h.nics["default"] = machine.NIC{Tap: "tap0", MAC: "02:00:00:aa:bb:02"}
			h.m.SpareRootPorts = 1
		})},
		{"clock", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			// KubeVirt's clock and KVM features, which QEMU accepts under emulation too: an RTC an
			// hour behind UTC on guest time catching up, the PIT delaying, no HPET, no KVM clock,
			// KVM hidden, paravirtual spinlocks off, SMM on.
			withKernel(s, h)
			s.Domain.Devices.Video = &v1alpha1.VideoDevice{Type: v1alpha1.VideoRamfb}
			s.Domain.CPU = &v1alpha1.CPU{Features: []v1alpha1.CPUFeature{{Name: "aes"}, {Name: "abm", Policy: v1alpha1.CPUFeatureOptional},
				{Name: "svm", Policy: v1alpha1.CPUFeatureDisable}, {Name: "sse4.2", Policy: v1alpha1.CPUFeatureForbid}}}
			s.Domain.Features = &v1alpha1.Features{SMM: &v1alpha1.FeatureState{}, KVM: &v1alpha1.FeatureKVM{Hidden: true},
				Pvspinlock: &v1alpha1.FeatureState{Enabled: ptr.To(false)}}
			s.Domain.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{OffsetSeconds: ptr.To(-3600)}},
				Timer: &v1alpha1.Timer{RTC: &v1alpha1.RTCTimer{TickPolicy: v1alpha1.RTCTickPolicyCatchup, Track: v1alpha1.TrackGuest},
					PIT: &v1alpha1.PITTimer{TickPolicy: v1alpha1.PITTickPolicyDelay}, HPET: &v1alpha1.HPETTimer{Enabled: ptr.To(false)},
					KVM: &v1alpha1.KVMTimer{Enabled: ptr.To(false)}}}
			h.m.RTCStart = time.Date(2026, 1, 2, 2, 4, 5, 0, time.UTC)
		})},
		{"hyperv-kvm", base(false, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			// KubeVirt's Windows enlightenments: the ones synictimer and evmcs need come with them;
			// a hyperv panic device is hv-crash.
			withKernel(s, h)
			s.Domain.Features = &v1alpha1.Features{Hyperv: &v1alpha1.FeatureHyperv{
				Relaxed: &v1alpha1.FeatureState{}, VAPIC: &v1alpha1.FeatureState{}, Spinlocks: &v1alpha1.FeatureSpinlocks{},
				SyNICTimer: &v1alpha1.SyNICTimer{Direct: &v1alpha1.FeatureState{}}, Frequencies: &v1alpha1.FeatureState{},
				Reenlightenment: &v1alpha1.FeatureState{}, IPI: &v1alpha1.FeatureState{}, Runtime: &v1alpha1.FeatureState{},
				Reset: &v1alpha1.FeatureState{}, TLBFlush: &v1alpha1.TLBFlush{Direct: &v1alpha1.FeatureState{}, Extended: &v1alpha1.FeatureState{}},
				VendorID: &v1alpha1.FeatureVendorID{VendorID: "Microsoft Hv"}, EVMCS: &v1alpha1.FeatureState{}}}
			s.Domain.Clock = &v1alpha1.Clock{Timer: &v1alpha1.Timer{Hyperv: &v1alpha1.HypervTimer{}}}
			s.Domain.Devices.PanicDevices = []v1alpha1.PanicDevice{{Model: ptr.To(v1alpha1.PanicHyperv)}}
		})},
		{"backing-chain-and-legacy-nics", base(true, func(s *v1alpha1.VirtualMachineInstanceSpec, h *host) {
			withKernel(s, h)
			s.Domain.Devices.Video = &v1alpha1.VideoDevice{Type: v1alpha1.VideoCirrus}
			s.Domain.CPU = &v1alpha1.CPU{Model: "max", Cores: 4}
			long := "a-very-long-disk-name-that-exceeds-qemu-node-names"
			s.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root", BootOrder: ptr.To[uint32](1)}, {Name: long}}
			s.Volumes = []v1alpha1.Volume{
				{Name: "root", VolumeSource: v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/var/lib/images/root.qcow2", Type: v1alpha1.HostDiskExists}}},
				{Name: long, VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("64Mi")}}},
			}
			// A copy-on-write overlay over a base image, given explicitly: QEMU never reads the
			// backing file name from the overlay.
			h.m.Images["root"] = DiskImage{Path: img("root-overlay.qcow2"), Format: "qcow2",
				Backing: &DiskImage{Path: img("root-base.qcow2"), Format: "qcow2", ReadOnly: true,
					Backing: &DiskImage{Path: img("root-base.raw"), Format: "raw", ReadOnly: true}}}
			h.m.Images[long] = DiskImage{Path: img("odd, name=with,commas.raw"), Format: "raw"}
			models := []string{"e1000", "rtl8139", "e1000e", "virtio"}
			for i, model := range models {
				name := "net" + model
				s.Domain.Devices.Interfaces = append(s.Domain.Devices.Interfaces, v1alpha1.Interface{Name: name, Model: model, Bridge: &v1alpha1.InterfaceBridge{}})
				s.Networks = append(s.Networks, v1alpha1.Network{Name: name, Multus: &v1alpha1.MultusNetwork{NetworkName: name}})
				h.nics[name] = machine.NIC{Tap: fmt.Sprintf("tap%d", i), MAC: fmt.Sprintf("02:00:00:00:01:%02x", i)}
			}
			h.m.SpareRootPorts = 9 // with the two PCIe NICs and the virtio disks: two slots of root ports
		})},
	}
}

// efiFiles is what a launcher resolves for an EFI machine under root: OVMF's code in its
// directory and the machine's variable store in its scratch directory.
func efiFiles(m *Machine, root string, secureBoot bool) {
	code, _ := OVMFFiles(secureBoot)
	m.EFICode = filepath.Join(root, "ovmf", code)
	m.EFIVars = filepath.Join(root, "private", EFIVarsFile)
}

func TestBuildArgvGolden(t *testing.T) {
	for _, c := range argvCases(goldenRoot, goldenRoot+"/run/default_vm1") {
		t.Run(c.name, func(t *testing.T) {
			argv, err := BuildArgv(c.m)
			if err != nil {
				t.Fatalf("BuildArgv: %v", err)
			}
			got := strings.Join(argv, "\n") + "\n"
			path := filepath.Join("testdata", c.name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./launcher -run TestBuildArgvGolden -update)", err)
			}
			if got != string(want) {
				t.Errorf("argv differs from %s (rerun with -update after checking):\n%s", path, lineDiff(string(want), got))
			}
			again, _ := BuildArgv(c.m)
			if !slices.Equal(argv, again) {
				t.Errorf("BuildArgv is not deterministic")
			}
		})
	}
}

func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := range max(len(w), len(g)) {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %s\n  got  %s\n", i+1, wl, gl)
		}
	}
	return b.String()
}

// fullMachine is the valid machine each error case changes one thing in.
func fullMachine(t *testing.T) *Machine {
	for _, c := range argvCases(goldenRoot, goldenRoot+"/run") {
		if c.name == "full" {
			if _, err := BuildArgv(c.m); err != nil {
				t.Fatalf("the base machine must be valid: %v", err)
			}
			return c.m
		}
	}
	panic("no full case")
}

func TestBuildArgvErrors(t *testing.T) {
	disks, nics := "machine.disks", "machine.nics"
	cases := []struct {
		name   string
		mutate func(m *Machine)
		path   string
	}{
		{"unknown bus", func(m *Machine) { m.Disks[1].Bus = "ide" }, disks + "[1].bus"},
		{"real-time vCPUs without dedicated CPUs", func(m *Machine) { m.CPU.RealtimeVCPUs = []uint32{0} }, "machine.cpu.realtimeVCPUs"},
		{"a real-time vCPU the machine lacks", func(m *Machine) {
			m.CPU.DedicatedCPUs, m.CPU.RealtimeVCPUs = true, []uint32{m.CPU.VCPUs}
		}, "machine.cpu.realtimeVCPUs[0]"},
		{"a real-time vCPU twice", func(m *Machine) { m.CPU.DedicatedCPUs, m.CPU.RealtimeVCPUs = true, []uint32{0, 0} }, "machine.cpu.realtimeVCPUs[1]"},
		{"the NUMA mapping without huge pages", func(m *Machine) { m.CPU.DedicatedCPUs, m.CPU.NUMAPassthrough = true, true }, "machine.cpu.numaPassthrough"},
		{"the NUMA mapping without dedicated CPUs", func(m *Machine) { m.HugePageKiB, m.CPU.NUMAPassthrough = 2048, true }, "machine.cpu.numaPassthrough"},
		{"unknown cache", func(m *Machine) { m.Disks[1].Cache = "unsafe" }, disks + "[1].cache"},
		{"native I/O with the page cache", func(m *Machine) { m.Disks[1].IO = machine.IONative }, disks + "[1].io"},
		{"writable cdrom", func(m *Machine) { m.Disks[2].ReadOnly = false }, disks + "[2].readOnly"},
		{"bad disk serial", func(m *Machine) { m.Disks[0].Serial = "a,b" }, disks + "[0].serial"},
		{"two disks of one name", func(m *Machine) { m.Disks[1].Name = "root" }, disks + "[1].name"},
		{"missing disk image", func(m *Machine) { delete(m.Images, "data") }, "machine.images[data]"},
		{"image nobody attaches", func(m *Machine) { m.Images["spare"] = DiskImage{Path: "/x.raw", Format: "raw"} }, "machine.images[spare]"},
		{"unsupported format", func(m *Machine) { m.Images["data"] = DiskImage{Path: "/x.vmdk", Format: "vmdk"} }, "machine.images[data]"},
		{"format left to probing", func(m *Machine) { m.Images["data"] = DiskImage{Path: "/x.img"} }, "machine.images[data]"},
		{"unsupported backing format", func(m *Machine) {
			m.Images["root"] = DiskImage{Path: "/o.qcow2", Format: "qcow2", Backing: &DiskImage{Path: "/b", Format: "vpc"}}
		}, "machine.images[root]"},
		{"raw with backing", func(m *Machine) {
			m.Images["root"] = DiskImage{Path: "/o.raw", Format: "raw", Backing: &DiskImage{Path: "/b", Format: "raw"}}
		}, "machine.images[root]"},
		{"relative image path", func(m *Machine) { m.Images["data"] = DiskImage{Path: "images/data.raw", Format: "raw"} }, "machine.images[data]"},
		{"NUL in image path", func(m *Machine) { m.Images["data"] = DiskImage{Path: "/data\x00.raw", Format: "raw"} }, "machine.images[data]"},
		{"seven sata devices", func(m *Machine) {
			for i := range 6 {
				n := fmt.Sprintf("extra%d", i)
				m.Disks = append(m.Disks, machine.Disk{Name: n, Bus: machine.BusSATA, Cache: machine.CacheNone, IO: machine.IOThreads})
				m.Images[n] = DiskImage{Path: "/" + n, Format: "raw"}
			}
		}, disks + "[8].bus"},
		{"read-only sata disk", func(m *Machine) { m.Disks[1].Bus, m.Disks[1].ReadOnly = machine.BusSATA, true }, disks + "[1].readOnly"},
		{"bad tap name", func(m *Machine) { m.NICs[1].Tap = "tap,vhost=on" }, nics + "[1].tap"},
		{"bad MAC", func(m *Machine) { m.NICs[1].MAC = "02:00:00:00:00" }, nics + "[1].mac"},
		{"multicast MAC", func(m *Machine) { m.NICs[0].MAC = "01:00:5e:00:00:01" }, nics + "[0].mac"},
		{"MAC clash", func(m *Machine) { m.NICs[0].MAC = "02:00:00:aa:bb:02" }, nics + "[1].mac"},
		{"no MAC at all", func(m *Machine) { m.NICs[0].MAC = "" }, nics + "[0].mac"},
		{"two NICs of one name", func(m *Machine) { m.NICs[1].Name = "default" }, nics + "[1].name"},
		{"Hyper-V under emulation", func(m *Machine) { m.CPU.HyperV = &machine.HyperV{Relaxed: true} }, "machine.cpu.hyperV"},
		{"Hyper-V passthrough with a flag", func(m *Machine) {
			m.Accel, m.CPU.Model, m.CPU.HyperV = machine.AccelKVM, "host", &machine.HyperV{Passthrough: true, Relaxed: true}
		}, "machine.cpu.hyperV"},
		{"vendor id with a comma", func(m *Machine) {
			m.Accel, m.CPU.Model, m.CPU.HyperV = machine.AccelKVM, "host", &machine.HyperV{VendorID: "a,vmx=on"}
		}, "machine.cpu.hyperV.vendorID"},
		{"too few spinlock retries", func(m *Machine) {
			m.Accel, m.CPU.Model, m.CPU.HyperV = machine.AccelKVM, "host", &machine.HyperV{Spinlocks: 100}
		}, "machine.cpu.hyperV.spinlocks"},
		{"RTC offset without a start time", func(m *Machine) { m.Clock.RTCOffsetSeconds = 60 }, "machine.rtcStart"},
		{"RTC start time without an offset", func(m *Machine) { m.RTCStart = time.Unix(1, 0) }, "machine.rtcStart"},
		{"unknown RTC clock", func(m *Machine) { m.Clock.RTCClock = "rt" }, "machine.clock.rtcClock"},
		{"PIT policy without a PIT", func(m *Machine) { m.Clock.NoPIT, m.Clock.PITLostTicks = true, machine.LostTickDelay }, "machine.clock.pitLostTicks"},
		{"unknown PIT policy", func(m *Machine) { m.Clock.PITLostTicks = "merge" }, "machine.clock.pitLostTicks"},
		{"unknown NIC model", func(m *Machine) { m.NICs[1].Model = "ne2k_pci" }, nics + "[1].model"},
		{"host CPU under emulation", func(m *Machine) { m.CPU.Model = "host" }, "machine.cpu.model"},
		{"CPU model with an option", func(m *Machine) { m.CPU.Model = "qemu64,+vmx" }, "machine.cpu.model"},
		{"vCPUs that do not match the topology", func(m *Machine) { m.CPU.VCPUs = 3 }, "machine.cpu.vcpus"},
		{"no memory", func(m *Machine) { m.MemoryMiB = 0 }, "machine.memoryMiB"},
		{"maxMemoryMiB below memoryMiB", func(m *Machine) { m.MemoryMiB, m.MaxMemoryMiB = 1024, 512 }, "machine.maxMemoryMiB"},
		{"maxMemoryMiB beyond the address space", func(m *Machine) { m.MemoryMiB, m.MaxMemoryMiB = 1024, 980<<10 }, "machine.maxMemoryMiB"},
		{"hotplug room of part of a block", func(m *Machine) { m.MemoryMiB, m.MaxMemoryMiB = 1024, 2049 }, "machine.maxMemoryMiB"},
		{"hotplug room with huge pages", func(m *Machine) { m.MemoryMiB, m.MaxMemoryMiB, m.HugePageKiB = 1024, 2048, 2048 }, "machine.maxMemoryMiB"},
		{"plugged beyond the room", func(m *Machine) { m.MemoryMiB, m.MaxMemoryMiB, m.PluggedMemoryMiB = 1024, 2048, 1026 }, "machine.pluggedMemoryMiB"},
		{"plugged without room", func(m *Machine) { m.PluggedMemoryMiB = 2 }, "machine.pluggedMemoryMiB"},
		{"unknown accelerator", func(m *Machine) { m.Accel = "hvf" }, "machine.accel"},
		{"machine type with an option", func(m *Machine) { m.Type = "q35,smm=on" }, "machine.type"},
		{"kernel without its file", func(m *Machine) { m.KernelFile = "" }, "machine.kernel.kernelPath"},
		{"kernel without the initrd", func(m *Machine) { m.InitrdFile = "" }, "machine.kernel.initrdPath"},
		{"kernel file without a kernel", func(m *Machine) { m.Kernel = nil }, "machine.kernel"},
		{"NUL in kernel args", func(m *Machine) { m.Kernel.Args = "console=ttyS0\x00rm" }, "machine.kernel.args"},
		{"bad uuid", func(m *Machine) { m.UUID = "not-a-uuid" }, "machine.uuid"},
		{"bad SMBIOS serial", func(m *Machine) { m.SMBIOSSerial = "a,b" }, "machine.smbiosSerial"},
		{"bad name", func(m *Machine) { m.Name = "vm,1" }, "machine.name"},
		{"no namespace", func(m *Machine) { m.Namespace = "" }, "machine.namespace"},
		{"negative grace period", func(m *Machine) { m.GracePeriodSeconds = -1 }, "machine.gracePeriodSeconds"},
		{"relative run dir", func(m *Machine) { m.RunDir = "run" }, "machine.runDir"},
		{"run dir too long for sockets", func(m *Machine) { m.RunDir = "/" + strings.Repeat("r", 100) }, "machine.runDir"},
		{"negative spare ports", func(m *Machine) { m.SpareRootPorts = -1 }, "machine.spareRootPorts"},
		{"too many root ports", func(m *Machine) { m.SpareRootPorts = MaxRootPorts - 2 }, "machine.spareRootPorts"},
		{"hot-plugged disk on a port that is not a spare", func(m *Machine) { m.Disks[1].Port = "hotplug4" }, disks + "[1].port"},
		{"two hot-plugged disks on one port", func(m *Machine) {
			m.Disks[0].BootIndex = nil
			m.Disks[0].Port, m.Disks[1].Port = "hotplug0", "hotplug0"
		}, disks + "[1].port"},
		{"hot-plugged sata disk", func(m *Machine) { m.Disks[2].Port = "hotplug0" }, disks + "[2].port"},
		{"lun off the scsi bus", func(m *Machine) {
			m.Disks[1].LUN, m.Disks[1].Source = true, machine.Source{Claim: &machine.Claim{Name: "c", Device: "/dev/c"}}
		}, disks + "[1].bus"},
		{"lun on an image file", func(m *Machine) { m.Disks[1].LUN, m.Disks[1].Bus = true, machine.BusSCSI }, disks + "[1].source"},
		{"lun with a serial", func(m *Machine) {
			m.Disks[1].LUN, m.Disks[1].Bus, m.Disks[1].Serial = true, machine.BusSCSI, "s1"
			m.Disks[1].Source = machine.Source{Claim: &machine.Claim{Name: "c", Device: "/dev/c"}}
		}, disks + "[1].serial"},
		{"hot-plugged lun", func(m *Machine) {
			m.Disks[1].LUN, m.Disks[1].Port = true, "hotplug0"
			m.Disks[1].Source = machine.Source{Claim: &machine.Claim{Name: "c", Device: "/dev/c"}}
		}, disks + "[1].port"},
		{"CPU feature with an option", func(m *Machine) { m.CPU.Features = []machine.CPUFeature{{Name: "aes,vmx=on", Policy: "require"}} }, "machine.cpu.features[0].name"},
		{"unknown CPU feature policy", func(m *Machine) { m.CPU.Features = []machine.CPUFeature{{Name: "aes", Policy: "prefer"}} }, "machine.cpu.features[0].policy"},
		{"EFI without OVMF's code", func(m *Machine) {
			m.Firmware.EFI, m.EFIVars = &machine.EFI{}, "/private/efi-vars.fd"
		}, "machine.firmware.efi.code"},
		{"EFI with a relative variable store", func(m *Machine) {
			m.Firmware.EFI, m.EFICode, m.EFIVars = &machine.EFI{}, "/ovmf/code.fd", "efi-vars.fd"
		}, "machine.firmware.efi.vars"},
		{"secure boot without SMM", func(m *Machine) {
			m.Firmware.EFI, m.EFICode, m.EFIVars = &machine.EFI{SecureBoot: true}, "/ovmf/code.fd", "/private/efi-vars.fd"
		}, "machine.smm"},
		{"secure boot with SMM off", func(m *Machine) {
			m.Firmware.EFI, m.EFICode, m.EFIVars = &machine.EFI{SecureBoot: true}, "/ovmf/code.fd", "/private/efi-vars.fd"
			m.SMM = ptr.To(false)
		}, "machine.smm"},
		{"input on a PS/2 bus", func(m *Machine) {
			m.Inputs = []machine.Input{{Name: "kbd", Bus: "ps2", Type: machine.InputTablet}}
		}, "machine.inputs[0].bus"},
		{"input that is no tablet", func(m *Machine) {
			m.Inputs = []machine.Input{{Name: "mouse", Bus: machine.InputUSB, Type: "mouse"}}
		}, "machine.inputs[0].type"},
		{"two inputs of one name", func(m *Machine) {
			m.Inputs = []machine.Input{{Name: "t", Bus: machine.InputUSB, Type: machine.InputTablet}, {Name: "t", Bus: machine.InputVirtio, Type: machine.InputTablet}}
		}, "machine.inputs[1].name"},
		{"input name with an option", func(m *Machine) {
			m.Inputs = []machine.Input{{Name: "t,bus=pcie.0", Bus: machine.InputUSB, Type: machine.InputTablet}}
		}, "machine.inputs[0].name"},
		{"unknown watchdog action", func(m *Machine) {
			m.Watchdog = &machine.Watchdog{Name: "wd", Model: machine.WatchdogI6300ESB, Action: "inject-nmi"}
		}, "machine.watchdog.action"},
		{"unknown watchdog model", func(m *Machine) {
			m.Watchdog = &machine.Watchdog{Name: "wd", Model: "diag288", Action: machine.WatchdogReset}
		}, "machine.watchdog.model"},
		{"watchdog name with an option", func(m *Machine) {
			m.Watchdog = &machine.Watchdog{Name: "wd,addr=0x3", Model: machine.WatchdogI6300ESB, Action: machine.WatchdogReset}
		}, "machine.watchdog.name"},
		{"a block size QEMU does not take", func(m *Machine) {
			m.Disks[0].BlockSize = &machine.BlockSize{Logical: 4096, Physical: 3000}
		}, "machine.disks[0].blockSize.physical"},
		{"logical blocks larger than physical", func(m *Machine) {
			m.Disks[0].BlockSize = &machine.BlockSize{Logical: 4096, Physical: 512}
		}, "machine.disks[0].blockSize.logical"},
		{"unknown panic device", func(m *Machine) { m.Panic = []string{machine.PanicISA, "s390"} }, "machine.panic[1]"},
		{"two ISA panic devices", func(m *Machine) { m.Panic = []string{machine.PanicISA, machine.PanicISA} }, "machine.panic[1]"},
		{"OVMF's files for a SeaBIOS machine", func(m *Machine) { m.EFICode = "/ovmf/code.fd" }, "machine.firmware.efi"},
		{"SeaBIOS's serial output under EFI", func(m *Machine) {
			m.Firmware.EFI, m.EFICode, m.EFIVars = &machine.EFI{}, "/ovmf/code.fd", "/private/efi-vars.fd"
			m.Firmware.SerialBIOS = true
		}, "machine.firmware.serialBIOS"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := fullMachine(t)
			c.mutate(m)
			argv, err := BuildArgv(m)
			if err == nil {
				t.Fatalf("BuildArgv accepted it: %q", argv)
			}
			var ime *InvalidMachineError
			if !errors.As(err, &ime) {
				t.Fatalf("error %T is not an *InvalidMachineError: %v", err, err)
			}
			var fe *machine.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("errors.As finds no *machine.FieldError in %v", err)
			}
			var paths []string
			for _, e := range ime.Errs {
				paths = append(paths, e.Field)
			}
			if !slices.Contains(paths, c.path) {
				t.Errorf("want an error at %s, got %v", c.path, err)
			}
		})
	}
}

func TestBuildArgvAllProblemsAtOnce(t *testing.T) {
	m := fullMachine(t)
	delete(m.Images, "data")
	m.NICs[1].Tap = ""
	m.MemoryMiB = 0
	_, err := BuildArgv(m)
	var ime *InvalidMachineError
	if !errors.As(err, &ime) || len(ime.Errs) != 3 {
		t.Fatalf("want three errors, got %v", err)
	}
}

func TestNodeNames(t *testing.T) {
	long := strings.Repeat("a", 63)
	names := map[string]bool{}
	for _, disk := range []string{"root", "a-disk-name-of-25-chars-x", long, long[:62] + "b", long + ".b1", long + ".b2"} {
		for _, n := range []string{FileNode(disk), DriveNode(disk)} {
			if len(n) > maxNodeName {
				t.Errorf("%q is longer than %d bytes", n, maxNodeName)
			}
			if names[n] {
				t.Errorf("node name %q given twice", n)
			}
			names[n] = true
		}
	}
	if got := DriveNode("root"); got != "drive-root" {
		t.Errorf("DriveNode(root) = %q", got)
	}
	if got := FileNode("a-disk-name-of-25-chars-x"); got != "file-a-disk-name-of-25-chars-x" {
		t.Errorf("a name that fits is shortened: %q", got)
	}
}

// TestQEMUAcceptsArgv starts the real qemu-system-x86_64 (paused, -S) with every TCG case's argv
// over real files, and checks that it comes up: QMP answers, every -device exists, the consoles'
// sockets appear. The run directory's name holds a comma to prove the QemuOpts escaping. Each QEMU
// runs in a fresh network namespace, where it creates its taps itself (we are root) and which
// disappears with it. The kvm case is left out: KVM cannot run guests on these machines.
func TestQEMUAcceptsArgv(t *testing.T) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatalf("qemu-system-x86_64 is required (apt-get install -y qemu-system-x86 qemu-utils): %v", err)
	}
	for _, c := range argvCases("/ROOT", "/RUN") {
		if c.m.Accel != machine.AccelTCG {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			runDir := filepath.Join(root, "run,dir")
			m := machineAt(c.name, root, runDir)
			if err := os.MkdirAll(runDir, 0o700); err != nil {
				t.Fatal(err)
			}
			makeFiles(t, m)
			argv, err := BuildArgv(m)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(qemu, argv...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			// stop kills the QEMU this test started, by its pid, and returns its stderr (safe to
			// read only once Wait has returned).
			var once sync.Once
			stop := func() string {
				once.Do(func() {
					_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
					<-exited
				})
				return stderr.String()
			}
			t.Cleanup(func() { stop() })
			deadline := time.Now().Add(15 * time.Second)
			for {
				if _, err := os.Stat(m.QMPSocket()); err == nil {
					break
				}
				select {
				case err := <-exited:
					exited <- err
					t.Fatalf("QEMU exited (%v): %s\nargv: %q", err, stop(), argv)
				case <-time.After(20 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("no QMP socket after 15 s; stderr: %s", stop())
				}
			}
			mon := dialQMP(t, m.QMPSocket(), func() string { return "; QEMU stderr: " + stop() })
			status := mon.run(t, `{"execute":"query-status"}`)
			want := "prelaunch"
			if m.Incoming {
				want = "inmigrate"
			}
			if got := status["status"]; got != want {
				t.Errorf("status %v, want %s", got, want)
			}
			checkRAMSize(t, m, mon.run(t, `{"execute":"query-memory-size-summary"}`))
			var devs []any
			_ = json.Unmarshal(mon.runRaw(t, `{"execute":"qom-list","arguments":{"path":"/machine/peripheral"}}`), &devs)
			have := map[string]bool{}
			for _, d := range devs {
				have[d.(map[string]any)["name"].(string)] = true
			}
			for i, a := range argv {
				if a != "-device" {
					continue
				}
				if id := deviceID(argv[i+1]); id != "" && !have[id] {
					t.Errorf("device %s is missing in /machine/peripheral %v", id, have)
				}
			}
			socks := []string{m.ShellQMPSocket()}
			if m.SerialConsole {
				socks = append(socks, m.SerialSocket())
			}
			if m.Graphics {
				socks = append(socks, m.VNCSocket())
			}
			for _, s := range socks {
				if fi, err := os.Stat(s); err != nil || fi.Mode()&os.ModeSocket == 0 {
					t.Errorf("socket %s: %v", s, err)
				}
			}
			if pid, err := os.ReadFile(m.PIDFile()); err != nil || strings.TrimSpace(string(pid)) != fmt.Sprint(cmd.Process.Pid) {
				t.Errorf("pid file: %q, %v; want %d", pid, err, cmd.Process.Pid)
			}
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("QEMU exited (%v): %s", err, stop())
			default:
			}
			// QEMU says nothing about an argv it fully accepts: no deprecation or other warnings.
			if out := stop(); out != "" {
				t.Errorf("QEMU wrote to stderr: %s", out)
			}
		})
	}
}

// deviceID is the id of a -device argument, in QemuOpts or JSON form.
func deviceID(arg string) string {
	if strings.HasPrefix(arg, "{") {
		var dev struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal([]byte(arg), &dev)
		return dev.ID
	}
	for _, kv := range strings.Split(arg, ",") {
		if id, ok := strings.CutPrefix(kv, "id="); ok {
			return id
		}
	}
	return ""
}

// machineAt is case name's machine with its files under root.
func machineAt(name, root, runDir string) *Machine {
	for _, c := range argvCases(root, runDir) {
		if c.name == name {
			return c.m
		}
	}
	panic(name)
}

// makeFiles creates the kernel, initrd and images m refers to: qcow2 with qemu-img, raw sparse.
func makeFiles(t *testing.T, m *Machine) {
	t.Helper()
	write := func(path string, data []byte) {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if m.KernelFile != "" {
		write(m.KernelFile, fakeBzImage())
	}
	if m.InitrdFile != "" {
		write(m.InitrdFile, make([]byte, 4096))
	}
	if efi := m.Firmware.EFI; efi != nil {
		// The real OVMF build: QEMU checks the flash sizes against the machine's.
		code, tmpl := OVMFFiles(efi.SecureBoot)
		for path, src := range map[string]string{m.EFICode: code, m.EFIVars: tmpl} {
			data, err := os.ReadFile(filepath.Join(DefaultOVMFDir, src))
			if err != nil {
				t.Fatalf("%v (install Debian's ovmf package)", err)
			}
			write(path, data)
		}
	}
	var mk func(img *DiskImage)
	mk = func(img *DiskImage) {
		if img.Backing != nil {
			mk(img.Backing)
		}
		switch img.Format {
		case "raw":
			write(img.Path, nil)
			if err := os.Truncate(img.Path, 16<<20); err != nil {
				t.Fatal(err)
			}
		case "qcow2":
			if err := os.MkdirAll(filepath.Dir(img.Path), 0o755); err != nil {
				t.Fatal(err)
			}
			args := []string{"create", "-q", "-f", "qcow2"}
			if img.Backing != nil {
				args = append(args, "-b", img.Backing.Path, "-F", img.Backing.Format)
			}
			args = append(args, img.Path, "16M")
			if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
				t.Fatalf("qemu-img %q: %v: %s", args, err, out)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.Images)) {
		img := m.Images[name]
		mk(&img)
	}
}

// fakeBzImage is the smallest file QEMU 7.2 loads as a Linux bzImage (boot protocol 2.15, loaded
// high). It never runs: the tests keep the guest paused.
func fakeBzImage() []byte {
	b := make([]byte, 5*512+4096)
	b[0x1f1] = 4 // setup sectors
	b[0x1fe], b[0x1ff] = 0x55, 0xaa
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(b[0x206:], 0x020f)
	b[0x211] = 0x01 // LOADED_HIGH
	binary.LittleEndian.PutUint32(b[0x22c:], 0x37ffffff)
	binary.LittleEndian.PutUint32(b[0x238:], 2048)
	return b
}

// testQMP is a minimal QMP client for the acceptance test (the qmp package is tested on its own).
type testQMP struct {
	conn net.Conn
	r    *bufio.Reader
	diag func() string // more context for a failure, such as QEMU's stderr
}

func dialQMP(t *testing.T, path string, diag func() string) *testQMP {
	t.Helper()
	// The socket file appears at bind(), a moment before QEMU listens on it.
	var conn net.Conn
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if conn, err = net.Dial("unix", path); err == nil || !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("%v%s", err, diag())
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	q := &testQMP{conn: conn, r: bufio.NewReader(conn), diag: diag}
	if _, err := q.r.ReadBytes('\n'); err != nil { // greeting
		t.Fatalf("QMP greeting: %v%s", err, diag())
	}
	q.runRaw(t, `{"execute":"qmp_capabilities"}`)
	return q
}

func (q *testQMP) runRaw(t *testing.T, cmd string) json.RawMessage {
	t.Helper()
	if _, err := q.conn.Write([]byte(cmd + "\n")); err != nil {
		t.Fatalf("%v%s", err, q.diag())
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("%s: %v%s", cmd, err, q.diag())
		}
		var reply struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}
		if err := json.Unmarshal(line, &reply); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		switch {
		case reply.Event != "":
			continue
		case reply.Error != nil:
			t.Fatalf("%s: %s%s", cmd, reply.Error.Desc, q.diag())
		}
		return reply.Return
	}
}

func (q *testQMP) run(t *testing.T, cmd string) map[string]any {
	t.Helper()
	var out map[string]any
	if err := json.Unmarshal(q.runRaw(t, cmd), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// FuzzBuildArgv feeds arbitrary machine descriptions, with every disk and the kernel resolved, to
// BuildArgv: it must not panic, must fail only with an *InvalidMachineError, and no argument may
// hold a NUL byte.
func FuzzBuildArgv(f *testing.F) {
	for _, c := range argvCases(goldenRoot, goldenRoot+"/run") {
		js, err := json.Marshal(c.m.Machine)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(js, uint8(c.m.SpareRootPorts))
	}
	f.Add([]byte(`{"name":"vm1","namespace":"default","uuid":"6a1c6d35-6a0e-4b9b-9d3a-0123456789ab","type":"q35","accel":"tcg",`+
		`"cpu":{"model":"qemu64","vcpus":1,"sockets":1,"cores":1,"threads":1},"memoryMiB":128,`+
		`"filesystems":[{"name":"data","kind":"persistentVolumeClaim","dir":"/var/run/qvirt/claims/data"}]}`), uint8(1))
	f.Fuzz(func(t *testing.T, js []byte, spares uint8) {
		var desc machine.Machine
		if err := json.Unmarshal(js, &desc); err != nil {
			return
		}
		m := &Machine{Machine: desc, RunDir: "/run/qvirt/vm1", SpareRootPorts: int(spares), Images: map[string]DiskImage{}}
		if desc.Kernel != nil {
			m.KernelFile, m.InitrdFile = "/boot/vmlinuz", "/boot/initrd.img"
		}
		if desc.Firmware.EFI != nil {
			m.EFICode, m.EFIVars = "/ovmf/code.fd", "/private/efi-vars.fd"
		}
		for i, d := range desc.Disks {
			format := []string{"raw", "qcow2"}[i%2]
			m.Images[d.Name] = DiskImage{Path: "/images/" + d.Name, Format: format, ReadOnly: i%3 == 0}
		}
		argv, err := BuildArgv(m)
		if err != nil {
			var ime *InvalidMachineError
			if !errors.As(err, &ime) || len(ime.Errs) == 0 {
				t.Fatalf("error %T without field errors: %v", err, err)
			}
			return
		}
		if len(argv) == 0 {
			t.Fatal("empty argv without an error")
		}
		for _, a := range argv {
			if strings.IndexByte(a, 0) >= 0 {
				t.Fatalf("argument with a NUL byte: %q", a)
			}
		}
	})
}

// TestNoHotplugLeavesNoSparePorts: a machine with hot-plug disabled gets none of the resolver's
// spare root ports, so its argv has no hotplug port.
func TestNoHotplugLeavesNoSparePorts(t *testing.T) {
	for _, off := range []bool{false, true} {
		desc := fullMachine(t).Machine
		desc.Disks, desc.NICs, desc.NoHotplug = nil, nil, off
		kernel := desc.Kernel
		desc.Kernel = nil // the resolver would pull it
		m, err := HostResolver{SpareRootPorts: 3}.Resolve(&desc, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		m.Kernel, m.KernelFile, m.InitrdFile = kernel, "/boot/vmlinuz", "/boot/initrd.img"
		argv, err := BuildArgv(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(strings.Join(argv, " "), "id="+SpareRootPortPrefix); (got == 0) != off || (!off && got != 3) {
			t.Errorf("noHotplug %v: %d spare root ports in %q", off, got, argv)
		}
	}
}

// checkRAMSize holds QEMU's guest RAM (query-memory-size-summary) to the machine's: under TCG
// it must not be a multiple of 256 KiB, or QEMU 7.2 loses guest writes in a live migration
// (tcgRAMPadKiB).
func checkRAMSize(t *testing.T, m *Machine, summary map[string]any) {
	t.Helper()
	got, _ := summary["base-memory"].(float64)
	want := float64(m.MemoryMiB << 20)
	if m.Accel == machine.AccelTCG {
		want += tcgRAMPadKiB << 10
		if int64(got)%(256<<10) == 0 {
			t.Errorf("guest RAM %d bytes is a multiple of 256 KiB under TCG: QEMU would sync its migration bitmap a word at a time and lose writes", int64(got))
		}
	}
	if got != want {
		t.Errorf("guest RAM %d bytes, want %d", int64(got), int64(want))
	}
}
