package instancetype

import (
	"encoding/json"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// applyPreference is KubeVirt's preference/apply: every preferred setting fills the instance's
// field only where the VM left it unset, and never overrides what the VM or its instancetype set.
func applyPreference(spec *v1alpha1.VirtualMachineInstanceSpec, annotations *map[string]string, pref *v1alpha1.VirtualMachinePreferenceSpec) {
	d := &spec.Domain
	if dev := pref.Devices; dev != nil {
		applyDevicePreferences(spec, dev)
	}
	if f := pref.Features; f != nil {
		applyFeaturePreferences(d, f)
	}
	if fw := pref.Firmware; fw != nil {
		applyFirmwarePreferences(d, fw)
	}
	if c := pref.Clock; c != nil {
		applyClockPreferences(d, c)
	}
	if c := pref.CPU; c != nil && len(c.PreferredCPUFeatures) > 0 {
		applyCPUFeaturePreferences(d, c.PreferredCPUFeatures)
	}
	if m := pref.Machine; m != nil && m.PreferredMachineType != "" && (d.Machine == nil || d.Machine.Type == "") {
		d.Machine = &v1alpha1.Machine{Type: m.PreferredMachineType}
	}
	if s := pref.PreferredSubdomain; s != nil && spec.Subdomain == "" {
		spec.Subdomain = *s
	}
	if g := pref.PreferredTerminationGracePeriodSeconds; g != nil && spec.TerminationGracePeriodSeconds == nil {
		v := *g
		spec.TerminationGracePeriodSeconds = &v
	}
	if len(pref.Annotations) > 0 {
		if *annotations == nil {
			*annotations = map[string]string{}
		}
		for k, v := range pref.Annotations {
			if _, ok := (*annotations)[k]; !ok {
				(*annotations)[k] = v
			}
		}
	}
}

func applyDevicePreferences(spec *v1alpha1.VirtualMachineInstanceSpec, p *v1alpha1.DevicePreferences) {
	dev := &spec.Domain.Devices
	setBool := func(dst **bool, pref *bool) {
		if *dst == nil && pref != nil {
			v := *pref
			*dst = &v
		}
	}
	setBool(&dev.AutoattachGraphicsDevice, p.PreferredAutoattachGraphicsDevice)
	setBool(&dev.AutoattachPodInterface, p.PreferredAutoattachPodInterface)
	setBool(&dev.AutoattachSerialConsole, p.PreferredAutoattachSerialConsole)
	setBool(&dev.BlockMultiQueue, p.PreferredBlockMultiQueue)
	setBool(&dev.NetworkInterfaceMultiQueue, p.PreferredNetworkInterfaceMultiQueue)
	setBool(&dev.AutoattachMemBalloon, p.PreferredAutoattachMemBalloon)
	setBool(&dev.AutoattachInputDevice, p.PreferredAutoattachInputDevice)
	setBool(&dev.UseVirtioTransitional, p.PreferredUseVirtioTransitional)
	if s := dev.Sound; s != nil && s.Model == "" {
		s.Model = v1alpha1.SoundModel(p.PreferredSoundModel)
	}
	if dev.Rng == nil && p.PreferredRng != nil {
		dev.Rng = &v1alpha1.Rng{}
	}
	fillUnset(&dev.TPM, p.PreferredTPM)
	if d := p.PreferredDisableHotplug; d != nil && !dev.DisableHotplug {
		dev.DisableHotplug = *d
	}
	for i := range dev.PanicDevices {
		if pd := &dev.PanicDevices[i]; pd.Model == nil && p.PreferredPanicDeviceModel != nil {
			m := *p.PreferredPanicDeviceModel
			pd.Model = &m
		}
	}
	if v := p.PreferredVideoType; v != nil && *v != "" && (dev.Video == nil || dev.Video.Type == "") {
		dev.Video = &v1alpha1.VideoDevice{Type: v1alpha1.VideoType(*v)}
	}
	// Every volume without a disk gets its disk before the disk preferences apply, as the
	// instance's defaulting would afterwards: otherwise such a disk would get the default bus,
	// not the preferred one.
	v1alpha1.SetVolumeDisks(spec)
	for i := range dev.Disks {
		applyDiskPreferences(&dev.Disks[i], p)
	}
	for i := range dev.Interfaces {
		in := &dev.Interfaces[i]
		if in.Model == "" {
			in.Model = p.PreferredInterfaceModel
		}
		if p.PreferredInterfaceMasquerade != nil && in.Masquerade == nil && in.Bridge == nil && in.Binding == nil {
			in.Masquerade = &v1alpha1.InterfaceMasquerade{}
		}
	}
	for i := range dev.Inputs {
		in := &dev.Inputs[i]
		if in.Bus == "" {
			in.Bus = p.PreferredInputBus
		}
		if in.Type == "" {
			in.Type = p.PreferredInputType
		}
	}
}

// applyDiskPreferences is KubeVirt's applyDiskPreferences for one disk: a disk with no target
// becomes a hard disk on the preferred bus, and the bus, cache, I/O mode and dedicated I/O thread
// (virtio hard disks only) fill what the disk leaves unset.
func applyDiskPreferences(disk *v1alpha1.Disk, p *v1alpha1.DevicePreferences) {
	if disk.Disk == nil && disk.CDRom == nil && disk.LUN == nil {
		disk.Disk = &v1alpha1.DiskTarget{}
	}
	if t := disk.CDRom; t != nil && t.Bus == "" {
		t.Bus = p.PreferredCdromBus
	}
	if t := disk.LUN; t != nil && t.Bus == "" {
		t.Bus = p.PreferredLunBus
	}
	t := disk.Disk
	if t == nil {
		// The cache, I/O, block size and thread preferences are hard disks' only, as in KubeVirt.
		return
	}
	if t.Bus == "" {
		t.Bus = p.PreferredDiskBus
	}
	if disk.Cache == "" {
		disk.Cache = p.PreferredDiskCache
	}
	if disk.IO == "" {
		disk.IO = p.PreferredDiskIO
	}
	fillUnset(&disk.BlockSize, p.PreferredDiskBlockSize)
	onVirtio := t.Bus == "" || t.Bus == v1alpha1.DiskBusVirtio
	if d := p.PreferredDiskDedicatedIoThread; d != nil && *d && onVirtio && disk.DedicatedIOThread == nil {
		v := true
		disk.DedicatedIOThread = &v
	}
}

func applyFeaturePreferences(d *v1alpha1.DomainSpec, p *v1alpha1.FeaturePreferences) {
	if *p == (v1alpha1.FeaturePreferences{}) {
		return
	}
	if d.Features == nil {
		d.Features = &v1alpha1.Features{}
	}
	f := d.Features
	fillUnset(&f.ACPI, p.PreferredAcpi)
	fillUnset(&f.APIC, p.PreferredApic)
	fillUnset(&f.SMM, p.PreferredSmm)
	fillUnset(&f.KVM, p.PreferredKvm)
	fillUnset(&f.Pvspinlock, p.PreferredPvspinlock)
	passthrough := f.HypervPassthrough != nil && f.HypervPassthrough.Enabled != nil && *f.HypervPassthrough.Enabled
	if h := p.PreferredHyperv; h != nil && !passthrough {
		if f.Hyperv == nil {
			f.Hyperv = &v1alpha1.FeatureHyperv{}
		}
		applyHypervPreferences(f.Hyperv, h)
	}
}

// applyHypervPreferences fills each enlightenment the VM leaves unset, one by one (KubeVirt's
// applyHyperVFeaturePreferences).
func applyHypervPreferences(h, p *v1alpha1.FeatureHyperv) {
	fillUnset(&h.Relaxed, p.Relaxed)
	fillUnset(&h.VAPIC, p.VAPIC)
	fillUnset(&h.Spinlocks, p.Spinlocks)
	fillUnset(&h.VPIndex, p.VPIndex)
	fillUnset(&h.Runtime, p.Runtime)
	fillUnset(&h.SyNIC, p.SyNIC)
	fillUnset(&h.SyNICTimer, p.SyNICTimer)
	fillUnset(&h.Reset, p.Reset)
	fillUnset(&h.VendorID, p.VendorID)
	fillUnset(&h.Frequencies, p.Frequencies)
	fillUnset(&h.Reenlightenment, p.Reenlightenment)
	fillUnset(&h.TLBFlush, p.TLBFlush)
	fillUnset(&h.IPI, p.IPI)
	fillUnset(&h.EVMCS, p.EVMCS)
}

// applyClockPreferences is KubeVirt's applyClockPreferences: the preferred offset only where the
// VM sets neither utc nor timezone (never a part of one), the preferred timers only where it sets
// none.
func applyClockPreferences(d *v1alpha1.DomainSpec, p *v1alpha1.ClockPreferences) {
	if d.Clock == nil {
		d.Clock = &v1alpha1.Clock{}
	}
	c := d.Clock
	if o := p.PreferredClockOffset; o != nil && c.UTC == nil && c.Timezone == nil {
		c.ClockOffset = *o.DeepCopy()
	}
	fillUnset(&c.Timer, p.PreferredTimer)
}

// applyCPUFeaturePreferences is KubeVirt's: each preferred CPU feature the VM does not name is
// added to its features.
func applyCPUFeaturePreferences(d *v1alpha1.DomainSpec, preferred []v1alpha1.CPUFeature) {
	if d.CPU == nil {
		d.CPU = &v1alpha1.CPU{}
	}
	named := map[string]bool{}
	for _, f := range d.CPU.Features {
		named[f.Name] = true
	}
	for _, f := range preferred {
		if !named[f.Name] {
			d.CPU.Features = append(d.CPU.Features, f)
		}
	}
}

// fillUnset sets *dst to a copy of pref when *dst is unset.
func fillUnset[T any, P interface {
	*T
	DeepCopy() *T
}](dst *P, pref P) {
	if *dst == nil && pref != nil {
		*dst = P(pref.DeepCopy())
	}
}

// applyFirmwarePreferences picks the bootloader when the VM names none: BIOS (with the serial
// preference) when preferredUseBios is true, else the preferred EFI.
func applyFirmwarePreferences(d *v1alpha1.DomainSpec, p *v1alpha1.FirmwarePreferences) {
	if d.Firmware != nil && d.Firmware.Bootloader != nil {
		return
	}
	var bl *v1alpha1.Bootloader
	if b := p.PreferredUseBios; b != nil && *b {
		bios := &v1alpha1.BIOS{}
		if s := p.PreferredUseBiosSerial; s != nil {
			v := *s
			bios.UseSerial = &v
		}
		bl = &v1alpha1.Bootloader{BIOS: bios}
	} else if efi := v1alpha1.PreferredEFI(p); efi != nil {
		bl = &v1alpha1.Bootloader{EFI: efi}
	}
	if bl == nil {
		return
	}
	if d.Firmware == nil {
		d.Firmware = &v1alpha1.Firmware{}
	}
	d.Firmware.Bootloader = bl
}

// ApplyStorageClassPreference is KubeVirt's VM mutator step setPreferenceStorageClassName: the
// preferred storage class goes into every dataVolumeTemplate whose spec.pvc or spec.storage names
// none (a template's spec is CDI's, kept as JSON). A spec that is no JSON object is left to CDI's
// admission to refuse.
func ApplyStorageClassPreference(vm *v1alpha1.VirtualMachine, pref *v1alpha1.VirtualMachinePreferenceSpec) {
	if pref == nil || pref.Volumes == nil || pref.Volumes.PreferredStorageClassName == "" {
		return
	}
	for i := range vm.Spec.DataVolumeTemplates {
		raw := &vm.Spec.DataVolumeTemplates[i].Spec
		var spec map[string]any
		if len(raw.Raw) == 0 || json.Unmarshal(raw.Raw, &spec) != nil {
			continue
		}
		changed := false
		for _, api := range []string{"pvc", "storage"} {
			if s, ok := spec[api].(map[string]any); ok && s["storageClassName"] == nil {
				s["storageClassName"] = pref.Volumes.PreferredStorageClassName
				changed = true
			}
		}
		if !changed {
			continue
		}
		if data, err := json.Marshal(spec); err == nil {
			raw.Raw, raw.Object = data, nil
		}
	}
}
