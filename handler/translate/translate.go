// Package translate turns a VMI into the machine description a launcher executes
// (package machine). It is the one place where a spec decision is made: it fills the API's
// field defaults (v1alpha1.FillDefaults; admission recorded the others in the stored object) and
// decides what depends on the node (the CPU model under emulation, cache and I/O mode), memory in
// MiB, the SMBIOS UUID, which volume source becomes which image source. The node agent calls it
// for a start, a migration target and a hot-plug; `qvirtctl machine` calls it for a launcher run
// outside Kubernetes. Errors name the VMI field at fault ("spec.domain.memory.guest").
package translate

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/machine"
)

// Host is what the node decided for the instance outside its spec.
type Host struct {
	// Emulation runs the guest under TCG (the cluster's useEmulation); otherwise KVM.
	Emulation bool
	// NICs are the host sides the node agent made for the spec's interfaces, by interface name.
	// Each carries the MAC the interface gets (the spec's, else the one the network setup chose).
	NICs map[string]machine.NIC
	// NodeName is the node the launcher runs on, for the downward metrics.
	NodeName string
	// SkipNotRealised describes even what this version does not realise (v1alpha1.NotRealised):
	// for a migration target, which runs what its source runs (a spec admitted by an older version
	// included), and for tests of the argv builder's layouts that the network setup cannot make yet
	// (several NICs).
	SkipNotRealised bool
	// Pod is what the launcher pod holds for the spec's claims and host disks; nil outside a
	// launcher pod (`qvirtctl machine`), where a hostDisk is the host's own path and a claim
	// cannot be attached.
	Pod *PodVolumes
}

// PodVolumes are the volumes a launcher pod holds for its instance's claims and host disks, as
// the node agent found them.
type PodVolumes struct {
	// HostDisks maps each host directory the pod mounts for hostDisk volumes to where it is
	// mounted in the pod.
	HostDisks map[string]string
	// Claims are the claims the spec names, by claim name.
	Claims map[string]Claim
	// StateDir is where the pod mounts the instance's backend-storage claim; "" when it does not.
	StateDir string
}

// Claim is what the node agent read of a PersistentVolumeClaim.
type Claim struct {
	// CapacityBytes is the bound claim's capacity (status.capacity.storage).
	CapacityBytes int64
	// Block is volumeMode Block: the pod has the claim as a device, not a mount.
	Block bool
}

var (
	specPath   = field.NewPath("spec")
	domainPath = specPath.Child("domain")
	diskPath   = domainPath.Child("devices", "disks")
	ifacePath  = domainPath.Child("devices", "interfaces")
	fsPath     = domainPath.Child("devices", "filesystems")
)

