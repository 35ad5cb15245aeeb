package instancetype

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

func baseVM() *v1alpha1.VirtualMachine {
	return &v1alpha1.VirtualMachine{Spec: v1alpha1.VirtualMachineSpec{
		Instancetype: &v1alpha1.InstancetypeMatcher{Name: "it"},
		Template: v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{Devices: v1alpha1.Devices{
				Disks: []v1alpha1.Disk{{Name: "root"}, {Name: "iso", CDRom: &v1alpha1.CDRomTarget{}}},
			}},
			Volumes: []v1alpha1.Volume{
				{Name: "root", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Gi")}}},
				{Name: "iso", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}},
				{Name: "nodisk", VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("1Mi")}}},
			},
		}},
	}}
}

func baseIT() *v1alpha1.VirtualMachineInstancetypeSpec {
	return &v1alpha1.VirtualMachineInstancetypeSpec{
		CPU:    v1alpha1.CPUInstancetype{Guest: 4},
		Memory: v1alpha1.MemoryInstancetype{Guest: resource.MustParse("1Gi")},
	}
}

func resolution(it *v1alpha1.VirtualMachineInstancetypeSpec, pref *v1alpha1.VirtualMachinePreferenceSpec) *Resolution {
	return &Resolution{
		Instancetype: it, InstancetypeRef: &v1alpha1.InstancetypeStatusRef{Name: "it", Kind: v1alpha1.ClusterInstancetypeKind},
		Preference: pref, PreferenceRef: &v1alpha1.InstancetypeStatusRef{Name: "pref", Kind: v1alpha1.ClusterPreferenceKind},
	}
}

