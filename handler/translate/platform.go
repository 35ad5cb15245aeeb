package translate

import (
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/machine"
)

// NoteHypervEmulation is the note a machine under emulation carries when its spec asks for
// Hyper-V enlightenments: QEMU 7.2 builds the Hyper-V CPUID leaves only for KVM, so under TCG the
// guest would see none of them, and hv-vpindex makes QEMU refuse to start ("kernel doesn't allow
// setting HyperV VP_INDEX").
const NoteHypervEmulation = "Hyper-V enlightenments (features.hyperv, features.hypervPassthrough, clock.timer.hyperv, a hyperv panic device) left out: " +
	"this node runs guests under emulation, where QEMU gives the guest none of them"

// platform is the KVM features, the Hyper-V enlightenments and the clock, after FillDefaults
// (features enabled unless set, Hyper-V requirements turned on). now is when the RTC's zone
// offset is read.
func platform(d *v1alpha1.DomainSpec, m *machine.Machine, now time.Time) field.ErrorList {
	if f := d.Features; f != nil {
		m.CPU.KVMHidden = f.KVM != nil && f.KVM.Hidden
		if f.Pvspinlock != nil {
			m.CPU.PVUnhalt = f.Pvspinlock.Enabled
		}
		m.CPU.HyperV = hyperV(f, d)
	} else if v1alpha1.HypervClock(d) {
		m.CPU.HyperV = &machine.HyperV{Time: true}
	}
	if panicModel(&d.Devices, v1alpha1.PanicHyperv) {
		if m.CPU.HyperV == nil {
			m.CPU.HyperV = &machine.HyperV{}
		}
		// hv-passthrough has hv-crash among the rest.
		m.CPU.HyperV.Crash = !m.CPU.HyperV.Passthrough
	}
	if m.CPU.HyperV != nil && *m.CPU.HyperV == (machine.HyperV{}) {
		m.CPU.HyperV = nil
	}
	if m.CPU.HyperV != nil && m.Accel == machine.AccelTCG {
		m.CPU.HyperV = nil
		m.Notes = append(m.Notes, NoteHypervEmulation)
	}
	return clock(d.Clock, m, now)
}

// panicModel reports whether the instance has a panic device of that model (after FillDefaults).
func panicModel(d *v1alpha1.Devices, model v1alpha1.PanicDeviceModel) bool {
	for _, pd := range d.PanicDevices {
		if pd.Model != nil && *pd.Model == model {
			return true
		}
	}
	return false
}

func on(fs *v1alpha1.FeatureState) bool { return fs != nil && (fs.Enabled == nil || *fs.Enabled) }

func onFlag(present bool, enabled *bool) bool { return present && (enabled == nil || *enabled) }

// hyperV maps features.hyperv and hypervPassthrough to QEMU's flags as libvirt does for
// KubeVirt's domain (<hyperv mode='passthrough'> or one <feature state='on'> per feature, and
// the hypervclock timer as hv-time).
func hyperV(f *v1alpha1.Features, d *v1alpha1.DomainSpec) *machine.HyperV {
	if p := f.HypervPassthrough; p != nil && (p.Enabled == nil || *p.Enabled) {
		// Every enlightenment the host offers, the Hyper-V clock (hv-time) included; validation
		// refuses features.hyperv beside it.
		return &machine.HyperV{Passthrough: true}
	}
	hv := &machine.HyperV{Time: v1alpha1.HypervClock(d)}
	h := f.Hyperv
	if h == nil {
		return hv
	}
	hv.Relaxed, hv.VAPIC, hv.VPIndex, hv.Runtime = on(h.Relaxed), on(h.VAPIC), on(h.VPIndex), on(h.Runtime)
	hv.SyNIC, hv.Reset, hv.Frequencies, hv.Reenlightenment = on(h.SyNIC), on(h.Reset), on(h.Frequencies), on(h.Reenlightenment)
	hv.IPI, hv.EVMCS = on(h.IPI), on(h.EVMCS)
	if t := h.SyNICTimer; onFlag(t != nil, enabledOf(t)) {
		hv.STimer, hv.STimerDirect = true, on(t.Direct)
	}
	if t := h.TLBFlush; t != nil && onFlag(true, t.Enabled) {
		hv.TLBFlush, hv.TLBFlushDirect, hv.TLBFlushExt = true, on(t.Direct), on(t.Extended)
	}
	if s := h.Spinlocks; s != nil && onFlag(true, s.Enabled) {
		hv.Spinlocks = v1alpha1.DefaultSpinlockRetries
		if s.Retries != nil {
			hv.Spinlocks = *s.Retries
		}
	}
	if v := h.VendorID; v != nil && onFlag(true, v.Enabled) {
		hv.VendorID = v.VendorID
	}
	return hv
}

func enabledOf(t *v1alpha1.SyNICTimer) *bool {
	if t == nil {
		return nil
	}
	return t.Enabled
}

// clock maps domain.clock as libvirt maps KubeVirt's <clock>: utc (with an adjustment) and
// timezone become where the RTC starts, the rtc timer QEMU's -rtc clock and driftfix, the pit's
// tick policy kvm-pit's lost_tick_policy (catchup is slew), present: false on the pit and hpet
// leaves them out, and the kvm timer is the kvmclock CPU flag.
func clock(c *v1alpha1.Clock, m *machine.Machine, now time.Time) field.ErrorList {
	if c == nil {
		return nil
	}
	cp := domainPath.Child("clock")
	switch {
	case c.UTC != nil && c.UTC.OffsetSeconds != nil:
		m.Clock.RTCOffsetSeconds = int64(*c.UTC.OffsetSeconds)
	case c.Timezone != nil:
		loc, err := v1alpha1.TimeZone(string(*c.Timezone))
		if err != nil {
			return field.ErrorList{field.Invalid(cp.Child("timezone"), string(*c.Timezone), err.Error())}
		}
		// The zone's offset now, as QEMU's base=localtime reads it once when it starts.
		_, off := now.In(loc).Zone()
		m.Clock.RTCOffsetSeconds = int64(off)
	}
	t := c.Timer
	if t == nil {
		return nil
	}
	if r := t.RTC; r != nil {
		m.Clock.RTCCatchUp = r.TickPolicy == v1alpha1.RTCTickPolicyCatchup
		switch r.Track {
		case v1alpha1.TrackGuest:
			m.Clock.RTCClock = machine.RTCClockVM
		case v1alpha1.TrackWall:
			m.Clock.RTCClock = machine.RTCClockHost
		}
	}
	if p := t.PIT; p != nil {
		m.Clock.NoPIT = p.Enabled != nil && !*p.Enabled
		switch p.TickPolicy {
		case v1alpha1.PITTickPolicyDelay:
			m.Clock.PITLostTicks = machine.LostTickDelay
		case v1alpha1.PITTickPolicyCatchup:
			m.Clock.PITLostTicks = machine.LostTickSlew
		case v1alpha1.PITTickPolicyDiscard:
			m.Clock.PITLostTicks = machine.LostTickDiscard
		}
	}
	if h := t.HPET; h != nil {
		m.Clock.NoHPET = h.Enabled != nil && !*h.Enabled
	}
	if k := t.KVM; k != nil {
		shown := k.Enabled == nil || *k.Enabled
		m.CPU.KVMClock = &shown
	}
	return nil
}
