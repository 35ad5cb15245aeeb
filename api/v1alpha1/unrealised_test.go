package v1alpha1

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// realisedSpec is the one valid spec, every part of it realised, that each case below changes.
func realisedSpec() *VirtualMachineInstanceSpec {
	return &VirtualMachineInstanceSpec{
		EvictionStrategy: ptr.To(EvictionStrategyLiveMigrate),
		Domain: DomainSpec{
			CPU:    &CPU{Cores: 2, Model: "host-model"},
			Memory: &Memory{Guest: ptr.To(resource.MustParse("256Mi"))},
			Firmware: &Firmware{Bootloader: &Bootloader{EFI: &EFI{Persistent: ptr.To(false)}},
				KernelBoot: &KernelBoot{KernelArgs: "console=ttyS0", Container: &KernelBootContainer{
					Image: "example/guest:1", ImagePullSecret: "regcred", KernelPath: "/boot/vmlinuz", InitrdPath: "/boot/initrd.img"}}},
			Features: &Features{SMM: &FeatureState{}, APIC: &FeatureAPIC{EndOfInterrupt: true}, KVM: &FeatureKVM{Hidden: true}, Pvspinlock: &FeatureState{},
				Hyperv: &FeatureHyperv{Relaxed: &FeatureState{}, SyNICTimer: &SyNICTimer{Direct: &FeatureState{}}, Spinlocks: &FeatureSpinlocks{}}},
			Clock: &Clock{ClockOffset: ClockOffset{UTC: &ClockOffsetUTC{OffsetSeconds: ptr.To(3600)}}, Timer: &Timer{
				HPET: &HPETTimer{Enabled: ptr.To(false)}, PIT: &PITTimer{TickPolicy: PITTickPolicyCatchup}, KVM: &KVMTimer{},
				RTC: &RTCTimer{TickPolicy: RTCTickPolicyCatchup, Track: TrackWall}, Hyperv: &HypervTimer{}}},
			Devices: Devices{
				Rng:               &Rng{},
				ClientPassthrough: &ClientPassthroughDevices{},
				Inputs:            []Input{{Name: "tablet"}, {Name: "vtablet", Bus: InputBusVirtio, Type: InputTypeTablet}},
				Watchdog:          &Watchdog{Name: "wd", I6300ESB: &I6300ESBWatchdog{Action: WatchdogActionPoweroff}},
				Disks: []Disk{
					{Name: "root", Disk: &DiskTarget{Bus: DiskBusVirtio}, BootOrder: ptr.To[uint32](1), BlockSize: &BlockSize{MatchVolume: &FeatureState{}}},
					{Name: "scratch", Disk: &DiskTarget{Bus: DiskBusSATA}},
					{Name: "data", Disk: &DiskTarget{Bus: DiskBusSCSI}},
					{Name: "cidata", CDRom: &CDRomTarget{Bus: DiskBusSATA}},
				},
				Interfaces: []Interface{{Name: "default", Masquerade: &InterfaceMasquerade{}, Ports: []Port{{Name: "http", Port: 80}}}},
			},
		},
		Volumes: []Volume{
			{Name: "root", VolumeSource: VolumeSource{ContainerDisk: &ContainerDiskSource{Image: "example/disk:1", ImagePullSecret: "regcred"}}},
			{Name: "scratch", VolumeSource: VolumeSource{EmptyDisk: &EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}},
			{Name: "data", VolumeSource: VolumeSource{HostDisk: &HostDisk{Path: "/var/lib/qvirt/data.img", Type: HostDiskExists}}},
			{Name: "cidata", VolumeSource: VolumeSource{CloudInitNoCloud: &CloudInitNoCloudSource{
				UserDataSecretRef: &corev1.LocalObjectReference{Name: "userdata"}, NetworkData: "version: 2\n"}}},
		},
		Networks: []Network{{Name: "default", Pod: &PodNetwork{VMNetworkCIDR: DefaultVMNetworkCIDR}}},
		// A named port (the interface's) and a command the guest agent runs: both realised.
		ReadinessProbe: &Probe{Handler: Handler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("http"), Path: "/"}}},
		LivenessProbe:  &Probe{Handler: Handler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}}, InitialDelaySeconds: 60},
	}
}

