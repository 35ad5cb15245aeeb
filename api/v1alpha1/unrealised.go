package v1alpha1

import (
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// NotRealisedMessage ends every refusal of NotRealised.
const NotRealisedMessage = "not supported by this version of qvirt"

// PassthroughReason ends the refusal of GPUs and host devices.
const PassthroughReason = "; it needs a device plugin offering deviceName as a node resource and VFIO passthrough by the launcher, " +
	"neither of which qvirt has yet"

// SupplementalPoolReason ends the refusal of the supplementalPool I/O thread policy.
const SupplementalPoolReason = "; it spreads a disk's queues over several I/O threads, which QEMU 7.2 cannot " +
	"(its virtio-blk takes one iothread; iothread-vq-mapping came in QEMU 9.0): use ioThreadsPolicy shared or auto"

// passtTCPProbes warns of tcpSocket probes on an instance with a user-mode binding: passt, or
// QEMU's slirp, listens on the pod's forwarded ports itself and accepts a connection before the
// guest sees it, so such a probe succeeds whatever the guest does (as under KubeVirt, whose passt
// and slirp are the same).
func passtTCPProbes(spec *VirtualMachineInstanceSpec, p *field.Path) []string {
	if !spec.UsesUserMode() {
		return nil
	}
	var out []string
	for name, probe := range map[string]*Probe{"readinessProbe": spec.ReadinessProbe, "livenessProbe": spec.LivenessProbe} {
		if probe != nil && probe.TCPSocket != nil {
			out = append(out, p.Child(name, "tcpSocket").String()+": with the passt or slirp binding this probe always succeeds: "+
				"the user-mode network accepts the connection in the pod before the guest sees it; use httpGet, exec or guestAgentPing")
		}
	}
	slices.Sort(out)
	return out
}

// DefaultVMNetworkCIDR is the masquerade binding's guest network when the pod network's
// vmNetworkCIDR is unset (netsetup.DefaultVMCIDR).
const DefaultVMNetworkCIDR = "10.0.2.0/24"

// NotRealised lists what the schema and ValidateVirtualMachineInstanceSpec accept (the fields keep
// KubeVirt's shape, so that a KubeVirt manifest reads as one) but this version of qvirt cannot run:
// without this list such an instance passes admission, gets a scheduled pod and then fails to
// start over and over. The validating webhook refuses these at creation of an instance and of a
// VirtualMachine's template, and the node agent's translation (handler/translate) refuses them at
// start; p is the spec's path and every error names the field.
//
// This is the one list of unrealised features: an issue that realises one deletes its lines here
// (and its test case), and nothing else needs to change for the API to accept it.
func NotRealised(spec *VirtualMachineInstanceSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	no := func(fp *field.Path, what, instead string) {
		errs = append(errs, field.Forbidden(fp, what+" is "+NotRealisedMessage+instead))
	}
	dp := p.Child("domain")
	if fw := spec.Domain.Firmware; fw != nil && fw.KernelBoot != nil {
		kp := dp.Child("firmware", "kernelBoot", "container")
		switch c := fw.KernelBoot.Container; {
		case c == nil:
			no(kp, "kernelBoot without a container", "; the kernel comes from a container image")
		case c.KernelPath == "":
			no(kp.Child("kernelPath"), "booting an initrd without a kernel", "")
		}
	}
	if t := spec.Domain.IOThreadsPolicy; t != nil && *t == IOThreadsPolicySupplementalPool {
		no(dp.Child("ioThreadsPolicy"), "the supplementalPool I/O thread policy", SupplementalPoolReason)
	}
	if spec.Domain.IOThreads != nil {
		no(dp.Child("ioThreads"), "a supplemental I/O thread pool", SupplementalPoolReason)
	}
	devp := dp.Child("devices")
	if v := spec.Domain.Devices.AutoattachVSOCK; v != nil && *v {
		no(devp.Child("autoattachVSOCK"), "a VSOCK device", "; the node's kernel keeps one CID space for every guest and process on the node, "+
			"so any process there could connect to the guest, which qvirt's tenant isolation does not allow")
	}
	if len(spec.Domain.Devices.GPUs) > 0 {
		no(devp.Child("gpus"), "GPU passthrough", PassthroughReason)
	}
	if len(spec.Domain.Devices.HostDevices) > 0 {
		no(devp.Child("hostDevices"), "host device passthrough", PassthroughReason)
	}
	for i, d := range spec.Domain.Devices.Disks {
		if d.LUN != nil && d.LUN.Reservation {
			no(dp.Child("devices", "disks").Index(i).Child("lun", "reservation"), "SCSI persistent reservation",
				"; it needs qemu-pr-helper, which qvirt does not run")
		}
	}
	return errs
}

// NotRealisedVM is NotRealised for a VirtualMachine's own fields; its template's spec is
// NotRealised's. Every field of a VirtualMachine's own is realised now (dataVolumeTemplates since
// the VM controller creates CDI DataVolumes); it stays as the place for the next one.
func NotRealisedVM(spec *VirtualMachineSpec) field.ErrorList {
	return nil
}

// Ineffective lists what the spec sets that the guest will not get, because QEMU has no such
// setting; KubeVirt accepts each of them and libvirt drops them just the same (cited with each).
// The webhooks accept such a spec and return these as warnings, so a KubeVirt manifest runs
// unchanged and its author learns what it does here. Each names its field.
func Ineffective(spec *VirtualMachineInstanceSpec, p *field.Path) []string {
	out := passtTCPProbes(spec, p)
	dp := p.Child("domain")
	if c := spec.Domain.CPU; c != nil && c.Realtime != nil && !c.IsolateEmulatorThread {
		if rt, err := RealtimeVCPUs(c); err == nil && uint64(len(rt)) == VCPUs(c) {
			// As under KubeVirt, which does not warn: QEMU's main loop and I/O threads are pinned to
			// the vCPUs' CPUs without an isolated emulator thread.
			out = append(out, dp.Child("cpu", "realtime").String()+": every vCPU is real-time and QEMU's other threads share their CPUs "+
				"(isolateEmulatorThread is false): while the guest keeps its vCPUs busy, QEMU's device emulation gets only what the kernel's "+
				"real-time throttle leaves; set isolateEmulatorThread, or leave a vCPU out of the mask")
		}
	}
	if f := spec.Domain.Features; f != nil && f.APIC != nil && f.APIC.Enabled != nil && !*f.APIC.Enabled {
		// libvirt's QEMU driver has nothing that turns the APIC off: KubeVirt leaves <apic/> out
		// of the domain and the guest keeps its APIC.
		out = append(out, dp.Child("features", "apic", "enabled").String()+
			": false has no effect: the guest's CPUs keep their local APIC (QEMU's x86 CPUs have one, as under KubeVirt)")
	}
	t := spec.Domain.Clock
	if t == nil || t.Timer == nil {
		return out
	}
	tp := dp.Child("clock", "timer")
	if h := t.Timer.HPET; h != nil && h.TickPolicy != "" {
		// libvirt's qemuBuildClockCommandLine: the only meaningful attribute for hpet is present.
		out = append(out, tp.Child("hpet", "tickPolicy").String()+": "+string(h.TickPolicy)+
			" has no effect: QEMU's HPET has no lost-tick policy; a late periodic timer raises one interrupt and skips the periods it missed (as under KubeVirt)")
	}
	if r := t.Timer.RTC; r != nil && r.Enabled != nil && !*r.Enabled {
		// libvirt always gives QEMU -rtc and ignores present for the RTC.
		out = append(out, tp.Child("rtc", "present").String()+
			": false has no effect: the RTC is part of the q35 chipset and the guest keeps it (as under KubeVirt)")
	}
	return out
}
