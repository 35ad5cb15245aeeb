package v1alpha1

import (
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// NotRealisedInstancetype is NotRealised for an instancetype's spec (p is its path): the
// instancetype.kubevirt.io/v1beta1 fields whose KubeVirt meaning this version of qvirt cannot give
// an instance. They are refused rather than dropped, so that a VM never runs without what its
// instancetype promised; an issue that realises one deletes its lines here.
func NotRealisedInstancetype(spec *VirtualMachineInstancetypeSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	no := func(fp *field.Path, what string) {
		errs = append(errs, field.Forbidden(fp, what+" is "+NotRealisedMessage))
	}
	if spec.GPUs != nil {
		errs = append(errs, field.Forbidden(p.Child("gpus"), "GPU passthrough is "+NotRealisedMessage+PassthroughReason))
	}
	if spec.HostDevices != nil {
		errs = append(errs, field.Forbidden(p.Child("hostDevices"), "host device passthrough is "+NotRealisedMessage+PassthroughReason))
	}
	if t := spec.IOThreadsPolicy; t != nil && *t == IOThreadsPolicySupplementalPool {
		errs = append(errs, field.Forbidden(p.Child("ioThreadsPolicy"), "the supplementalPool I/O thread policy is "+NotRealisedMessage+SupplementalPoolReason))
	}
	if spec.IOThreads != nil {
		errs = append(errs, field.Forbidden(p.Child("ioThreads"), "a supplemental I/O thread pool is "+NotRealisedMessage+SupplementalPoolReason))
	}
	if spec.LaunchSecurity != nil {
		no(p.Child("launchSecurity"), "launch security (SEV)")
	}
	return errs
}

// NotRealisedPreference is NotRealised for a preference's spec (p is its path). A preference only
// fills what the VM leaves unset, but a preferred device the instance cannot have would still be
// dropped silently, so these are refused too.
func NotRealisedPreference(spec *VirtualMachinePreferenceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if c := spec.CPU; c != nil {
		errs = append(errs, validateCPUFeatures(c.PreferredCPUFeatures, p.Child("cpu", "preferredCPUFeatures"))...)
	}
	if d := spec.Devices; d != nil {
		dp := p.Child("devices")
		if d.PreferredVirtualGPUOptions != nil {
			errs = append(errs, field.Forbidden(dp.Child("preferredVirtualGPUOptions"), "virtual GPU options (for GPUs) are "+NotRealisedMessage+PassthroughReason))
		}
		errs = append(errs, validateBlockSize(d.PreferredDiskBlockSize, false, dp.Child("preferredDiskBlockSize"))...)
		if v := d.PreferredVideoType; v != nil && *v != "" {
			errs = append(errs, validateEnum(dp.Child("preferredVideoType"), *v, string(VideoVGA), string(VideoVirtio), string(VideoBochs), string(VideoCirrus), string(VideoRamfb))...)
		}
	}
	if a := spec.PreferredArchitecture; a != nil && *a != "" && *a != "amd64" {
		errs = append(errs, field.NotSupported(p.Child("preferredArchitecture"), *a, []string{"amd64"}))
	}
	if r := spec.Requirements; r != nil && r.Architecture != nil && *r.Architecture != "" && *r.Architecture != "amd64" {
		errs = append(errs, field.NotSupported(p.Child("requirements", "architecture"), *r.Architecture, []string{"amd64"}))
	}
	return errs
}

// preferredEFI is the EFI bootloader a preference asks for, or nil.
func preferredEFI(f *FirmwarePreferences) *EFI {
	if f == nil {
		return nil
	}
	if f.PreferredEfi != nil {
		return f.PreferredEfi
	}
	if f.DeprecatedPreferredUseEfi != nil && *f.DeprecatedPreferredUseEfi {
		return &EFI{SecureBoot: f.DeprecatedPreferredUseSecureBoot}
	}
	return nil
}

// PreferredEFI is the EFI bootloader a preference's firmware preferences ask for (preferredEfi,
// else KubeVirt's deprecated preferredUseEfi with preferredUseSecureBoot), or nil.
func PreferredEFI(f *FirmwarePreferences) *EFI {
	if efi := preferredEFI(f); efi != nil {
		return efi.DeepCopy()
	}
	return nil
}
