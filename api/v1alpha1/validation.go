package v1alpha1

import (
	"encoding/base64"
	"fmt"
	"math"
	"net"
	"regexp"
	"strings"

	"github.com/qvirt/qvirt/machine"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// The API server enforces the CRD schema and its CEL rules. The functions below check the same spec
// in Go, plus what CEL cannot express (base64 payloads, CIDRs, cross-field rules over names), for
// two callers: the controller's validating webhook and `qvirt-launcher run -f`, which reads a spec
// outside Kubernetes and must refuse what the API server would refuse.

// MaxVCPUs is the most vCPUs a q35 guest gets from QEMU here.
const MaxVCPUs = machine.MaxVCPUs

var (
	// The API admits fewer machine types and CPU models than a machine description may name; the
	// shapes both check (names, MACs, serials, UUIDs) are machine's.
	machRE = regexp.MustCompile(`^(q35|pc-q35-[0-9.]+)$`)
	cpuRE  = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]*$`)
)

// SATAPorts is how many sata disks and cdroms a q35 guest has room for: ICH9's AHCI controller has
// six ports.
const SATAPorts = 6

// ValidateVirtualMachine checks a VirtualMachine's spec. Its template is checked as given: the
// webhook passes a copy whose template went through SetDefaults, as KubeVirt's VM admitter does,
// so that what the instance will get by default (a disk for a volume without one) is not refused.
func ValidateVirtualMachine(vm *VirtualMachine) field.ErrorList {
	p := field.NewPath("spec")
	var errs field.ErrorList
	if vm.Spec.RunStrategy != nil && vm.Spec.Running != nil {
		errs = append(errs, field.Forbidden(p.Child("running"), "set either running (deprecated) or runStrategy, not both"))
	}
	if rs := vm.Spec.RunStrategy; rs != nil {
		errs = append(errs, validateEnum(p.Child("runStrategy"), string(*rs), string(RunStrategyAlways),
			string(RunStrategyRerunOnFailure), string(RunStrategyOnce), string(RunStrategyManual), string(RunStrategyHalted))...)
	}
	errs = append(errs, validateDataVolumeTemplates(vm, p.Child("dataVolumeTemplates"))...)
	return append(errs, ValidateVirtualMachineInstanceSpec(&vm.Spec.Template.Spec, p.Child("template", "spec"))...)
}

// validateDataVolumeTemplates checks what KubeVirt's VM admitter checks of dataVolumeTemplates:
// each has a name, unique, in the VM's namespace, and a volume of the template uses it (a
// DataVolume nothing uses would be imported for nothing). CDI checks the spec.
func validateDataVolumeTemplates(vm *VirtualMachine, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	used := map[string]bool{}
	for _, v := range vm.Spec.Template.Spec.Volumes {
		if v.DataVolume != nil {
			used[v.DataVolume.Name] = true
		}
	}
	seen := map[string]bool{}
	for i := range vm.Spec.DataVolumeTemplates {
		t, tp := &vm.Spec.DataVolumeTemplates[i], p.Index(i).Child("metadata")
		name := t.ObjectMeta.Name
		switch msgs := validation.IsDNS1123Subdomain(name); {
		case name == "":
			errs = append(errs, field.Required(tp.Child("name"), "the DataVolume's name"))
			continue
		case len(msgs) > 0:
			errs = append(errs, field.Invalid(tp.Child("name"), name, strings.Join(msgs, "; ")))
			continue
		case seen[name]:
			errs = append(errs, field.Duplicate(tp.Child("name"), name))
			continue
		}
		seen[name] = true
		if ns := t.ObjectMeta.Namespace; ns != "" && vm.Namespace != "" && ns != vm.Namespace {
			errs = append(errs, field.Invalid(tp.Child("namespace"), ns, "a DataVolume is created in the VM's namespace, "+vm.Namespace))
		}
		if !used[name] {
			errs = append(errs, field.Invalid(tp.Child("name"), name, "no volume of spec.template.spec.volumes uses this DataVolume (dataVolume: {name: "+name+"})"))
		}
	}
	return errs
}

// ValidateVirtualMachineInstanceSpec checks an instance spec; p is the spec's path.
func ValidateVirtualMachineInstanceSpec(spec *VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateDomain(&spec.Domain, p.Child("domain"))...)
	errs = append(errs, validateVolumes(spec.Volumes, p.Child("volumes"))...)
	errs = append(errs, validateNetworks(spec.Networks, p.Child("networks"))...)
	errs = append(errs, validateDiskVolumePairs(spec, p)...)
	errs = append(errs, validateInterfaceNetworkPairs(spec, p)...)
	if spec.TerminationGracePeriodSeconds != nil && *spec.TerminationGracePeriodSeconds < 0 {
		errs = append(errs, field.Invalid(p.Child("terminationGracePeriodSeconds"), *spec.TerminationGracePeriodSeconds, "must be 0 or more"))
	}
	if es := spec.EvictionStrategy; es != nil {
		errs = append(errs, validateEnum(p.Child("evictionStrategy"), string(*es), string(EvictionStrategyNone),
			string(EvictionStrategyLiveMigrate), string(EvictionStrategyLiveMigrateIfPossible), string(EvictionStrategyExternal))...)
	}
	errs = append(errs, validateProbe(spec.ReadinessProbe, false, p.Child("readinessProbe"))...)
	errs = append(errs, validateProbe(spec.LivenessProbe, true, p.Child("livenessProbe"))...)
	errs = append(errs, validateProbePortNames(spec, spec.ReadinessProbe, p.Child("readinessProbe"))...)
	errs = append(errs, validateProbePortNames(spec, spec.LivenessProbe, p.Child("livenessProbe"))...)
	errs = append(errs, validateOptionalLabel(p.Child("hostname"), spec.Hostname)...)
	return append(errs, validateOptionalLabel(p.Child("subdomain"), spec.Subdomain)...)
}

func validateDomain(d *DomainSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if cpu := d.CPU; cpu != nil {
		errs = append(errs, validateCPU(cpu, p.Child("cpu"))...)
	}
	errs = append(errs, validateMemory(d, p)...)
	errs = append(errs, validateDedicatedCPUs(d, p)...)
	errs = append(errs, validateHugepages(d, p)...)
	errs = append(errs, validateRealtime(d, p)...)
	errs = append(errs, validateMaxGuest(d, p)...)
	if m := d.Machine; m != nil && m.Type != "" && !machRE.MatchString(m.Type) {
		errs = append(errs, field.NotSupported(p.Child("machine", "type"), m.Type, []string{"q35", "pc-q35-<version>"}))
	}
	if fw := d.Firmware; fw != nil {
		errs = append(errs, validateFirmware(fw, p.Child("firmware"))...)
	}
	errs = append(errs, validateSecureBootSMM(d, p)...)
	errs = append(errs, validateFeatures(d, p)...)
	errs = append(errs, validateClock(d.Clock, p)...)
	if d.IOThreadsPolicy != nil {
		errs = append(errs, validateEnum(p.Child("ioThreadsPolicy"), string(*d.IOThreadsPolicy), string(IOThreadsPolicyShared), string(IOThreadsPolicyAuto),
			string(IOThreadsPolicySupplementalPool))...)
	}
	errs = append(errs, validateDisks(d.Devices.Disks, p.Child("devices", "disks"))...)
	errs = append(errs, validateInputs(d.Devices.Inputs, p.Child("devices", "inputs"))...)
	errs = append(errs, validateWatchdog(d.Devices.Watchdog, p.Child("devices", "watchdog"))...)
	errs = append(errs, validateSound(d.Devices.Sound, p.Child("devices", "sound"))...)
	errs = append(errs, validatePanicDevices(d.Devices.PanicDevices, p.Child("devices", "panicDevices"))...)
	errs = append(errs, validateTransitional(&d.Devices, p.Child("devices"))...)
	errs = append(errs, validateVideo(&d.Devices, p.Child("devices", "video"))...)
	return append(errs, validateInterfaces(d.Devices.Interfaces, p.Child("devices", "interfaces"))...)
}

// validateInputs checks the input devices as KubeVirt does: a tablet (the only type) on usb or
// virtio, unset fields taking their defaults; names must be unique.
func validateInputs(inputs []Input, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	for i, in := range inputs {
		ip := p.Index(i)
		errs = append(errs, validateName(ip.Child("name"), in.Name, names)...)
		if in.Bus != "" {
			errs = append(errs, validateEnum(ip.Child("bus"), string(in.Bus), string(InputBusUSB), string(InputBusVirtio))...)
		}
		if in.Type != "" {
			errs = append(errs, validateEnum(ip.Child("type"), string(in.Type), string(InputTypeTablet))...)
		}
	}
	if len(inputs) > MaxInputs {
		errs = append(errs, field.TooMany(p, len(inputs), MaxInputs))
	}
	return errs
}

// validateWatchdog checks the watchdog: a name, and an i6300esb action KubeVirt knows.
func validateWatchdog(w *Watchdog, p *field.Path) field.ErrorList {
	if w == nil {
		return nil
	}
	errs := validateName(p.Child("name"), w.Name, map[string]bool{})
	if e := w.I6300ESB; e != nil && e.Action != "" {
		errs = append(errs, validateEnum(p.Child("i6300esb", "action"), string(e.Action),
			string(WatchdogActionPoweroff), string(WatchdogActionReset), string(WatchdogActionShutdown))...)
	}
	return errs
}

func validateVideo(dev *Devices, p *field.Path) field.ErrorList {
	v := dev.Video
	if v == nil {
		return nil
	}
	if g := dev.AutoattachGraphicsDevice; g != nil && !*g {
		return field.ErrorList{field.Invalid(p, v.Type, "a video device needs the graphics device: autoattachGraphicsDevice is false")}
	}
	if v.Type == "" {
		return nil
	}
	return validateEnum(p.Child("type"), string(v.Type), string(VideoVGA), string(VideoVirtio), string(VideoBochs), string(VideoCirrus), string(VideoRamfb))
}

// MaxTransitionalDevices is how many virtio disks and interfaces an instance with
// useVirtioTransitional may have: each takes a conventional PCI slot of its own on pcie.0, which
// has 29, and the SCSI and serial controllers, the entropy device, the balloon, the watchdog, the
// sound card and the root ports of the other devices and the spares need the rest.
const MaxTransitionalDevices = 16

// validateTransitional keeps an instance with transitional virtio devices within pcie.0's slots.
func validateTransitional(dev *Devices, p *field.Path) field.ErrorList {
	if dev.UseVirtioTransitional == nil || !*dev.UseVirtioTransitional {
		return nil
	}
	n := len(dev.Interfaces) // every model but e1000e takes a slot of its own then
	for _, d := range dev.Disks {
		if d.Disk != nil && (d.Disk.Bus == "" || d.Disk.Bus == DiskBusVirtio) {
			n++
		}
	}
	if n <= MaxTransitionalDevices {
		return nil
	}
	return field.ErrorList{field.Invalid(p.Child("useVirtioTransitional"), true, fmt.Sprintf(
		"%d virtio disks and interfaces: with transitional virtio devices an instance has at most %d, each a conventional PCI device in a slot of its own", n, MaxTransitionalDevices))}
}

// validatePanicDevices checks each model is KubeVirt's and appears once: QEMU takes one device
// of each.
func validatePanicDevices(pds []PanicDevice, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[PanicDeviceModel]bool{}
	for i, pd := range pds {
		model := PanicIsa // the default
		if pd.Model != nil {
			model = *pd.Model
		}
		mp := p.Index(i).Child("model")
		if e := validateEnum(mp, string(model), string(PanicHyperv), string(PanicIsa), string(PanicPvpanic)); len(e) > 0 {
			errs = append(errs, e...)
			continue
		}
		if seen[model] {
			errs = append(errs, field.Duplicate(mp, model))
		}
		seen[model] = true
	}
	return errs
}

func validateSound(snd *SoundDevice, p *field.Path) field.ErrorList {
	if snd == nil {
		return nil
	}
	errs := validateName(p.Child("name"), snd.Name, map[string]bool{})
	if snd.Model != "" {
		errs = append(errs, validateEnum(p.Child("model"), string(snd.Model), string(SoundModelICH9), string(SoundModelAC97))...)
	}
	return errs
}

// validateDedicatedCPUs holds dedicatedCpuPlacement to what the kubelet's static CPU manager
// needs to give the launcher's container whole CPUs of its own (a Guaranteed pod with an integer
// CPU count), as KubeVirt's validateCpuPinning and validateCPUIsolatorThread do, each refusal
// naming its field. The CPU resources, when set, must be the vCPU count: the pod asks for exactly
// that many CPUs (and one more for an isolated emulator thread).
func validateDedicatedCPUs(d *DomainSpec, p *field.Path) field.ErrorList {
	cpu, cp := d.CPU, p.Child("cpu")
	if cpu == nil || !cpu.DedicatedCPUPlacement {
		if cpu != nil && cpu.IsolateEmulatorThread {
			return field.ErrorList{field.Invalid(cp.Child("isolateEmulatorThread"), true, "needs dedicatedCpuPlacement: true (the emulator thread is isolated from dedicated vCPUs)")}
		}
		return nil
	}
	var errs field.ErrorList
	vcpus := VCPUs(cpu)
	rp := p.Child("resources")
	for _, r := range []struct {
		list corev1.ResourceList
		name string
	}{{d.Resources.Requests, "requests"}, {d.Resources.Limits, "limits"}} {
		q, ok := r.list[corev1.ResourceCPU]
		switch {
		case !ok:
		case q.MilliValue()%1000 != 0:
			errs = append(errs, field.Invalid(rp.Child(r.name, "cpu"), QuantityText(q), "must be a whole number of CPUs with dedicatedCpuPlacement"))
		case uint64(q.Value()) != vcpus:
			errs = append(errs, field.Invalid(rp.Child(r.name, "cpu"), QuantityText(q), fmt.Sprintf(
				"must be the vCPU count (sockets*cores*threads = %d) with dedicatedCpuPlacement, or left out", vcpus)))
		}
	}
	req, hasReq := d.Resources.Requests[corev1.ResourceMemory]
	if lim, ok := d.Resources.Limits[corev1.ResourceMemory]; ok && hasReq && req.Cmp(lim) != 0 {
		errs = append(errs, field.Invalid(rp.Child("requests", "memory"), QuantityText(req), fmt.Sprintf(
			"must equal resources.limits.memory (%s) with dedicatedCpuPlacement: the pod must be Guaranteed", QuantityText(lim))))
	}
	if cpu.Threads > 2 {
		errs = append(errs, field.Invalid(cp.Child("threads"), cpu.Threads, "must be at most 2 with dedicatedCpuPlacement"))
	}
	if d.Resources.OvercommitGuestOverhead {
		errs = append(errs, field.Invalid(rp.Child("overcommitGuestOverhead"), true,
			"cannot be combined with dedicatedCpuPlacement: the pod must be Guaranteed, its memory limit its request, which then must hold QEMU's overhead"))
	}
	return errs
}

// validateHugepages: the page size is one of x86's, and the guest's RAM (as QEMU is given it, in
// whole MiB) a whole number of pages, as KubeVirt's validateHugepagesMemoryRequests asks of the
// memory request.
func validateHugepages(d *DomainSpec, p *field.Path) field.ErrorList {
	if d.Memory == nil || d.Memory.Hugepages == nil {
		return nil
	}
	hp := p.Child("memory", "hugepages", "pageSize")
	page := d.Memory.Hugepages.PageBytes()
	if page == 0 {
		return field.ErrorList{field.NotSupported(hp, d.Memory.Hugepages.PageSize, []string{"2Mi", "1Gi"})}
	}
	if guest := GuestMemoryMiB(d) << 20; guest > 0 && guest%page != 0 {
		return field.ErrorList{field.Invalid(hp, d.Memory.Hugepages.PageSize, fmt.Sprintf(
			"the guest memory (%d MiB) must be a whole number of pages", guest>>20))}
	}
	return nil
}

var cpuFeatureRE = regexp.MustCompile(`^[a-z0-9][-a-z0-9_.]*$`)

func validateCPU(cpu *CPU, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if cpu.Model != "" && !cpuRE.MatchString(cpu.Model) {
		errs = append(errs, field.Invalid(p.Child("model"), cpu.Model, "must be a QEMU CPU model name such as host-passthrough or qemu64"))
	}
	if v := VCPUs(cpu); v > MaxVCPUs {
		errs = append(errs, field.Invalid(p, v, fmt.Sprintf("sockets*cores*threads must be at most %d", MaxVCPUs)))
	}
	errs = append(errs, validateMaxSockets(cpu, p.Child("maxSockets"))...)
	return append(errs, validateCPUFeatures(cpu.Features, p.Child("features"))...)
}

// validateMaxSockets checks CPU hotplug's bound: at least the sockets the guest starts with, at
// most MaxVCPUs vCPUs, and not with dedicated CPUs (a hot-plugged vCPU would have no CPU of its
// own: the pod's are fixed when it starts).
func validateMaxSockets(cpu *CPU, p *field.Path) field.ErrorList {
	if cpu.MaxSockets == 0 {
		return nil
	}
	sockets := max(cpu.Sockets, 1)
	perSocket := uint64(max(cpu.Cores, 1)) * uint64(max(cpu.Threads, 1))
	switch {
	case cpu.MaxSockets < sockets:
		return field.ErrorList{field.Invalid(p, cpu.MaxSockets, fmt.Sprintf("must be at least sockets (%d)", sockets))}
	case uint64(cpu.MaxSockets)*perSocket > MaxVCPUs:
		return field.ErrorList{field.Invalid(p, cpu.MaxSockets, fmt.Sprintf("maxSockets*cores*threads must be at most %d", MaxVCPUs))}
	case cpu.DedicatedCPUPlacement:
		return field.ErrorList{field.Forbidden(p, "CPU hotplug cannot go with dedicatedCpuPlacement: a hot-plugged vCPU would have no CPU of its own")}
	}
	return nil
}

func validateCPUFeatures(features []CPUFeature, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, f := range features {
		fp := p.Index(i)
		switch {
		case len(f.Name) > 64 || !cpuFeatureRE.MatchString(f.Name):
			errs = append(errs, field.Invalid(fp.Child("name"), f.Name, "must be a QEMU CPU feature name such as vmx or sse4.2: lower-case letters, digits, '-', '_' or '.'"))
		case seen[f.Name]:
			errs = append(errs, field.Duplicate(fp.Child("name"), f.Name))
		}
		seen[f.Name] = true
		if f.Policy != "" {
			errs = append(errs, validateEnum(fp.Child("policy"), string(f.Policy), string(CPUFeatureForce), string(CPUFeatureRequire),
				string(CPUFeatureOptional), string(CPUFeatureDisable), string(CPUFeatureForbid))...)
		}
	}
	if len(features) > 64 {
		errs = append(errs, field.TooMany(p, len(features), 64))
	}
	return errs
}

// MaxNICQueues is the most queue pairs networkInterfaceMultiqueue gives an interface: the tap's
// limit (the kernel's MAX_TAP_QUEUES), where KubeVirt caps it too.
const MaxNICQueues = 256

// NICQueues is the queue pairs of interface in of domain d: one per vCPU (at most MaxNICQueues)
// for a virtio interface when devices.networkInterfaceMultiqueue is true, else 0 (one queue).
func NICQueues(d *DomainSpec, in *Interface) uint32 {
	mq := d.Devices.NetworkInterfaceMultiQueue
	// passt's stream backend and QEMU's user network have one queue (KubeVirt's passt and slirp
	// plugins give them no more).
	if mq == nil || !*mq || (in.Model != "" && in.Model != DefaultInterfaceModel) || in.IsUserMode() {
		return 0
	}
	n := min(QueueVCPUs(d.CPU), MaxNICQueues)
	if n < 2 {
		return 0
	}
	return uint32(n)
}

// QueueVCPUs is the vCPU count multi-queue devices (blockMultiQueue, networkInterfaceMultiqueue)
// are sized by: the vCPUs, or with CPU hotplug room (maxSockets) the most vCPUs the guest can
// reach, so that the devices stay the same when vCPUs are plugged and a migration target, which
// starts with them, has the source's devices.
func QueueVCPUs(cpu *CPU) uint64 {
	if cpu == nil || cpu.MaxSockets == 0 {
		return VCPUs(cpu)
	}
	return uint64(cpu.MaxSockets) * uint64(max(cpu.Cores, 1)) * uint64(max(cpu.Threads, 1))
}

// VCPUs is the vCPU count of a topology, counting unset values as 1.
func VCPUs(cpu *CPU) uint64 {
	if cpu == nil {
		return 1
	}
	one := func(v uint32) uint64 { return max(uint64(v), 1) }
	return one(cpu.Sockets) * one(cpu.Cores) * one(cpu.Threads)
}

func validateMemory(d *DomainSpec, p *field.Path) field.ErrorList {
	guest := GuestMemory(d)
	if d.Memory != nil && d.Memory.Guest != nil {
		if d.Memory.Guest.Sign() <= 0 {
			return field.ErrorList{field.Invalid(p.Child("memory", "guest"), QuantityText(*d.Memory.Guest), "must be a positive quantity")}
		}
		if limit, ok := d.Resources.Limits["memory"]; ok && limit.Cmp(*guest) < 0 {
			return field.ErrorList{field.Invalid(p.Child("resources", "limits", "memory"), QuantityText(limit), "must be at least memory.guest")}
		}
		return validateMemorySize(p.Child("memory", "guest"), guest)
	}
	if guest == nil || guest.Sign() <= 0 {
		return field.ErrorList{field.Required(p.Child("memory", "guest"), "set memory.guest or resources.requests.memory to a positive quantity")}
	}
	return validateMemorySize(p.Child("resources", "requests", "memory"), guest)
}

// MaxGuestMemory is the most guest memory qvirt accepts: 1 EiB. Larger is accepted by KubeVirt
// and simply never scheduled (as is anything beyond the nodes' memory); the bound only keeps the
// whole-MiB figure and the pod's request (guest plus overhead, in an int64) from overflowing.
const MaxGuestMemory = 1 << 60

func validateMemorySize(p *field.Path, q *resource.Quantity) field.ErrorList {
	if q.CmpInt64(MaxGuestMemory) > 0 {
		return field.ErrorList{field.Invalid(p, QuantityText(*q), "must be at most 1Ei")}
	}
	return nil
}

// QuantityText is q as an error shows it. Quantity.String takes seconds for a number such as
// 99999999999999999999e99999 (found by fuzzing the validators), so one beyond an int64 is not
// spelled out.
func QuantityText(q resource.Quantity) string {
	switch {
	case q.CmpInt64(math.MaxInt64) > 0:
		return "a quantity above 2^63"
	case q.CmpInt64(math.MinInt64) < 0:
		return "a quantity below -2^63"
	}
	return q.String()
}

// GuestMemoryMiB is the guest memory QEMU is given, in MiB: GuestMemory rounded up to a whole MiB,
// as libvirt rounds it for KubeVirt (qemuDomainAlignMemorySizes), so the common KubeVirt request
// 1024M (976.56 MiB) gives the guest 977 MiB. 0 when no memory is set.
func GuestMemoryMiB(d *DomainSpec) int64 { return QuantityMiB(GuestMemory(d)) }

// QuantityMiB is q in whole MiB, a fraction of one rounded up; 0 when q is nil or not positive.
func QuantityMiB(q *resource.Quantity) int64 {
	if q == nil || q.Sign() <= 0 {
		return 0
	}
	const mib = 1 << 20
	return (q.Value() + mib - 1) / mib // Value rounds a fraction of a byte up
}

// GuestMemory is the memory the guest sees: memory.guest, else resources.requests.memory; nil if neither.
func GuestMemory(d *DomainSpec) *resource.Quantity {
	if d.Memory != nil && d.Memory.Guest != nil {
		return d.Memory.Guest
	}
	if q, ok := d.Resources.Requests["memory"]; ok {
		return &q
	}
	return nil
}

func validateFirmware(fw *Firmware, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if fw.Serial != "" && !machine.IsSerial(fw.Serial) {
		errs = append(errs, field.Invalid(p.Child("serial"), fw.Serial, "may hold only letters, digits and _.+-"))
	}
	if fw.UUID != "" && !machine.IsUUID(string(fw.UUID)) {
		errs = append(errs, field.Invalid(p.Child("uuid"), fw.UUID, "must be a UUID such as 6a1c6d35-6a0e-4b9b-9d3a-0123456789ab"))
	}
	if bl := fw.Bootloader; bl != nil && bl.BIOS != nil && bl.EFI != nil {
		errs = append(errs, field.Forbidden(p.Child("bootloader"), "bios and efi are mutually exclusive: set at most one"))
	}
	kb := fw.KernelBoot
	if kb == nil {
		return errs
	}
	kp := p.Child("kernelBoot")
	if strings.IndexByte(kb.KernelArgs, 0) >= 0 {
		errs = append(errs, field.Invalid(kp.Child("kernelArgs"), "<kernel command line>", "must not contain a NUL byte"))
	}
	if kb.Container == nil {
		if kb.KernelArgs != "" {
			errs = append(errs, field.Required(kp.Child("container"), "kernelArgs needs a container with the kernel"))
		}
		return errs
	}
	cp := kp.Child("container")
	if kb.Container.Image == "" {
		errs = append(errs, field.Required(cp.Child("image"), "the image holding the kernel"))
	}
	errs = append(errs, validatePullPolicy(cp.Child("imagePullPolicy"), kb.Container.ImagePullPolicy)...)
	if kb.Container.KernelPath == "" && kb.Container.InitrdPath == "" {
		errs = append(errs, field.Required(cp, "at least one of kernelPath and initrdPath must be set"))
	}
	errs = append(errs, validateAbsPath(cp.Child("kernelPath"), kb.Container.KernelPath)...)
	return append(errs, validateAbsPath(cp.Child("initrdPath"), kb.Container.InitrdPath)...)
}

// validateSecureBootSMM refuses EFI secure boot without SMM, as KubeVirt does: OVMF's Secure Boot
// build keeps its variables behind SMM, and without it a guest could rewrite them. p is the
// domain's path.
func validateSecureBootSMM(d *DomainSpec, p *field.Path) field.ErrorList {
	if !SecureBoot(d) {
		return nil
	}
	const msg = "EFI secure boot (firmware.bootloader.efi.secureBoot, true unless set to false) needs SMM: set features.smm: {} or secureBoot: false"
	switch f := d.Features; {
	case f == nil || f.SMM == nil:
		return field.ErrorList{field.Required(p.Child("features", "smm"), msg)}
	case f.SMM.Enabled != nil && !*f.SMM.Enabled:
		return field.ErrorList{field.Invalid(p.Child("features", "smm", "enabled"), false, msg)}
	}
	return nil
}

// EFIBootloader is the domain's EFI bootloader, nil when it boots through BIOS.
func EFIBootloader(d *DomainSpec) *EFI {
	if d.Firmware == nil || d.Firmware.Bootloader == nil {
		return nil
	}
	return d.Firmware.Bootloader.EFI
}

// SecureBoot says whether the domain boots through EFI with Secure Boot: secureBoot defaults to
// true when efi is given, as in KubeVirt.
func SecureBoot(d *DomainSpec) bool {
	efi := EFIBootloader(d)
	return efi != nil && (efi.SecureBoot == nil || *efi.SecureBoot)
}

// SMMEnabled says whether features.smm turns SMM on: present, and enabled unless set to false.
func SMMEnabled(f *Features) bool {
	return f != nil && f.SMM != nil && (f.SMM.Enabled == nil || *f.SMM.Enabled)
}

func validateDisks(disks []Disk, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	boot := map[uint32]string{}
	sata := 0
	for i := range disks {
		dp := p.Index(i)
		errs = append(errs, validateDisk(&disks[i], dp, names, boot)...)
		if busPath, ok := sataBusPath(&disks[i], dp); ok {
			if sata++; sata > SATAPorts {
				errs = append(errs, field.Invalid(busPath, string(DiskBusSATA), fmt.Sprintf("q35's AHCI controller has %d ports: at most %d sata disks and cdroms", SATAPorts, SATAPorts)))
			}
		}
	}
	return errs
}

// sataBusPath is the path of d's bus at p, and whether d sits on the sata bus (a cdrom's default).
func sataBusPath(d *Disk, p *field.Path) (*field.Path, bool) {
	switch {
	case d.CDRom != nil:
		return p.Child("cdrom", "bus"), d.CDRom.Bus == "" || d.CDRom.Bus == DiskBusSATA
	case d.Disk != nil:
		return p.Child("disk", "bus"), d.Disk.Bus == DiskBusSATA
	}
	return nil, false
}

// validateDisk checks one disk at dp; names and boot hold the names and boot orders seen so far.
func validateDisk(d *Disk, dp *field.Path, names map[string]bool, boot map[uint32]string) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateName(dp.Child("name"), d.Name, names)...)
	errs = append(errs, validateDiskTarget(d, dp)...)
	if d.BootOrder != nil {
		if *d.BootOrder < 1 {
			errs = append(errs, field.Invalid(dp.Child("bootOrder"), *d.BootOrder, "must be 1 or more"))
		} else if other, dup := boot[*d.BootOrder]; dup {
			errs = append(errs, field.Duplicate(dp.Child("bootOrder"), fmt.Sprintf("%d (also disk %q)", *d.BootOrder, other)))
		}
		boot[*d.BootOrder] = d.Name
	}
	if d.Serial != "" && (len(d.Serial) > 20 || !machine.IsSerial(d.Serial)) {
		errs = append(errs, field.Invalid(dp.Child("serial"), d.Serial, "must be at most 20 letters, digits or _.+-"))
	}
	errs = append(errs, validateDiskBlockSize(d, dp)...)
	if d.Cache != "" {
		errs = append(errs, validateEnum(dp.Child("cache"), string(d.Cache), string(CacheNone), string(CacheWriteThrough), string(CacheWriteBack))...)
	}
	if d.IO != "" {
		errs = append(errs, validateEnum(dp.Child("io"), string(d.IO), string(IONative), string(IOThreads))...)
	}
	if d.IO == IONative && d.Cache != "" && d.Cache != CacheNone {
		errs = append(errs, field.Invalid(dp.Child("io"), d.IO, "io native needs cache none"))
	}
	if d.Shareable != nil && *d.Shareable && d.Cache != "" && d.Cache != CacheNone {
		errs = append(errs, field.Invalid(dp.Child("cache"), d.Cache, "a shareable disk needs cache none: the host's page cache would hide what the other guests write"))
	}
	if d.DedicatedIOThread != nil && *d.DedicatedIOThread && !OnVirtio(d) {
		errs = append(errs, field.Invalid(dp.Child("dedicatedIOThread"), true, "only a virtio disk has I/O threads"))
	}
	return errs
}

// OnVirtio says whether d is a hard disk on the virtio bus (the default bus).
func OnVirtio(d *Disk) bool {
	return d.CDRom == nil && d.LUN == nil && (d.Disk == nil || d.Disk.Bus == "" || d.Disk.Bus == DiskBusVirtio)
}

func validateDiskTarget(d *Disk, p *field.Path) field.ErrorList {
	switch {
	case d.Disk != nil && d.CDRom != nil:
		return field.ErrorList{field.Forbidden(p.Child("cdrom"), "a disk is one of disk, cdrom or lun")}
	case d.LUN != nil && (d.Disk != nil || d.CDRom != nil):
		return field.ErrorList{field.Forbidden(p.Child("lun"), "a disk is one of disk, cdrom or lun")}
	case d.LUN != nil && d.LUN.Bus != "" && d.LUN.Bus != DiskBusSCSI:
		return field.ErrorList{field.NotSupported(p.Child("lun", "bus"), string(d.LUN.Bus), []string{string(DiskBusSCSI)})}
	case d.Disk != nil && d.Disk.Bus != "":
		errs := validateEnum(p.Child("disk", "bus"), string(d.Disk.Bus), string(DiskBusVirtio), string(DiskBusSATA), string(DiskBusSCSI))
		if d.Disk.Bus == DiskBusSATA && d.Disk.ReadOnly {
			// QEMU's ide-hd refuses a read-only block node.
			errs = append(errs, field.Invalid(p.Child("disk", "readonly"), true, "a read-only disk cannot use the sata bus; use virtio or scsi"))
		}
		return errs
	case d.CDRom != nil && d.CDRom.Bus != "":
		// readonly: false is accepted, as KubeVirt does; the cdrom is attached read-only anyway.
		return validateEnum(p.Child("cdrom", "bus"), string(d.CDRom.Bus), string(DiskBusSATA), string(DiskBusSCSI))
	}
	return nil
}

func validateInterfaces(ifaces []Interface, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	macs := map[string]bool{}
	portNames := map[string]bool{}
	for i := range ifaces {
		in := &ifaces[i]
		ip := p.Index(i)
		errs = append(errs, validateName(ip.Child("name"), in.Name, names)...)
		if in.Model != "" {
			errs = append(errs, validateEnum(ip.Child("model"), in.Model, "virtio", "e1000", "e1000e", "rtl8139")...)
		}
		errs = append(errs, validateBinding(in, ip)...)
		if in.MacAddress != "" {
			errs = append(errs, validateMAC(ip.Child("macAddress"), in.MacAddress, macs)...)
		}
		for j, port := range in.Ports {
			pp := ip.Child("ports").Index(j)
			if port.Port < 1 || port.Port > 65535 {
				errs = append(errs, field.Invalid(pp.Child("port"), port.Port, "must be between 1 and 65535"))
			}
			if port.Protocol != "" {
				errs = append(errs, validateEnum(pp.Child("protocol"), port.Protocol, "TCP", "UDP")...)
			}
			errs = append(errs, validatePortName(pp.Child("name"), port.Name, portNames)...)
		}
	}
	return errs
}

func validateMAC(p *field.Path, mac string, seen map[string]bool) field.ErrorList {
	if !machine.IsMAC(mac) {
		return field.ErrorList{field.Invalid(p, mac, "must be six hex octets such as 02:00:00:00:00:01")}
	}
	hw, err := net.ParseMAC(strings.ReplaceAll(mac, "-", ":"))
	if err != nil {
		return field.ErrorList{field.Invalid(p, mac, err.Error())}
	}
	if hw[0]&1 == 1 {
		return field.ErrorList{field.Invalid(p, mac, "must be a unicast address (lowest bit of the first octet clear)")}
	}
	key := hw.String()
	if seen[key] {
		return field.ErrorList{field.Duplicate(p, mac)}
	}
	seen[key] = true
	return nil
}

func validateVolumes(vols []Volume, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	cloudInit, serviceAccount := "", ""
	for i := range vols {
		v := &vols[i]
		vp := p.Index(i)
		errs = append(errs, validateName(vp.Child("name"), v.Name, names)...)
		errs = append(errs, validateVolumeSource(&v.VolumeSource, vp)...)
		if _, src, ok := v.CloudInit(); ok {
			if cloudInit != "" {
				// KubeVirt writes only the first one; a second would be silently empty.
				errs = append(errs, field.Forbidden(vp.Child(src), "an instance has at most one cloud-init volume; "+cloudInit+" is one already"))
			}
			cloudInit = "volume " + v.Name
		}
		if v.ServiceAccount != nil {
			if serviceAccount != "" {
				// The launcher pod runs as one service account, as KubeVirt's.
				errs = append(errs, field.Forbidden(vp.Child("serviceAccount"), "an instance has at most one serviceAccount volume; "+serviceAccount+" is one already"))
			}
			serviceAccount = "volume " + v.Name
		}
	}
	return errs
}

func validateVolumeSource(s *VolumeSource, p *field.Path) field.ErrorList {
	set := countSet(s.ContainerDisk != nil, s.CloudInitNoCloud != nil, s.CloudInitConfigDrive != nil, s.EmptyDisk != nil,
		s.HostDisk != nil, s.PersistentVolumeClaim != nil, s.Ephemeral != nil, s.DataVolume != nil,
		s.Secret != nil, s.ConfigMap != nil, s.ServiceAccount != nil, s.DownwardAPI != nil)
	if set != 1 {
		return field.ErrorList{field.Invalid(p, set, "a volume sets exactly one source: containerDisk, cloudInitNoCloud, cloudInitConfigDrive, emptyDisk, hostDisk, persistentVolumeClaim, ephemeral, dataVolume, secret, configMap, serviceAccount or downwardAPI")}
	}
	if ci, name, ok := s.CloudInit(); ok {
		return validateCloudInit(ci, p.Child(name))
	}
	if _, name, ok := s.ConfigVolume(); ok {
		return validateConfigVolume(s, p.Child(name))
	}
	switch {
	case s.ContainerDisk != nil:
		return validateContainerDisk(s.ContainerDisk, p.Child("containerDisk"))
	case s.EmptyDisk != nil:
		if s.EmptyDisk.Capacity.Sign() <= 0 {
			return field.ErrorList{field.Invalid(p.Child("emptyDisk", "capacity"), QuantityText(s.EmptyDisk.Capacity), "must be a positive quantity")}
		}
	case s.HostDisk != nil:
		return validateHostDisk(s.HostDisk, p.Child("hostDisk"))
	case s.PersistentVolumeClaim != nil:
		return validateClaim(s.PersistentVolumeClaim, p.Child("persistentVolumeClaim"))
	case s.DataVolume != nil:
		// The DataVolume's name is its claim's.
		return validateObjectName(p.Child("dataVolume", "name"), s.DataVolume.Name, "the DataVolume's name")
	case s.Ephemeral != nil:
		if s.Ephemeral.PersistentVolumeClaim == nil {
			return field.ErrorList{field.Required(p.Child("ephemeral", "persistentVolumeClaim"), "the claim under the overlay")}
		}
		return validateClaim(s.Ephemeral.PersistentVolumeClaim, p.Child("ephemeral", "persistentVolumeClaim"))
	}
	return nil
}

func validateContainerDisk(c *ContainerDiskSource, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c.Image == "" {
		errs = append(errs, field.Required(p.Child("image"), "the container image holding the disk"))
	}
	errs = append(errs, validatePullPolicy(p.Child("imagePullPolicy"), c.ImagePullPolicy)...)
	return append(errs, validateAbsPath(p.Child("path"), c.Path)...)
}

func validatePullPolicy(p *field.Path, v corev1.PullPolicy) field.ErrorList {
	if v == "" {
		return nil
	}
	return validateEnum(p, string(v), string(corev1.PullAlways), string(corev1.PullIfNotPresent), string(corev1.PullNever))
}

// validateCloudInit checks a cloud-init volume as KubeVirt does: at most one source of user data
// and one of network data, at least one of the two, and inline (or base64, decoded) data within
// CloudInitMaxUserData and CloudInitMaxNetworkData bytes; larger data goes in a Secret.
func validateCloudInit(c CloudInitSource, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	users := countSet(c.UserData != "", c.UserDataBase64 != "", c.UserDataSecretRef != nil)
	nets := countSet(c.NetworkData != "", c.NetworkDataBase64 != "", c.NetworkDataSecretRef != nil)
	if users > 1 {
		errs = append(errs, field.Forbidden(p, "set at most one of userData, userDataBase64 and secretRef"))
	}
	if nets > 1 {
		errs = append(errs, field.Forbidden(p, "set at most one of networkData, networkDataBase64 and networkDataSecretRef"))
	}
	if users == 0 && nets == 0 {
		errs = append(errs, field.Required(p, "one of userData, userDataBase64, secretRef, networkData, networkDataBase64 and networkDataSecretRef"))
	}
	errs = append(errs, validateCloudInitData(p.Child("userData"), c.UserData, false, CloudInitMaxUserData, "secretRef")...)
	errs = append(errs, validateCloudInitData(p.Child("userDataBase64"), c.UserDataBase64, true, CloudInitMaxUserData, "secretRef")...)
	errs = append(errs, validateCloudInitData(p.Child("networkData"), c.NetworkData, false, CloudInitMaxNetworkData, "networkDataSecretRef")...)
	errs = append(errs, validateCloudInitData(p.Child("networkDataBase64"), c.NetworkDataBase64, true, CloudInitMaxNetworkData, "networkDataSecretRef")...)
	errs = append(errs, validateSecretRef(p.Child("secretRef"), c.UserDataSecretRef)...)
	return append(errs, validateSecretRef(p.Child("networkDataSecretRef"), c.NetworkDataSecretRef)...)
}

// validateCloudInitData checks inline cloud-init data (base64-encoded when encoded) against its
// size limit in bytes, pointing at the Secret field that takes more.
func validateCloudInitData(p *field.Path, v string, encoded bool, limit int, secretField string) field.ErrorList {
	size := len(v)
	if encoded && v != "" {
		data, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return field.ErrorList{field.Invalid(p, "<base64 data>", fmt.Sprintf("not valid base64: %v", err))}
		}
		size = len(data)
	}
	if size > limit {
		what := "bytes"
		if encoded {
			what = "bytes decoded"
		}
		err := field.TooLong(p, "", limit)
		err.Detail = fmt.Sprintf("%d %s is over the limit of %d bytes: put larger data in a Secret (%s)", size, what, limit, secretField)
		return field.ErrorList{err}
	}
	return nil
}

// validateSecretRef checks a reference to a Secret of the instance's namespace.
func validateSecretRef(p *field.Path, ref *corev1.LocalObjectReference) field.ErrorList {
	if ref == nil {
		return nil
	}
	if ref.Name == "" {
		return field.ErrorList{field.Required(p.Child("name"), "the Secret's name")}
	}
	if msgs := validation.IsDNS1123Subdomain(ref.Name); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p.Child("name"), ref.Name, strings.Join(msgs, "; "))}
	}
	return nil
}

func validateHostDisk(h *HostDisk, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if h.Path == "" {
		errs = append(errs, field.Required(p.Child("path"), "the absolute path of the image on the node"))
	}
	errs = append(errs, validateAbsPath(p.Child("path"), h.Path)...)
	errs = append(errs, validateEnum(p.Child("type"), string(h.Type), string(HostDiskExists), string(HostDiskExistsOrCreate))...)
	if h.Type == HostDiskExistsOrCreate && (h.Capacity == nil || h.Capacity.Sign() <= 0) {
		errs = append(errs, field.Required(p.Child("capacity"), "a positive capacity is required when type is DiskOrCreate"))
	}
	return errs
}

func validateClaim(c *PersistentVolumeClaimVolumeSource, p *field.Path) field.ErrorList {
	return validateObjectName(p.Child("claimName"), c.ClaimName, "the PersistentVolumeClaim's name")
}

func validateNetworks(nets []Network, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	pods := 0
	for i := range nets {
		n := &nets[i]
		np := p.Index(i)
		errs = append(errs, validateName(np.Child("name"), n.Name, names)...)
		if (n.Pod == nil) == (n.Multus == nil) {
			errs = append(errs, field.Invalid(np, n.Name, "a network sets exactly one of pod and multus"))
			continue
		}
		if n.Pod != nil {
			pods++
			if pods > 1 {
				errs = append(errs, field.Duplicate(np.Child("pod"), "only one network may be the pod network"))
			}
			errs = append(errs, validateCIDR(np.Child("pod", "vmNetworkCIDR"), n.Pod.VMNetworkCIDR)...)
		}
		if n.Multus != nil {
			errs = append(errs, validateMultus(n.Multus, np.Child("multus"))...)
			if n.Multus.Default {
				pods++
				if pods > 1 {
					errs = append(errs, field.Duplicate(np.Child("multus", "default"), "only one network may be the pod's default: the pod network or one default multus network"))
				}
			}
		}
	}
	return errs
}

// validateMultus checks a Multus network's NetworkAttachmentDefinition reference: <name> or
// <namespace>/<name>, as Multus's networks annotation takes it.
func validateMultus(m *MultusNetwork, p *field.Path) field.ErrorList {
	p = p.Child("networkName")
	if m.NetworkName == "" {
		return field.ErrorList{field.Required(p, "the NetworkAttachmentDefinition's name, as <name> or <namespace>/<name>")}
	}
	ns, name := m.Split()
	var msgs []string
	if strings.Contains(m.NetworkName, "/") {
		msgs = append(msgs, validation.IsDNS1123Label(ns)...)
	}
	msgs = append(msgs, validation.IsDNS1123Subdomain(name)...)
	if len(msgs) > 0 {
		return field.ErrorList{field.Invalid(p, m.NetworkName, "must be <name> or <namespace>/<name> of a NetworkAttachmentDefinition: "+strings.Join(msgs, "; "))}
	}
	return nil
}

func validateDiskVolumePairs(spec *VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	vols := map[string]bool{}
	for _, v := range spec.Volumes {
		vols[v.Name] = true
	}
	disks := map[string]bool{}
	for i, d := range spec.Domain.Devices.Disks {
		disks[d.Name] = true
		if !vols[d.Name] {
			errs = append(errs, field.NotFound(p.Child("domain", "devices", "disks").Index(i).Child("name"), d.Name))
		}
	}
	errs = append(errs, validateLunVolumes(spec, p)...)
	shared := map[string]bool{}
	for _, f := range spec.Domain.Devices.Filesystems {
		shared[f.Name] = true
	}
	// After SetDefaults every volume has a disk or a filesystem; a spec checked without them (a
	// hot-plug that adds a volume alone) is refused.
	for i, v := range spec.Volumes {
		if !disks[v.Name] && !shared[v.Name] {
			errs = append(errs, field.Invalid(p.Child("volumes").Index(i).Child("name"), v.Name, "no disk or filesystem attaches this volume"))
		}
	}
	return append(errs, validateFilesystems(spec, disks, p.Child("domain", "devices", "filesystems"))...)
}

// validateLunVolumes checks that every lun disk attaches a claim, the only volume that can be a
// block device (whether the claim is in block mode is known once the pod has it).
func validateLunVolumes(spec *VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, d := range spec.Domain.Devices.Disks {
		if d.LUN == nil {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == d.Name && v.PersistentVolumeClaim == nil && v.DataVolume == nil {
				errs = append(errs, field.Invalid(p.Child("domain", "devices", "disks").Index(i).Child("lun"), d.Name,
					"a lun passes a block device through: its volume must be a persistentVolumeClaim or dataVolume of volumeMode Block"))
			}
		}
	}
	return errs
}

func validateInterfaceNetworkPairs(spec *VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	nets := map[string]*Network{}
	for i := range spec.Networks {
		nets[spec.Networks[i].Name] = &spec.Networks[i]
	}
	ifaces := map[string]bool{}
	for i, in := range spec.Domain.Devices.Interfaces {
		ifaces[in.Name] = true
		ip := p.Child("domain", "devices", "interfaces").Index(i)
		n, ok := nets[in.Name]
		if !ok {
			errs = append(errs, field.NotFound(ip.Child("name"), in.Name))
			continue
		}
		if in.Masquerade != nil && n.IsSecondary() {
			errs = append(errs, field.Invalid(ip.Child("masquerade"), in.Name, "the masquerade binding needs the pod network (or a default multus network); a secondary network takes the bridge binding"))
		}
		if in.IsUserMode() && n.Pod == nil {
			// KubeVirt's passt and slirp binding plugins are for the pod network only, as here:
			// they connect the guest to the pod's own eth0.
			errs = append(errs, field.Invalid(ip.Child("binding"), in.Name, "the "+in.Binding.Name+" binding is for the pod network only"))
		}
	}
	for i, n := range spec.Networks {
		if !ifaces[n.Name] {
			errs = append(errs, field.Invalid(p.Child("networks").Index(i).Child("name"), n.Name, "no interface uses this network"))
		}
	}
	return errs
}

// validateBinding checks that an interface names one binding at most, and of binding plugins
// only passt and slirp, which qvirt runs built in.
func validateBinding(in *Interface, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if in.Masquerade != nil && in.Bridge != nil {
		errs = append(errs, field.Forbidden(p.Child("bridge"), "an interface has one binding: masquerade, bridge or binding, not two"))
	}
	if in.Binding == nil {
		return errs
	}
	if in.Masquerade != nil || in.Bridge != nil {
		errs = append(errs, field.Forbidden(p.Child("binding"), "an interface has one binding: masquerade, bridge or binding, not two"))
	}
	if in.Binding.Name != PasstBinding && in.Binding.Name != SlirpBinding {
		errs = append(errs, field.NotSupported(p.Child("binding", "name"), in.Binding.Name, []string{PasstBinding, SlirpBinding}))
	}
	return errs
}

func validateName(p *field.Path, name string, seen map[string]bool) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "a name")}
	}
	if len(name) > 63 || !machine.IsLabel(name) {
		return field.ErrorList{field.Invalid(p, name, "must be a DNS label: lower-case letters, digits and '-', at most 63")}
	}
	if seen[name] {
		return field.ErrorList{field.Duplicate(p, name)}
	}
	seen[name] = true
	return nil
}

func validateOptionalLabel(p *field.Path, v string) field.ErrorList {
	if v == "" || (len(v) <= 63 && machine.IsLabel(v)) {
		return nil
	}
	return field.ErrorList{field.Invalid(p, v, "must be a DNS label: lower-case letters, digits and '-', at most 63")}
}

func validateEnum(p *field.Path, v string, allowed ...string) field.ErrorList {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return field.ErrorList{field.NotSupported(p, v, allowed)}
}

func validateAbsPath(p *field.Path, v string) field.ErrorList {
	if v == "" {
		return nil
	}
	if !strings.HasPrefix(v, "/") || strings.ContainsRune(v, 0) {
		return field.ErrorList{field.Invalid(p, v, "must be an absolute path")}
	}
	for _, seg := range strings.Split(v, "/") {
		if seg == ".." {
			return field.ErrorList{field.Invalid(p, v, "must not contain '..' segments")}
		}
	}
	return nil
}

func validateCIDR(p *field.Path, v string) field.ErrorList {
	if v == "" {
		return nil
	}
	ip, n, err := net.ParseCIDR(v)
	if err != nil || ip.To4() == nil {
		return field.ErrorList{field.Invalid(p, v, "must be an IPv4 CIDR such as 10.0.2.0/24")}
	}
	ones, _ := n.Mask.Size()
	switch {
	case ones > 30:
		return field.ErrorList{field.Invalid(p, v, "must leave room for a gateway and a guest: prefix /30 or shorter")}
	case ones < 8:
		return field.ErrorList{field.Invalid(p, v, "must be a network of prefix /8 or longer: a shorter one would hide the pod's own routes")}
	case n.IP.IsLoopback() || n.IP.IsLinkLocalUnicast() || n.IP.IsMulticast() || n.IP.IsUnspecified() || n.IP.To4()[0] == 0 || n.IP.To4()[0] >= 240:
		return field.ErrorList{field.Invalid(p, v, "must be a unicast network outside 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, multicast and 240.0.0.0/4")}
	}
	return nil
}

func countSet(vs ...bool) int {
	n := 0
	for _, v := range vs {
		if v {
			n++
		}
	}
	return n
}

// validateDiskBlockSize checks a disk's blockSize: a hard disk's (a cdrom and a passed-through LUN
// have their media's), 512-byte logical blocks on sata (QEMU's IDE disks take no other).
func validateDiskBlockSize(d *Disk, dp *field.Path) field.ErrorList {
	if d.BlockSize == nil {
		return nil
	}
	bp := dp.Child("blockSize")
	if d.Disk == nil && (d.CDRom != nil || d.LUN != nil) {
		return field.ErrorList{field.Forbidden(bp, "only a hard disk (disk) takes a block size: a cdrom's and a lun's are their media's")}
	}
	return validateBlockSize(d.BlockSize, d.Disk != nil && d.Disk.Bus == DiskBusSATA, bp)
}

// validateBlockSize checks a block size (a disk's or a preference's) at p against QEMU's rules
// (machine.BlockSize.Problems), on a sata disk or not.
func validateBlockSize(bs *BlockSize, sata bool, p *field.Path) field.ErrorList {
	if bs == nil {
		return nil
	}
	var errs field.ErrorList
	if MatchVolumeBlockSize(bs) && bs.Custom != nil {
		errs = append(errs, field.Invalid(p, "custom and matchVolume", "give either custom or matchVolume"))
	}
	c := bs.Custom
	if c == nil {
		return errs
	}
	m := machine.BlockSize{Logical: c.Logical, Physical: c.Physical, DiscardGranularity: ptr.Deref(c.DiscardGranularity, 0)}
	for _, pr := range m.Problems(sata) {
		errs = append(errs, field.Invalid(p.Child("custom", pr.Field), pr.Value, pr.Detail))
	}
	return errs
}

// MatchVolumeBlockSize reports whether bs asks for the volume's own block sizes.
func MatchVolumeBlockSize(bs *BlockSize) bool {
	return bs != nil && bs.MatchVolume != nil && (bs.MatchVolume.Enabled == nil || *bs.MatchVolume.Enabled)
}