// Machine is v's machine description. It validates the spec first and refuses what this version
// does not realise (admission did already; a VMI stored before a rule existed must still not reach
// QEMU).
func Machine(v *v1alpha1.VirtualMachineInstance, host Host) (*machine.Machine, error) {
	errs := v1alpha1.ValidateVirtualMachineInstanceSpec(&v.Spec, specPath)
	if !host.SkipNotRealised {
		errs = append(errs, v1alpha1.NotRealised(&v.Spec, specPath)...)
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	spec := v.Spec.DeepCopy()
	// Only the field defaults: the devices are those admission recorded, also for an instance
	// stored before admission recorded defaults (a migration target must get its source's).
	v1alpha1.FillDefaults(spec)
	m := &machine.Machine{
		Name: v.Name, Namespace: v.Namespace, UID: string(v.UID), UUID: string(v.UID),
		Type: spec.Domain.Machine.Type, Accel: machine.AccelKVM, NoACPI: acpiOff(spec.Domain.Features), SMM: smm(spec.Domain.Features),
		GracePeriodSeconds: *spec.TerminationGracePeriodSeconds,
		SerialConsole:      *spec.Domain.Devices.AutoattachSerialConsole,
		Graphics:           *spec.Domain.Devices.AutoattachGraphicsDevice,
		StartPaused:        spec.StartStrategy != nil && *spec.StartStrategy == v1alpha1.StartStrategyPaused,
		// KubeVirt gives every VMI the guest agent's channel and has no field to leave it off.
		GuestAgent: true,
	}
	if host.Emulation {
		m.Accel = machine.AccelTCG
	}
	errs = append(errs, cpu(&spec.Domain, m)...)
	errs = append(errs, memory(&spec.Domain, m)...)
	errs = append(errs, platform(&spec.Domain, m, time.Now())...)
	firmware(&spec.Domain, m)
	vols := map[string]*v1alpha1.Volume{}
	for i := range spec.Volumes {
		vols[spec.Volumes[i].Name] = &spec.Volumes[i]
	}
	for i := range spec.Domain.Devices.Disks {
		d, err := Disk(&spec.Domain.Devices.Disks[i], vols[spec.Domain.Devices.Disks[i].Name], host.Pod, diskPath.Index(i))
		errs = append(errs, err...)
		m.Disks = append(m.Disks, d)
	}
	for i := range spec.Domain.Devices.Filesystems {
		f, err := Filesystem(&spec.Domain.Devices.Filesystems[i], vols[spec.Domain.Devices.Filesystems[i].Name], host.Pod, fsPath.Index(i))
		errs = append(errs, err...)
		m.Filesystems = append(m.Filesystems, f)
	}
	for i := range spec.Domain.Devices.Interfaces {
		n, err := NIC(&spec.Domain.Devices.Interfaces[i], host.NICs, ifacePath.Index(i))
		errs = append(errs, err...)
		m.NICs = append(m.NICs, n)
	}
	devices(&spec.Domain.Devices, m)
	if err := state(spec, host, m); err != nil {
		errs = append(errs, err)
	}
	if spec.Domain.Devices.DownwardMetrics != nil {
		m.DownwardMetrics = &machine.DownwardMetrics{NodeName: host.NodeName}
	}
	m.IOThreads = ioThreads(&spec.Domain)
	for i := range m.Disks {
		tuneDisk(&spec.Domain, i, &m.Disks[i])
	}
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	cloudInitMetaData(v, m)
	return m, nil
}

// cloudInitMetaData fills in the meta-data of the machine's cloud-init disk with KubeVirt's rules:
// NoCloud's instance-id is the SMBIOS UUID (the firmware UUID, which a VM keeps across restarts;
// else the instance's UID, where KubeVirt picks a random one), ConfigDrive's is <name>.<namespace>
// with the UUID beside it; the hostname is spec.hostname, else the name up to its first dot, cut
// to 63 characters (KubeVirt's dns.SanitizeHostname).
func cloudInitMetaData(v *v1alpha1.VirtualMachineInstance, m *machine.Machine) {
	hostname := v.Spec.Hostname
	if hostname == "" {
		hostname, _, _ = strings.Cut(v.Name, ".")
		hostname = hostname[:min(len(hostname), validation.DNS1123LabelMaxLength)]
	}
	for i := range m.Disks {
		ci := m.Disks[i].Source.CloudInit
		if ci == nil {
			continue
		}
		ci.Hostname = hostname
		switch ci.DataSource {
		case machine.CloudInitNoCloud:
			ci.InstanceID = m.UUID
		case machine.CloudInitConfigDrive:
			ci.InstanceID, ci.UUID = v.Name+"."+v.Namespace, m.UUID
		}
	}
}

// state keeps a persistent TPM and persistent EFI variables on the backend-storage claim the
// launcher pod mounts. A migration target of an instance whose pod has none (its source started
// before qvirt kept persistent state) runs as its source does: the state lasts as long as the QEMU.
func state(spec *v1alpha1.VirtualMachineInstanceSpec, host Host, m *machine.Machine) *field.Error {
	if !v1alpha1.NeedsBackendStorage(spec) {
		return nil
	}
	if host.Pod != nil && host.Pod.StateDir != "" {
		m.State = &machine.State{Dir: host.Pod.StateDir, EFIVars: v1alpha1.PersistentEFI(spec), TPM: v1alpha1.PersistentTPM(spec)}
		return nil
	}
	if host.SkipNotRealised {
		return nil
	}
	p := specPath.Child("domain", "devices", "tpm", "persistent")
	if v1alpha1.PersistentEFI(spec) {
		p = specPath.Child("domain", "firmware", "bootloader", "efi", "persistent")
	}
	return field.Forbidden(p, "persistent state is kept only on the backend-storage claim "+
		v1alpha1.BackendStorageClaim("<name>")+", which the launcher pod mounts at "+podlayout.StateDir)
}

// devices are the devices the launcher makes alone: the entropy device, the memory balloon (as
// admission recorded it: an instance stored without the field has none), the TPM, the sound
// card, the input devices, the watchdog and the pvpanic devices, each after FillDefaults (an input's bus and type, the
// watchdog's model and action, the sound card's model).
func devices(d *v1alpha1.Devices, m *machine.Machine) {
	m.RNG = d.Rng != nil
	m.MemBalloon = d.AutoattachMemBalloon != nil && *d.AutoattachMemBalloon
	m.TPM = v1alpha1.TPMEnabled(d)
	m.NoHotplug = d.DisableHotplug
	m.VirtioTransitional = d.UseVirtioTransitional != nil && *d.UseVirtioTransitional
	if v := d.Video; v != nil {
		m.Video = string(v.Type)
	}
	if snd := d.Sound; snd != nil {
		m.Sound = &machine.Sound{Name: snd.Name, Model: string(snd.Model)}
	}
	for _, in := range d.Inputs {
		m.Inputs = append(m.Inputs, machine.Input{Name: in.Name, Bus: machine.InputBus(in.Bus), Type: machine.InputType(in.Type)})
	}
	if d.ClientPassthrough != nil {
		m.USBRedirSlots = machine.MaxUSBRedirSlots
	}
	if w := d.Watchdog; w != nil {
		m.Watchdog = &machine.Watchdog{Name: w.Name, Model: machine.WatchdogI6300ESB, Action: machine.WatchdogAction(w.I6300ESB.Action)}
	}
	// A hyperv panic device is a CPU flag (platform).
	if panicModel(d, v1alpha1.PanicIsa) {
		m.Panic = append(m.Panic, machine.PanicISA)
	}
	if panicModel(d, v1alpha1.PanicPvpanic) {
		m.Panic = append(m.Panic, machine.PanicPCI)
	}
}

func acpiOff(f *v1alpha1.Features) bool {
	return f != nil && f.ACPI != nil && f.ACPI.Enabled != nil && !*f.ACPI.Enabled
}

// smm is features.smm for QEMU: on when present (unless enabled is false), QEMU's default when
// absent, as libvirt leaves it.
func smm(f *v1alpha1.Features) *bool {
	if f == nil || f.SMM == nil {
		return nil
	}
	on := v1alpha1.SMMEnabled(f)
	return &on
}

// cpu picks the model: the host's under KVM, qemu64 under emulation, where the host's cannot run.
// host-passthrough and host-model both need KVM. host-model is QEMU's host CPU as QEMU migrates it
// (the "host" model leaves out what it cannot migrate, as with libvirt's host-passthrough): qvirt
// does not yet compute the nearest named model libvirt picks for host-model, so a migration to a
// node with another CPU is not guarded.
func cpu(d *v1alpha1.DomainSpec, m *machine.Machine) field.ErrorList {
	var c v1alpha1.CPU
	if d.CPU != nil {
		c = *d.CPU
	}
	modelPath := domainPath.Child("cpu", "model")
	emulated := m.Accel == machine.AccelTCG
	model := c.Model
	switch model {
	case "":
		model = "host"
		if emulated {
			model = "qemu64"
		}
	case "host-passthrough", "host-model", "host":
		if emulated {
			return field.ErrorList{field.Invalid(modelPath, c.Model, "the host CPU model needs KVM and this node runs guests under emulation; use a named model such as qemu64 or max")}
		}
		model = "host"
	}
	one := func(v uint32) uint32 { return max(v, 1) }
	m.CPU = machine.CPU{Model: model, VCPUs: uint32(v1alpha1.VCPUs(d.CPU)),
		Sockets: one(c.Sockets), Cores: one(c.Cores), Threads: one(c.Threads), MaxSockets: c.MaxSockets,
		DedicatedCPUs: c.DedicatedCPUPlacement, IsolateEmulatorThread: c.IsolateEmulatorThread,
		NUMAPassthrough: c.NUMA != nil && c.NUMA.GuestMappingPassthrough != nil}
	rt, err := v1alpha1.RealtimeVCPUs(&c)
	if err != nil {
		return field.ErrorList{field.Invalid(domainPath.Child("cpu", "realtime", "mask"), c.Realtime.Mask, err.Error())}
	}
	m.CPU.RealtimeVCPUs = rt
	// The APIC itself needs nothing: QEMU's x86 CPUs have one (NotRealised refuses turning it off).
	if f := d.Features; f != nil && f.APIC != nil && f.APIC.EndOfInterrupt {
		m.CPU.PVEOI = true
	}
	for _, f := range c.Features {
		policy := f.Policy
		if policy == "" {
			policy = v1alpha1.CPUFeatureRequire
		}
		m.CPU.Features = append(m.CPU.Features, machine.CPUFeature{Name: f.Name, Policy: string(policy)})
	}
	return nil
}

// memory gives the guest its memory rounded up to a whole MiB (see GuestMemoryMiB).
func memory(d *v1alpha1.DomainSpec, m *machine.Machine) field.ErrorList {
	m.MemoryMiB = v1alpha1.GuestMemoryMiB(d)
	if d.Memory != nil && d.Memory.Hugepages != nil {
		m.HugePageKiB = d.Memory.Hugepages.PageBytes() >> 10
	}
	if d.Memory != nil && d.Memory.MaxGuest != nil {
		// Memory hotplug: the guest boots with memory.guest and QEMU holds room up to maxGuest.
		m.MaxMemoryMiB = v1alpha1.QuantityMiB(d.Memory.MaxGuest)
	}
	if m.MemoryMiB > 0 {
		return nil
	}
	return field.ErrorList{field.Required(domainPath.Child("memory", "guest"), "set memory.guest or resources.requests.memory to a positive quantity")}
}

func firmware(d *v1alpha1.DomainSpec, m *machine.Machine) {
	fw := d.Firmware
	if fw == nil {
		return
	}
	if fw.UUID != "" {
		m.UUID = string(fw.UUID)
	}
	m.SMBIOSSerial = fw.Serial
	if bl := fw.Bootloader; bl != nil {
		if bl.EFI != nil {
			// FillDefaults made secureBoot explicit.
			m.Firmware.EFI = &machine.EFI{SecureBoot: *bl.EFI.SecureBoot}
		}
		m.Firmware.SerialBIOS = bl.BIOS != nil && bl.BIOS.UseSerial != nil && *bl.BIOS.UseSerial
	}
	if kb := fw.KernelBoot; kb != nil && kb.Container != nil {
		c := kb.Container
		m.Kernel = &machine.KernelBoot{Image: imageRef(c.Image, string(c.ImagePullPolicy), c.ImagePullSecret),
			KernelPath: c.KernelPath, InitrdPath: c.InitrdPath, Args: kb.KernelArgs}
	}
}

func imageRef(ref, policy, secret string) machine.ImageRef {
	return machine.ImageRef{Ref: ref, PullPolicy: policy, PullSecret: secret}
}

// Disk is one spec disk with its volume (nil when the spec has none), at p, after the API's
// defaults; pod is what the launcher pod holds (Host.Pod). The node agent calls it for a hot-plug too, so a hot-plugged disk is described exactly
// as a cold one. The cache and I/O mode default here, not in the API: they are the node's choice
// of how QEMU opens the image (KubeVirt's launcher decides them too).
func Disk(spec *v1alpha1.Disk, vol *v1alpha1.Volume, pod *PodVolumes, p *field.Path) (machine.Disk, field.ErrorList) {
	d := spec.DeepCopy()
	v1alpha1.DefaultDisk(d)
	out := machine.Disk{Name: d.Name, Serial: d.Serial, BootIndex: d.BootOrder,
		Cache: machine.CacheNone, IO: machine.IOThreads}
	if d.Cache != "" {
		out.Cache = machine.Cache(d.Cache)
	}
	if d.IO != "" {
		out.IO = machine.IO(d.IO)
	}
	out.Shareable = d.Shareable != nil && *d.Shareable
	if bs := d.BlockSize; bs != nil && bs.Custom != nil {
		out.BlockSize = BlockSize(bs.Custom)
	}
	out.MatchVolumeBlockSize = v1alpha1.MatchVolumeBlockSize(d.BlockSize)
	switch {
	case d.CDRom != nil:
		// A cdrom is always read-only: the guest cannot write to one, and readonly: false (which
		// KubeVirt accepts too) does not change that.
		out.CDROM, out.ReadOnly, out.Bus = true, true, machine.Bus(d.CDRom.Bus)
	case d.LUN != nil:
		out.LUN, out.ReadOnly, out.Bus = true, d.LUN.ReadOnly, machine.Bus(d.LUN.Bus)
	default:
		out.ReadOnly, out.Bus = d.Disk.ReadOnly, machine.Bus(d.Disk.Bus)
	}
	if vol == nil {
		return out, field.ErrorList{field.Required(p.Child("name"), fmt.Sprintf("no volume named %q", d.Name))}
	}
	src, err := source(vol, pod, field.NewPath("spec", "volumes").Key(vol.Name))
	if err != nil {
		return out, field.ErrorList{err}
	}
	if out.LUN && (src.Claim == nil || src.Claim.Device == "") {
		return out, field.ErrorList{field.Invalid(p.Child("lun"), d.Name, "a lun passes a block device through: the volume must be a claim of volumeMode Block"+claimMode(src.Claim))}
	}
	out.Source = src
	if vol.PersistentVolumeClaim != nil && vol.PersistentVolumeClaim.ReadOnly {
		out.ReadOnly = true
	}
	// A writable containerDisk is written through an overlay the launcher creates; the image
	// itself is never written.
	return out, nil
}

// HotplugDisk is a disk added to the spec of a running instance, at p: checked against what can
// be hot-plugged (a virtio disk on a hostDisk or emptyDisk volume), then described as Disk does.
//
// The disk gets the queues and I/O thread the whole machine description gives it (domain is the
// instance's, with the disk in it), so that a migration target, described whole, gets the same.
func HotplugDisk(domain *v1alpha1.DomainSpec, d *v1alpha1.Disk, vol *v1alpha1.Volume, pod *PodVolumes, p *field.Path) (machine.Disk, error) {
	errs := v1alpha1.ValidateHotplugDisk(d, p)
	errs = append(errs, v1alpha1.ValidateHotplugVolume(vol, field.NewPath("spec", "volumes").Key(vol.Name))...)
	if len(errs) > 0 {
		return machine.Disk{}, errs.ToAggregate()
	}
	md, errs := Disk(d, vol, pod, p)
	if i := slices.IndexFunc(domain.Devices.Disks, func(o v1alpha1.Disk) bool { return o.Name == d.Name }); i >= 0 {
		tuneDisk(domain, i, &md)
	}
	return md, errs.ToAggregate()
}

// ioThreads are the I/O threads QEMU starts with, as KubeVirt lays them out: one for each disk
// with dedicatedIOThread, and for the others one shared thread (policy shared, or no policy when
// some disk has a dedicated one) or, under auto, a pool of twice the vCPUs less the dedicated
// threads (at least one). The pool does not depend on the other disks, so a disk hot-plugged
// later finds its thread.
func ioThreads(d *v1alpha1.DomainSpec) []string {
	var ids []string
	if n := poolSize(d); n == 1 {
		ids = append(ids, sharedIOThread)
	} else {
		for k := range n {
			ids = append(ids, machine.IOThreadPrefix+strconv.Itoa(k))
		}
	}
	for i := range d.Devices.Disks {
		if dedicated(&d.Devices.Disks[i]) {
			ids = append(ids, dedicatedIOThread(i))
		}
	}
	return ids
}

const sharedIOThread = machine.IOThreadPrefix + "shared"

func dedicatedIOThread(i int) string { return machine.IOThreadPrefix + "disk-" + strconv.Itoa(i) }

// poolSize is the number of I/O threads the disks without a dedicated one share: none without a
// policy and without dedicated disks.
func poolSize(d *v1alpha1.DomainSpec) int {
	nDedicated := 0
	for i := range d.Devices.Disks {
		if dedicated(&d.Devices.Disks[i]) {
			nDedicated++
		}
	}
	switch {
	case d.IOThreadsPolicy != nil && *d.IOThreadsPolicy == v1alpha1.IOThreadsPolicyAuto:
		return max(1, 2*int(v1alpha1.VCPUs(d.CPU))-nDedicated)
	case d.IOThreadsPolicy != nil || nDedicated > 0:
		return 1
	}
	return 0
}

func dedicated(d *v1alpha1.Disk) bool { return d.DedicatedIOThread != nil && *d.DedicatedIOThread }

// tuneDisk gives md, the i-th disk of d, its queues (one per vCPU with blockMultiQueue) and its
// I/O thread (ioThreads), when it is a virtio disk.
func tuneDisk(d *v1alpha1.DomainSpec, i int, md *machine.Disk) {
	if md.Bus != machine.BusVirtio || md.CDROM {
		return
	}
	switch mq := d.Devices.BlockMultiQueue; {
	case mq != nil && *mq:
		md.Queues = uint32(v1alpha1.QueueVCPUs(d.CPU))
	case d.CPU != nil && d.CPU.MaxSockets != 0:
		// QEMU's default follows the vCPUs at start, which a migration target after a vCPU
		// hotplug would not share.
		md.Queues = 1
	}
	switch n := poolSize(d); {
	case dedicated(&d.Devices.Disks[i]):
		md.IOThread = dedicatedIOThread(i)
	case n == 1:
		md.IOThread = sharedIOThread
	case n > 1:
		// Round robin over the pool, in the order of the virtio disks without a thread of their own.
		k := 0
		for j := range i {
			if o := &d.Devices.Disks[j]; v1alpha1.OnVirtio(o) && !dedicated(o) {
				k++
			}
		}
		md.IOThread = machine.IOThreadPrefix + strconv.Itoa(k%n)
	}
}

func source(v *v1alpha1.Volume, pod *PodVolumes, p *field.Path) (machine.Source, *field.Error) {
	switch {
	case v.HostDisk != nil:
		hf, err := hostFile(v.HostDisk, pod, p.Child("hostDisk", "path"))
		return machine.Source{HostFile: hf}, err
	case v.ContainerDisk != nil:
		c := v.ContainerDisk
		return machine.Source{Container: &machine.Container{
			Image: imageRef(c.Image, string(c.ImagePullPolicy), c.ImagePullSecret), Path: c.Path}}, nil
	case v.EmptyDisk != nil:
		return machine.Source{Empty: &machine.Empty{CapacityBytes: v.EmptyDisk.Capacity.Value()}}, nil
	case v.PersistentVolumeClaim != nil:
		c, err := claim(v.Name, v.PersistentVolumeClaim.ClaimName, pod, p.Child("persistentVolumeClaim", "claimName"))
		return machine.Source{Claim: c}, err
	case v.Ephemeral != nil && v.Ephemeral.PersistentVolumeClaim != nil:
		c, err := claim(v.Name, v.Ephemeral.PersistentVolumeClaim.ClaimName, pod, p.Child("ephemeral", "persistentVolumeClaim", "claimName"))
		if c != nil {
			c.Overlay = true
		}
		return machine.Source{Claim: c}, err
	case v.DataVolume != nil:
		// CDI's claim of a DataVolume has the DataVolume's name.
		c, err := claim(v.Name, v.DataVolume.Name, pod, p.Child("dataVolume", "name"))
		return machine.Source{Claim: c}, err
	}
	if c, name, ok := v.CloudInit(); ok {
		return cloudInitSource(c, name, p.Child(name))
	}
	if label, kind, ok := v.ConfigVolume(); ok {
		return machine.Source{Config: &machine.Config{Kind: kind, Label: label}}, nil
	}
	return machine.Source{}, field.Forbidden(p, "this version of qvirt runs hostDisk, containerDisk, emptyDisk, persistentVolumeClaim, ephemeral, dataVolume, cloudInitNoCloud, cloudInitConfigDrive, secret, configMap, serviceAccount and downwardAPI volumes")
}

// cloudInitSource is a cloud-init volume's data, decoded; Machine adds the meta-data. Data from a
// Secret stays a reference: the launcher reads it from its pod's Secret volume.
func cloudInitSource(c v1alpha1.CloudInitSource, kind string, p *field.Path) (machine.Source, *field.Error) {
	ci := &machine.CloudInit{DataSource: machine.CloudInitNoCloud}
	if kind == "cloudInitConfigDrive" {
		ci.DataSource = machine.CloudInitConfigDrive
	}
	var err *field.Error
	if ci.UserData, err = cloudInitData(c.UserData, c.UserDataBase64, c.UserDataSecretRef != nil, p.Child("userDataBase64")); err != nil {
		return machine.Source{}, err
	}
	if ci.NetworkData, err = cloudInitData(c.NetworkData, c.NetworkDataBase64, c.NetworkDataSecretRef != nil, p.Child("networkDataBase64")); err != nil {
		return machine.Source{}, err
	}
	return machine.Source{CloudInit: ci}, nil
}

func cloudInitData(inline, encoded string, fromSecret bool, p *field.Path) (machine.CloudInitData, *field.Error) {
	if fromSecret {
		return machine.CloudInitData{FromSecret: true}, nil
	}
	if encoded == "" {
		return machine.CloudInitData{Inline: inline}, nil
	}
	data, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return machine.CloudInitData{}, field.Invalid(p, "<base64 data>", fmt.Sprintf("not valid base64: %v", err))
	}
	return machine.CloudInitData{Inline: string(data)}, nil
}