// TestConflicts starts from a VM that expands cleanly and sets one field its instancetype also
// sets per case; each is refused naming that field, as KubeVirt's apply package does.
func TestConflicts(t *testing.T) {
	cases := []struct {
		name  string
		it    func(*v1alpha1.VirtualMachineInstancetypeSpec)
		vm    func(*v1alpha1.VirtualMachine)
		field string
	}{
		{"sockets", nil, func(vm *v1alpha1.VirtualMachine) { vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2} }, "spec.template.spec.domain.cpu.sockets"},
		{"cores", nil, func(vm *v1alpha1.VirtualMachine) { vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{Cores: 2} }, "spec.template.spec.domain.cpu.cores"},
		{"threads", nil, func(vm *v1alpha1.VirtualMachine) { vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{Threads: 2} }, "spec.template.spec.domain.cpu.threads"},
		{"cpu model", func(it *v1alpha1.VirtualMachineInstancetypeSpec) { it.CPU.Model = ptr.To("qemu64") },
			func(vm *v1alpha1.VirtualMachine) { vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{Model: "max"} }, "spec.template.spec.domain.cpu.model"},
		{"cpu request", nil, func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		}, "spec.template.spec.domain.resources.requests.cpu"},
		{"cpu limit", nil, func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.Template.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
		}, "spec.template.spec.domain.resources.limits.cpu"},
		{"memory.guest", nil, func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.Template.Spec.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1Gi"))}
		}, "spec.template.spec.domain.memory.guest"},
		{"memory request", nil, func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.Template.Spec.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
		}, "spec.template.spec.domain.resources.requests.memory"},
		{"memory limit", nil, func(vm *v1alpha1.VirtualMachine) {
			vm.Spec.Template.Spec.Domain.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
		}, "spec.template.spec.domain.resources.limits.memory"},
		{"ioThreadsPolicy", func(it *v1alpha1.VirtualMachineInstancetypeSpec) {
			it.IOThreadsPolicy = ptr.To(v1alpha1.IOThreadsPolicyAuto)
		},
			func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.Template.Spec.Domain.IOThreadsPolicy = ptr.To(v1alpha1.IOThreadsPolicyShared)
			}, "spec.template.spec.domain.ioThreadsPolicy"},
		{"nodeSelector", func(it *v1alpha1.VirtualMachineInstancetypeSpec) { it.NodeSelector = map[string]string{"a": "b"} },
			func(vm *v1alpha1.VirtualMachine) { vm.Spec.Template.Spec.NodeSelector = map[string]string{"c": "d"} }, "spec.template.spec.nodeSelector"},
		{"schedulerName", func(it *v1alpha1.VirtualMachineInstancetypeSpec) { it.SchedulerName = "mine" },
			func(vm *v1alpha1.VirtualMachine) { vm.Spec.Template.Spec.SchedulerName = "yours" }, "spec.template.spec.schedulerName"},
		{"an annotation of another value", func(it *v1alpha1.VirtualMachineInstancetypeSpec) { it.Annotations = map[string]string{"k": "v"} },
			func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.Template.ObjectMeta.Annotations = map[string]string{"k": "other"}
			}, "spec.template.metadata.annotations[k]"},
		{"dedicatedCpuPlacement", func(it *v1alpha1.VirtualMachineInstancetypeSpec) { it.CPU.DedicatedCPUPlacement = ptr.To(true) },
			func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{DedicatedCPUPlacement: true}
			}, "spec.template.spec.domain.cpu.dedicatedCpuPlacement"},
		{"hugepages", func(it *v1alpha1.VirtualMachineInstancetypeSpec) {
			it.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
		},
			func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.Template.Spec.Domain.Memory = &v1alpha1.Memory{Hugepages: &v1alpha1.Hugepages{PageSize: "1Gi"}}
			}, "spec.template.spec.domain.memory.hugepages"},
		{"isolateEmulatorThread", func(it *v1alpha1.VirtualMachineInstancetypeSpec) { it.CPU.IsolateEmulatorThread = ptr.To(false) },
			func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{IsolateEmulatorThread: true}
			}, "spec.template.spec.domain.cpu.isolateEmulatorThread"},
		{"numa", func(it *v1alpha1.VirtualMachineInstancetypeSpec) {
			it.CPU.NUMA = &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}
		},
			func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}}
			}, "spec.template.spec.domain.cpu.numa"},
		{"realtime", func(it *v1alpha1.VirtualMachineInstancetypeSpec) { it.CPU.Realtime = &v1alpha1.Realtime{} },
			func(vm *v1alpha1.VirtualMachine) {
				vm.Spec.Template.Spec.Domain.CPU = &v1alpha1.CPU{Realtime: &v1alpha1.Realtime{Mask: "0"}}
			}, "spec.template.spec.domain.cpu.realtime"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vm, it := baseVM(), baseIT()
			if tc.it != nil {
				tc.it(it)
			}
			if _, _, errs := Expand(vm, resolution(it, nil)); len(errs) != 0 {
				t.Fatalf("the base VM does not expand with the instancetype: %v", errs)
			}
			if tc.vm != nil {
				tc.vm(vm)
			}
			_, _, errs := Expand(vm, resolution(it, nil))
			if len(errs) != 1 || errs[0].Field != tc.field {
				t.Fatalf("errors %v, want one naming %s", errs, tc.field)
			}
		})
	}
}

// TestDedicatedCPUsExpand: an instancetype's dedicatedCPUPlacement, isolateEmulatorThread, numa and realtime reach
// the instance's domain.cpu, and its memory.hugepages the domain's memory, as KubeVirt's
// apply/cpu.go and apply/memory.go set them.
func TestDedicatedCPUsExpand(t *testing.T) {
	it := baseIT()
	it.CPU.DedicatedCPUPlacement, it.CPU.IsolateEmulatorThread = ptr.To(true), ptr.To(true)
	it.CPU.NUMA = &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}
	it.CPU.Realtime = &v1alpha1.Realtime{Mask: "0"}
	it.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
	spec, _, errs := Expand(baseVM(), resolution(it, nil))
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if c := spec.Domain.CPU; c == nil || !c.DedicatedCPUPlacement || !c.IsolateEmulatorThread {
		t.Fatalf("domain.cpu %+v, want dedicated CPUs with an isolated emulator thread", c)
	}
	if c := spec.Domain.CPU; c.NUMA == nil || c.NUMA.GuestMappingPassthrough == nil || c.Realtime == nil || c.Realtime.Mask != "0" {
		t.Fatalf("domain.cpu numa %+v realtime %+v, want the instancetype's NUMA mapping and real-time mask", c.NUMA, c.Realtime)
	}
	if m := spec.Domain.Memory; m == nil || m.Hugepages == nil || m.Hugepages.PageSize != "2Mi" {
		t.Fatalf("domain.memory %+v, want 2Mi huge pages", m)
	}
}

