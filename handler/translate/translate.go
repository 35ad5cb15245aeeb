// Package translate turns a VMI into the machine description a launcher executes
// (package machine). It is the one place where a spec decision is made: it applies the API's
// defaults (v1alpha1.SetDefaults) and decides what depends on the node (the CPU model under
// emulation, cache and I/O mode), memory in MiB, the SMBIOS UUID, which volume source becomes
// which image source. The node agent calls it for a start, a migration
// target and a hot-plug; `qvirtctl machine` calls it for a launcher run outside Kubernetes. Errors
// name the VMI field at fault ("spec.domain.memory.guest").
package translate

import (
	"encoding/base64"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/machine"
)

// Host is what the node decided for the instance outside its spec.
type Host struct {
	// Emulation runs the guest under TCG (the cluster's useEmulation); otherwise KVM.
	Emulation bool
	// NICs are the host sides the node agent made for the spec's interfaces, by interface name.
	// Each carries the MAC the interface gets (the spec's, else the one the network setup chose).
	NICs map[string]machine.NIC
	// SkipNotRealised describes even what this version does not realise (v1alpha1.NotRealised):
	// for a migration target, which runs what its source runs (a spec admitted by an older version
	// included), and for tests of the argv builder's layouts that the network setup cannot make yet
	// (several NICs).
	SkipNotRealised bool
}

var (
	specPath   = field.NewPath("spec")
	domainPath = specPath.Child("domain")
	diskPath   = domainPath.Child("devices", "disks")
	ifacePath  = domainPath.Child("devices", "interfaces")
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
	v1alpha1.SetDefaults(spec)
	m := &machine.Machine{
		Name: v.Name, Namespace: v.Namespace, UID: string(v.UID), UUID: string(v.UID),
		Type: spec.Domain.Machine.Type, Accel: machine.AccelKVM, NoACPI: acpiOff(spec.Domain.Features), SMM: smm(spec.Domain.Features),
		GracePeriodSeconds: *spec.TerminationGracePeriodSeconds,
		SerialConsole:      *spec.Domain.Devices.AutoattachSerialConsole,
		Graphics:           *spec.Domain.Devices.AutoattachGraphicsDevice,
		StartPaused:        spec.StartStrategy != nil && *spec.StartStrategy == v1alpha1.StartStrategyPaused,
	}
	if host.Emulation {
		m.Accel = machine.AccelTCG
	}
	errs = append(errs, cpu(&spec.Domain, m)...)
	errs = append(errs, memory(&spec.Domain, m)...)
	firmware(&spec.Domain, m)
	vols := map[string]*v1alpha1.Volume{}
	for i := range spec.Volumes {
		vols[spec.Volumes[i].Name] = &spec.Volumes[i]
	}
	for i := range spec.Domain.Devices.Disks {
		d, err := Disk(&spec.Domain.Devices.Disks[i], vols[spec.Domain.Devices.Disks[i].Name], diskPath.Index(i))
		errs = append(errs, err...)
		m.Disks = append(m.Disks, d)
	}
	for i := range spec.Domain.Devices.Interfaces {
		n, err := NIC(&spec.Domain.Devices.Interfaces[i], host.NICs, ifacePath.Index(i))
		errs = append(errs, err...)
		m.NICs = append(m.NICs, n)
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
		Sockets: one(c.Sockets), Cores: one(c.Cores), Threads: one(c.Threads)}
	return nil
}

func memory(d *v1alpha1.DomainSpec, m *machine.Machine) field.ErrorList {
	p := domainPath.Child("memory", "guest")
	if d.Memory == nil || d.Memory.Guest == nil {
		p = domainPath.Child("resources", "requests", "memory")
	}
	q := v1alpha1.GuestMemory(d) // validation guarantees a positive quantity
	const mib = 1 << 20
	v := q.Value()
	if q.CmpInt64(v) != 0 || v%mib != 0 {
		return field.ErrorList{field.Invalid(p, q.String(), "must be a whole number of MiB")}
	}
	m.MemoryMiB = v / mib
	return nil
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
			// SetDefaults made secureBoot explicit.
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
// defaults. The node agent calls it for a hot-plug too, so a hot-plugged disk is described exactly
// as a cold one. The cache and I/O mode default here, not in the API: they are the node's choice
// of how QEMU opens the image (KubeVirt's launcher decides them too).
func Disk(spec *v1alpha1.Disk, vol *v1alpha1.Volume, p *field.Path) (machine.Disk, field.ErrorList) {
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
	if d.CDRom != nil {
		// A cdrom is always read-only: validation refuses readonly: false.
		out.CDROM, out.ReadOnly, out.Bus = true, true, machine.Bus(d.CDRom.Bus)
	} else {
		out.ReadOnly, out.Bus = d.Disk.ReadOnly, machine.Bus(d.Disk.Bus)
	}
	if vol == nil {
		return out, field.ErrorList{field.Required(p.Child("name"), fmt.Sprintf("no volume named %q", d.Name))}
	}
	src, err := source(vol, field.NewPath("spec", "volumes").Key(vol.Name))
	if err != nil {
		return out, field.ErrorList{err}
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
func HotplugDisk(d *v1alpha1.Disk, vol *v1alpha1.Volume, p *field.Path) (machine.Disk, error) {
	errs := v1alpha1.ValidateHotplugDisk(d, p)
	errs = append(errs, v1alpha1.ValidateHotplugVolume(vol, field.NewPath("spec", "volumes").Key(vol.Name))...)
	if len(errs) > 0 {
		return machine.Disk{}, errs.ToAggregate()
	}
	md, errs := Disk(d, vol, p)
	return md, errs.ToAggregate()
}

func source(v *v1alpha1.Volume, p *field.Path) (machine.Source, *field.Error) {
	switch {
	case v.HostDisk != nil:
		hf := &machine.HostFile{Path: v.HostDisk.Path, Format: "raw"}
		if v.HostDisk.Type == v1alpha1.HostDiskExistsOrCreate && v.HostDisk.Capacity != nil {
			hf.CreateBytes = v.HostDisk.Capacity.Value()
		}
		return machine.Source{HostFile: hf}, nil
	case v.ContainerDisk != nil:
		c := v.ContainerDisk
		return machine.Source{Container: &machine.Container{
			Image: imageRef(c.Image, string(c.ImagePullPolicy), c.ImagePullSecret), Path: c.Path}}, nil
	case v.EmptyDisk != nil:
		return machine.Source{Empty: &machine.Empty{CapacityBytes: v.EmptyDisk.Capacity.Value()}}, nil
	}
	if c, name, ok := v.CloudInit(); ok {
		return cloudInitSource(c, name, p.Child(name))
	}
	return machine.Source{}, field.Forbidden(p, "this version of qvirt runs hostDisk, containerDisk, emptyDisk, cloudInitNoCloud and cloudInitConfigDrive volumes")
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