func TestNotRealised(t *testing.T) {
	base := realisedSpec()
	p := field.NewPath("spec")
	if errs := append(ValidateVirtualMachineInstanceSpec(base, p), NotRealised(base, p)...); len(errs) != 0 {
		t.Fatalf("the base spec must be valid and realised, got %v", errs)
	}
	configDrive := realisedSpec()
	configDrive.Volumes[3].VolumeSource = VolumeSource{CloudInitConfigDrive: &CloudInitConfigDriveSource{
		UserDataBase64: "I2Nsb3VkLWNvbmZpZwo=", NetworkDataSecretRef: &corev1.LocalObjectReference{Name: "net"}}}
	if errs := append(ValidateVirtualMachineInstanceSpec(configDrive, p), NotRealised(configDrive, p)...); len(errs) != 0 {
		t.Fatalf("a cloudInitConfigDrive volume must be valid and realised, got %v", errs)
	}
	cases := []struct {
		name   string
		mutate func(s *VirtualMachineInstanceSpec)
		path   string
	}{
		{"kernelBoot without a container", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware.KernelBoot = &KernelBoot{}
		}, "spec.domain.firmware.kernelBoot.container"},
		{"initrd without a kernel", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Firmware.KernelBoot.Container.KernelPath = ""
		}, "spec.domain.firmware.kernelBoot.container.kernelPath"},
		{"SCSI persistent reservation", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: "san", LUN: &LunTarget{Reservation: true}})
			s.Volumes = append(s.Volumes, Volume{Name: "san", VolumeSource: VolumeSource{
				PersistentVolumeClaim: &PersistentVolumeClaimVolumeSource{ClaimName: "san"}}})
		}, "spec.domain.devices.disks[4].lun.reservation"},
		{"supplementalPool", func(s *VirtualMachineInstanceSpec) {
			s.Domain.IOThreadsPolicy = ptr.To(IOThreadsPolicySupplementalPool)
		}, "spec.domain.ioThreadsPolicy"},
		{"a supplemental I/O thread pool", func(s *VirtualMachineInstanceSpec) {
			s.Domain.IOThreads = &DiskIOThreads{SupplementalPoolThreadCount: ptr.To[uint32](4)}
		}, "spec.domain.ioThreads"},
		{"VSOCK", func(s *VirtualMachineInstanceSpec) { s.Domain.Devices.AutoattachVSOCK = ptr.To(true) }, "spec.domain.devices.autoattachVSOCK"},
		{"a GPU", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.GPUs = []GPU{{Name: "gpu1", DeviceName: "nvidia.com/TU104GL_Tesla_T4"}}
		}, "spec.domain.devices.gpus"},
		{"a host device", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.HostDevices = []HostDevice{{Name: "qat", DeviceName: "intel.com/qat"}}
		}, "spec.domain.devices.hostDevices"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := realisedSpec()
			tc.mutate(s)
			if errs := ValidateVirtualMachineInstanceSpec(s, p); len(errs) != 0 {
				t.Fatalf("the case must pass validation (NotRealised is for what validation accepts), got %v", errs)
			}
			errs := NotRealised(s, p)
			if !hasPath(errs, tc.path) {
				t.Fatalf("want an error at %s, got %v", tc.path, errs)
			}
			for _, e := range errs {
				if e.Type != field.ErrorTypeForbidden || !strings.Contains(e.Detail, NotRealisedMessage) {
					t.Errorf("want a Forbidden error saying %q, got %v", NotRealisedMessage, e)
				}
			}
		})
	}
	t.Run("claims, ephemeral and dataVolume volumes are realised", func(t *testing.T) {
		s := realisedSpec()
		pvc := &PersistentVolumeClaimVolumeSource{ClaimName: "data"}
		s.Volumes[2].VolumeSource = VolumeSource{PersistentVolumeClaim: pvc}
		s.Volumes[1].VolumeSource = VolumeSource{Ephemeral: &EphemeralVolumeSource{PersistentVolumeClaim: pvc}}
		s.Volumes = append(s.Volumes, Volume{Name: "imported", VolumeSource: VolumeSource{DataVolume: &DataVolumeSource{Name: "dv"}}})
		s.Domain.Devices.Disks = append(s.Domain.Devices.Disks, Disk{Name: "imported", Disk: &DiskTarget{Bus: DiskBusVirtio}})
		if errs := NotRealised(s, p); len(errs) != 0 {
			t.Fatalf("want no error, got %v", errs)
		}
	})
	t.Run("a VirtualMachine's dataVolumeTemplates are realised", func(t *testing.T) {
		if errs := NotRealisedVM(&VirtualMachineSpec{DataVolumeTemplates: []DataVolumeTemplateSpec{{}}}); len(errs) != 0 {
			t.Fatalf("want no error, got %v", errs)
		}
	})
	t.Run("the default vmNetworkCIDR with host bits", func(t *testing.T) {
		s := realisedSpec()
		s.Networks[0].Pod.VMNetworkCIDR = "10.0.2.7/24"
		if errs := NotRealised(s, p); len(errs) != 0 {
			t.Fatalf("want no error, got %v", errs)
		}
	})
}