func TestNotRealisedReferences(t *testing.T) {
	it := baseIT()
	it.GPUs = &runtime.RawExtension{Raw: []byte(`[{}]`)}
	pref := &v1alpha1.VirtualMachinePreferenceSpec{Devices: &v1alpha1.DevicePreferences{PreferredVirtualGPUOptions: &runtime.RawExtension{Raw: []byte(`{}`)}}}
	_, _, errs := Expand(baseVM(), resolution(it, pref))
	msg := errs.ToAggregate().Error()
	if len(errs) != 2 || !strings.Contains(msg, `spec.instancetype: Forbidden: VirtualMachineClusterInstancetype "it": spec.gpus: Forbidden: GPU passthrough is not supported`) ||
		!strings.Contains(msg, `spec.preference: Forbidden: VirtualMachineClusterPreference "pref": spec.devices.preferredVirtualGPUOptions`) {
		t.Fatalf("errors %v, want the GPUs and the virtual GPU options refused", errs)
	}
}

// TestPreferenceFillsOnlyUnset: the preference fills what the VM leaves unset, keeps what it sets,
// and lays out the instancetype's vCPUs.
func TestPreferenceFillsOnlyUnset(t *testing.T) {
	vm := baseVM()
	vm.Spec.Template.Spec.Domain.Devices.Disks[1].CDRom.Bus = v1alpha1.DiskBusSCSI
	vm.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](5)
	pref := &v1alpha1.VirtualMachinePreferenceSpec{
		CPU:                                    &v1alpha1.CPUPreferences{PreferredCPUTopology: ptr.To(v1alpha1.PreferSpread)},
		Devices:                                &v1alpha1.DevicePreferences{PreferredDiskBus: v1alpha1.DiskBusSATA, PreferredCdromBus: v1alpha1.DiskBusSATA, PreferredDiskCache: v1alpha1.CacheWriteBack},
		Features:                               &v1alpha1.FeaturePreferences{PreferredSmm: &v1alpha1.FeatureState{}},
		Firmware:                               &v1alpha1.FirmwarePreferences{PreferredEfi: &v1alpha1.EFI{SecureBoot: ptr.To(true)}},
		PreferredTerminationGracePeriodSeconds: ptr.To[int64](30),
		PreferredSubdomain:                     ptr.To("sub"),
		Annotations:                            map[string]string{"p": "q"},
	}
	spec, ann, errs := Expand(vm, resolution(baseIT(), pref))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	d := spec.Domain
	if c := d.CPU; c.Sockets != 2 || c.Cores != 2 || c.Threads != 1 {
		t.Errorf("cpu %+v, want 4 vCPUs spread as 2 sockets of 2 cores", c)
	}
	if len(d.Devices.Disks) != 3 {
		t.Fatalf("disks %+v, want one added for the volume without a disk", d.Devices.Disks)
	}
	if b := d.Devices.Disks[0].Disk.Bus; b != v1alpha1.DiskBusSATA {
		t.Errorf("root disk bus %q, want the preferred sata", b)
	}
	if b := d.Devices.Disks[2].Disk.Bus; b != v1alpha1.DiskBusSATA {
		t.Errorf("added disk bus %q, want the preferred sata", b)
	}
	if b := d.Devices.Disks[1].CDRom.Bus; b != v1alpha1.DiskBusSCSI {
		t.Errorf("cdrom bus %q, want the VM's own scsi", b)
	}
	if c := d.Devices.Disks[0].Cache; c != v1alpha1.CacheWriteBack {
		t.Errorf("cache %q, want the preferred writeback", c)
	}
	if d.Features == nil || d.Features.SMM == nil || d.Firmware == nil || d.Firmware.Bootloader == nil || d.Firmware.Bootloader.EFI == nil {
		t.Errorf("features %+v firmware %+v, want SMM and EFI from the preference", d.Features, d.Firmware)
	}
	if *spec.TerminationGracePeriodSeconds != 5 || spec.Subdomain != "sub" || ann["p"] != "q" {
		t.Errorf("grace %d subdomain %q annotations %v", *spec.TerminationGracePeriodSeconds, spec.Subdomain, ann)
	}
	if errs := v1alpha1.ValidateVirtualMachineInstanceSpec(spec, nil); len(errs) > 0 {
		t.Errorf("the expanded spec is not valid: %v", errs)
	}
}