// hostFile is a hostDisk as the launcher sees it: in a launcher pod, under the mount of the host
// directory holding it, and confined to that mount; outside one, the host's path itself.
func hostFile(h *v1alpha1.HostDisk, pod *PodVolumes, p *field.Path) (*machine.HostFile, *field.Error) {
	hf := &machine.HostFile{Path: h.Path, Format: "raw"}
	if h.Type == v1alpha1.HostDiskExistsOrCreate && h.Capacity != nil {
		hf.CreateBytes = h.Capacity.Value()
	}
	if pod == nil {
		return hf, nil
	}
	best := ""
	for dir := range pod.HostDisks {
		if strings.HasPrefix(h.Path, strings.TrimSuffix(dir, "/")+"/") && len(dir) > len(best) {
			best = dir
		}
	}
	if best == "" {
		return nil, field.Forbidden(p, fmt.Sprintf("%s is in no host directory the launcher pod mounts: hostDisk is not enabled for this namespace, or not under this path", h.Path))
	}
	mount := pod.HostDisks[best]
	hf.Path, hf.Root = mount+strings.TrimPrefix(h.Path, strings.TrimSuffix(best, "/")), mount
	return hf, nil
}

// claimMode is ", and claim X has volumeMode Filesystem" for a filesystem-mode claim, for messages.
func claimMode(c *machine.Claim) string {
	if c == nil || c.Device != "" {
		return ""
	}
	return fmt.Sprintf(", and claim %s has volumeMode Filesystem", c.Name)
}