// TestIneffective: what KubeVirt accepts and libvirt drops is accepted here too, with a warning
// naming the field; a spec that sets none of it gets none.
func TestIneffective(t *testing.T) {
	p := field.NewPath("spec")
	if w := Ineffective(realisedSpec(), p); len(w) != 0 {
		t.Fatalf("the base spec got warnings %q", w)
	}
	cases := []struct {
		name   string
		mutate func(s *VirtualMachineInstanceSpec)
		want   string
	}{
		{"HPET tick policy", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Clock.Timer.HPET.TickPolicy = HPETTickPolicyCatchup
		}, "spec.domain.clock.timer.hpet.tickPolicy: catchup has no effect"},
		{"RTC left out", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Clock.Timer.RTC.Enabled = ptr.To(false)
		}, "spec.domain.clock.timer.rtc.present: false has no effect"},
		{"APIC off", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Features.APIC.Enabled = ptr.To(false)
		}, "spec.domain.features.apic.enabled: false has no effect"},
		{"a tcpSocket probe on passt", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces = []Interface{{Name: s.Networks[0].Name, Binding: &PluginBinding{Name: PasstBinding}}}
			s.ReadinessProbe = &Probe{Handler: Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}}}
		}, "spec.readinessProbe.tcpSocket: with the passt or slirp binding this probe always succeeds"},
		{"every vCPU real-time with the emulator thread on their CPUs", func(s *VirtualMachineInstanceSpec) {
			s.Domain.CPU = &CPU{Sockets: 2, DedicatedCPUPlacement: true, NUMA: &NUMA{GuestMappingPassthrough: &NUMAGuestMappingPassthrough{}}, Realtime: &Realtime{}}
			s.Domain.Memory = &Memory{Guest: s.Domain.Memory.Guest, Hugepages: &Hugepages{PageSize: "2Mi"}}
		}, "spec.domain.cpu.realtime: every vCPU is real-time and QEMU's other threads share their CPUs"},
		{"a tcpSocket probe on slirp", func(s *VirtualMachineInstanceSpec) {
			s.Domain.Devices.Interfaces = []Interface{{Name: s.Networks[0].Name, Binding: &PluginBinding{Name: SlirpBinding}}}
			s.ReadinessProbe = nil
			s.LivenessProbe = &Probe{Handler: Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}}}
		}, "spec.livenessProbe.tcpSocket: with the passt or slirp binding this probe always succeeds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := realisedSpec()
			tc.mutate(s)
			if errs := append(ValidateVirtualMachineInstanceSpec(s, p), NotRealised(s, p)...); len(errs) != 0 {
				t.Fatalf("want the spec accepted, got %v", errs)
			}
			w := Ineffective(s, p)
			if len(w) != 1 || !strings.HasPrefix(w[0], tc.want) {
				t.Fatalf("warnings %q, want one starting %q", w, tc.want)
			}
		})
	}
}