// TestPlatformAndLunPreferences: the clock, Hyper-V, KVM, pvspinlock, lun-bus, balloon, input
// device and sound model preferences fill
// what the VM leaves unset as KubeVirt's apply does: the offset whole and only without one of the
// VM's, Hyper-V enlightenment by enlightenment and not under passthrough; the disk cache and I/O
// preferences reach hard disks only.
func TestPlatformAndLunPreferences(t *testing.T) {
	pref := &v1alpha1.VirtualMachinePreferenceSpec{
		Clock: &v1alpha1.ClockPreferences{
			PreferredClockOffset: &v1alpha1.ClockOffset{Timezone: ptr.To(v1alpha1.ClockOffsetTimezone("Europe/Berlin"))},
			PreferredTimer:       &v1alpha1.Timer{KVM: &v1alpha1.KVMTimer{Enabled: ptr.To(false)}},
		},
		Features: &v1alpha1.FeaturePreferences{
			PreferredHyperv:     &v1alpha1.FeatureHyperv{Relaxed: &v1alpha1.FeatureState{}, VAPIC: &v1alpha1.FeatureState{Enabled: ptr.To(true)}},
			PreferredKvm:        &v1alpha1.FeatureKVM{Hidden: true},
			PreferredPvspinlock: &v1alpha1.FeatureState{Enabled: ptr.To(false)},
		},
		Devices: &v1alpha1.DevicePreferences{PreferredLunBus: v1alpha1.DiskBusSCSI, PreferredDiskCache: v1alpha1.CacheWriteThrough, PreferredDiskIO: v1alpha1.IOThreads,
			PreferredAutoattachMemBalloon: ptr.To(false), PreferredAutoattachInputDevice: ptr.To(true), PreferredSoundModel: "ac97",
			PreferredTPM: &v1alpha1.TPMDevice{}, PreferredDisableHotplug: ptr.To(true), PreferredPanicDeviceModel: ptr.To(v1alpha1.PanicPvpanic), PreferredUseVirtioTransitional: ptr.To(true),
			PreferredDiskBlockSize: &v1alpha1.BlockSize{Custom: &v1alpha1.CustomBlockSize{Logical: 4096, Physical: 4096}}},
	}
	vm := baseVM()
	tmpl := &vm.Spec.Template.Spec
	tmpl.Domain.Devices.Disks = append(tmpl.Domain.Devices.Disks, v1alpha1.Disk{Name: "san", LUN: &v1alpha1.LunTarget{}})
	tmpl.Volumes = append(tmpl.Volumes, v1alpha1.Volume{Name: "san", VolumeSource: v1alpha1.VolumeSource{
		PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "san"}}})
	tmpl.Domain.Features = &v1alpha1.Features{Hyperv: &v1alpha1.FeatureHyperv{VAPIC: &v1alpha1.FeatureState{Enabled: ptr.To(false)}}}
	tmpl.Domain.Devices.Sound = &v1alpha1.SoundDevice{Name: "speaker"}
	tmpl.Domain.Devices.PanicDevices = []v1alpha1.PanicDevice{{}, {Model: ptr.To(v1alpha1.PanicHyperv)}}
	tmpl.Domain.CPU = &v1alpha1.CPU{Features: []v1alpha1.CPUFeature{{Name: "vmx", Policy: v1alpha1.CPUFeatureDisable}}}
	pref.CPU = &v1alpha1.CPUPreferences{PreferredCPUFeatures: []v1alpha1.CPUFeature{{Name: "vmx"}, {Name: "pcid", Policy: v1alpha1.CPUFeatureOptional}}}
	spec, _, errs := Expand(vm, resolution(baseIT(), pref))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	d := spec.Domain
	if dev := d.Devices; dev.AutoattachMemBalloon == nil || *dev.AutoattachMemBalloon || dev.AutoattachInputDevice == nil || !*dev.AutoattachInputDevice ||
		dev.Sound.Model != v1alpha1.SoundModelAC97 {
		t.Errorf("balloon %v input device %v sound %+v, want the preferred false, true and ac97", dev.AutoattachMemBalloon, dev.AutoattachInputDevice, dev.Sound)
	}
	if f := d.CPU.Features; len(f) != 2 || f[0].Policy != v1alpha1.CPUFeatureDisable || f[1].Name != "pcid" {
		t.Errorf("cpu features %+v, want the VM's vmx (disabled) and the preferred pcid", f)
	}
	if p := d.Devices.PanicDevices; len(p) != 2 || p[0].Model == nil || *p[0].Model != v1alpha1.PanicPvpanic || *p[1].Model != v1alpha1.PanicHyperv {
		t.Errorf("panic devices %+v, want the preferred pvpanic where the VM named no model and its own hyperv", p)
	}
	if u := d.Devices.UseVirtioTransitional; u == nil || !*u {
		t.Errorf("useVirtioTransitional %v, want the preferred true", u)
	}
	if !d.Devices.DisableHotplug {
		t.Error("disableHotplug false, want the preferred true")
	}
	if !v1alpha1.TPMEnabled(&d.Devices) {
		t.Errorf("tpm %+v, want the preferred one", d.Devices.TPM)
	}
	if c := d.Clock; c == nil || c.Timezone == nil || *c.Timezone != "Europe/Berlin" || c.UTC != nil || c.Timer == nil || c.Timer.KVM == nil {
		t.Errorf("clock %+v, want the preferred timezone and timer", c)
	}
	f := d.Features
	if h := f.Hyperv; h.Relaxed == nil || h.VAPIC == nil || *h.VAPIC.Enabled {
		t.Errorf("hyperv %+v, want relaxed from the preference and the VM's own vapic (off)", h)
	}
	if f.KVM == nil || !f.KVM.Hidden || f.Pvspinlock == nil || *f.Pvspinlock.Enabled {
		t.Errorf("kvm %+v pvspinlock %+v, want the preferred ones", f.KVM, f.Pvspinlock)
	}
	for _, disk := range d.Devices.Disks {
		switch {
		case disk.LUN != nil:
			if disk.LUN.Bus != v1alpha1.DiskBusSCSI || disk.Cache != "" || disk.IO != "" || disk.BlockSize != nil {
				t.Errorf("lun %+v, want the preferred scsi bus and no disk cache or I/O preference", disk)
			}
		case disk.CDRom != nil:
			if disk.Cache != "" || disk.IO != "" || disk.BlockSize != nil {
				t.Errorf("cdrom %s took cache %q io %q, preferences for hard disks", disk.Name, disk.Cache, disk.IO)
			}
		case disk.Cache != v1alpha1.CacheWriteThrough || disk.IO != v1alpha1.IOThreads || disk.BlockSize == nil || disk.BlockSize.Custom.Logical != 4096:
			t.Errorf("disk %s: cache %q io %q block size %+v, want the preferred ones", disk.Name, disk.Cache, disk.IO, disk.BlockSize)
		}
	}
	if errs := v1alpha1.ValidateVirtualMachineInstanceSpec(spec, nil); len(errs) > 0 {
		t.Errorf("the expanded spec is not valid: %v", errs)
	}

	// The VM's own offset is kept whole (no timezone joins its utc), and Hyper-V passthrough
	// takes no enlightenments.
	tmpl.Domain.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{OffsetSeconds: ptr.To(60)}}}
	tmpl.Domain.Features = &v1alpha1.Features{HypervPassthrough: &v1alpha1.HyperVPassthrough{Enabled: ptr.To(true)}}
	spec, _, errs = Expand(vm, resolution(baseIT(), pref))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if c := spec.Domain.Clock; c.UTC == nil || c.Timezone != nil || c.Timer == nil {
		t.Errorf("clock %+v, want the VM's utc offset and the preferred timer", c)
	}
	if h := spec.Domain.Features.Hyperv; h != nil {
		t.Errorf("hyperv %+v under passthrough, want none", h)
	}
}