// claim is claim name attached as volume vol, from what the node agent found of it.
func claim(vol, name string, pod *PodVolumes, p *field.Path) (*machine.Claim, *field.Error) {
	if pod == nil {
		return nil, field.Forbidden(p, "a claim is attached only in a launcher pod")
	}
	c, ok := pod.Claims[name]
	if !ok {
		return nil, field.NotFound(p, name)
	}
	if c.Block {
		return &machine.Claim{Name: name, Device: podlayout.ClaimDevice(vol)}, nil
	}
	size := machine.ClaimImageBytes(c.CapacityBytes)
	if size <= 0 {
		return nil, field.Invalid(p, name, fmt.Sprintf("the claim's capacity, %d bytes, is too small for a disk image: %s takes the capacity less %.1f%% for the filesystem, at least 1 MiB",
			c.CapacityBytes, machine.ClaimImage, machine.FilesystemOverhead*100))
	}
	return &machine.Claim{Name: name, Dir: podlayout.ClaimMount(vol), ImageBytes: size}, nil
}

// NIC is one spec interface, after the API's defaults, on the host side the node agent made for it
// (hosts, by name).
func NIC(spec *v1alpha1.Interface, hosts map[string]machine.NIC, p *field.Path) (machine.NIC, field.ErrorList) {
	h, ok := hosts[spec.Name]
	if !ok {
		return machine.NIC{}, field.ErrorList{field.Forbidden(p, "no tap was set up for this interface: pod networking needs the node agent (qvirt-handler)")}
	}
	in := *spec
	v1alpha1.DefaultInterface(&in)
	out := h
	out.Name = in.Name
	out.Model = machine.NICModel(in.Model)
	if in.MacAddress != "" {
		out.MAC = in.MacAddress
	}
	return out, nil
}

// BlockSize is the machine's form of block sizes given in the API.
func BlockSize(c *v1alpha1.CustomBlockSize) *machine.BlockSize {
	return &machine.BlockSize{Logical: c.Logical, Physical: c.Physical, DiscardGranularity: ptr.Deref(c.DiscardGranularity, 0)}
}