func TestTopology(t *testing.T) {
	spread := func(across v1alpha1.SpreadAcross, ratio uint32) *v1alpha1.VirtualMachinePreferenceSpec {
		return &v1alpha1.VirtualMachinePreferenceSpec{CPU: &v1alpha1.CPUPreferences{
			PreferredCPUTopology: ptr.To(v1alpha1.PreferSpread),
			SpreadOptions:        &v1alpha1.SpreadOptions{Across: &across, Ratio: &ratio},
		}}
	}
	topo := func(t v1alpha1.PreferredCPUTopology) *v1alpha1.VirtualMachinePreferenceSpec {
		return &v1alpha1.VirtualMachinePreferenceSpec{CPU: &v1alpha1.CPUPreferences{PreferredCPUTopology: &t}}
	}
	cases := []struct {
		name       string
		vcpus      uint32
		pref       *v1alpha1.VirtualMachinePreferenceSpec
		s, c, th   uint32
		errContain string
	}{
		{"default sockets", 6, nil, 6, 1, 1, ""},
		{"any is sockets", 6, topo(v1alpha1.DeprecatedPreferAny), 6, 1, 1, ""},
		{"cores", 6, topo(v1alpha1.PreferCores), 1, 6, 1, ""},
		{"threads", 2, topo(v1alpha1.DeprecatedPreferThreads), 1, 1, 2, ""},
		{"one vCPU whatever", 1, topo(v1alpha1.PreferCores), 1, 1, 1, ""},
		{"spread sockets cores", 6, spread(v1alpha1.SpreadAcrossSocketsCores, 3), 2, 3, 1, ""},
		{"spread cores threads", 6, spread(v1alpha1.SpreadAcrossCoresThreads, 2), 1, 3, 2, ""},
		{"spread sockets cores threads", 8, spread(v1alpha1.SpreadAcrossSocketsCoresThreads, 2), 2, 2, 2, ""},
		{"spread that does not divide", 6, spread(v1alpha1.SpreadAcrossSocketsCores, 4), 0, 0, 0, "cannot be spread as 4 cores per socket"},
		{"cores threads ratio other than 2", 6, spread(v1alpha1.SpreadAcrossCoresThreads, 3), 0, 0, 0, "only a ratio of 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, c, th, err := Topology(tc.vcpus, tc.pref)
			if tc.errContain != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errContain) {
					t.Fatalf("err %v, want one saying %q", err, tc.errContain)
				}
				return
			}
			if err != nil || s != tc.s || c != tc.c || th != tc.th {
				t.Fatalf("got %d/%d/%d (%v), want %d/%d/%d", s, c, th, err, tc.s, tc.c, tc.th)
			}
		})
	}
}

func TestRequirementsAndOvercommit(t *testing.T) {
	it := baseIT()
	it.Memory.OvercommitPercent = 25
	pref := &v1alpha1.VirtualMachinePreferenceSpec{Requirements: &v1alpha1.PreferenceRequirements{
		CPU: &v1alpha1.CPUPreferenceRequirement{Guest: 8}, Memory: &v1alpha1.MemoryPreferenceRequirement{Guest: resource.MustParse("2Gi")},
	}}
	_, _, errs := Expand(baseVM(), resolution(it, pref))
	if len(errs) != 2 || !strings.Contains(errs.ToAggregate().Error(), "insufficient CPU resources of 4 vCPU provided by instance type, preference requires 8 vCPU") {
		t.Fatalf("errors %v, want the CPU and memory requirements unmet", errs)
	}
	spec, _, errs := Expand(baseVM(), resolution(it, nil))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if got := spec.Domain.Resources.Requests.Memory().Value(); got != 768<<20 {
		t.Errorf("memory request %d, want 75%% of 1Gi", got)
	}
}

var hugeExponent = regexp.MustCompile(`[eE][+-]?[0-9]{4,}`)

// FuzzExpand feeds arbitrary VM templates, instancetypes and preferences to Expand: it must never
// panic, every error must name a field of the VM, an expansion that succeeds gives the
// instancetype's vCPU count and memory, and expanding is deterministic.
func FuzzExpand(f *testing.F) {
	vm, _ := json.Marshal(baseVM())
	it, _ := json.Marshal(baseIT())
	f.Add(vm, it, []byte(`{"cpu":{"preferredCPUTopology":"spread"},"devices":{"preferredDiskBus":"sata"}}`))
	f.Add(vm, []byte(`{"cpu":{"guest":3},"memory":{"guest":"1Gi","overcommitPercent":50}}`), []byte(`{"preferSpreadSocketToCoreRatio":3,"cpu":{"preferredCPUTopology":"preferSpread"}}`))
	f.Add([]byte(`{"spec":{"template":{"spec":{"domain":{"cpu":{"sockets":2},"devices":{}}}}}}`), it, []byte(`{}`))
	f.Fuzz(func(t *testing.T, vmData, itData, prefData []byte) {
		// apimachinery's resource.Quantity takes seconds on a decimal exponent in the millions
		// (1e9999999): not this code's cost, and it would stall the fuzzer.
		for _, d := range [][]byte{vmData, itData, prefData} {
			if hugeExponent.Match(d) {
				return
			}
		}
		var vm v1alpha1.VirtualMachine
		var it v1alpha1.VirtualMachineInstancetypeSpec
		var pref v1alpha1.VirtualMachinePreferenceSpec
		if json.Unmarshal(vmData, &vm) != nil || json.Unmarshal(itData, &it) != nil || json.Unmarshal(prefData, &pref) != nil {
			return
		}
		res := resolution(&it, &pref)
		spec, _, errs := Expand(&vm, res)
		for _, e := range errs {
			if !strings.HasPrefix(e.Field, "spec.") {
				t.Fatalf("error names no field of the VM: %v", e)
			}
		}
		spec2, _, errs2 := Expand(&vm, res)
		if len(errs) != len(errs2) || !equality.Semantic.DeepEqual(spec, spec2) {
			t.Fatalf("not deterministic: %v vs %v", errs, errs2)
		}
		if len(errs) > 0 {
			return
		}
		if got := v1alpha1.VCPUs(spec.Domain.CPU); got != uint64(max(it.CPU.Guest, 1)) {
			t.Fatalf("%d vCPUs from an instancetype of %d", got, it.CPU.Guest)
		}
		if spec.Domain.Memory.Guest.Cmp(it.Memory.Guest) != 0 {
			t.Fatalf("memory %s from an instancetype of %s", spec.Domain.Memory.Guest, it.Memory.Guest.String())
		}
	})
}
