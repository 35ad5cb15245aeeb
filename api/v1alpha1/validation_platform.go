package v1alpha1

import (
	"fmt"
	"time"
	// The controller and node images may lack a tz database; clock.timezone must resolve in both.
	_ "time/tzdata"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MaxClockOffsetSeconds bounds clock.utc.offsetSeconds: 100 years either way.
const MaxClockOffsetSeconds = 100 * 366 * 24 * 3600

// validateFeatures checks the Hyper-V and KVM features as KubeVirt's VMI admitter does; p is the
// domain's path.
func validateFeatures(d *DomainSpec, p *field.Path) field.ErrorList {
	f := d.Features
	if f == nil {
		return nil
	}
	fp := p.Child("features")
	var errs field.ErrorList
	if hp := f.HypervPassthrough; hp != nil && (hp.Enabled == nil || *hp.Enabled) && f.Hyperv != nil {
		// KubeVirt's message.
		errs = append(errs, field.Forbidden(fp.Child("hyperv"), "Cannot explicitly set hyperV features if HypervPassthrough is being used. Please use either HyperV or HypervPassthrough."))
	}
	h := f.Hyperv
	if h == nil {
		return errs
	}
	hp := fp.Child("hyperv")
	errs = append(errs, validateHypervDependencies(h, hp)...)
	if s := h.Spinlocks; s != nil && s.Retries != nil && *s.Retries < DefaultSpinlockRetries {
		errs = append(errs, field.Invalid(hp.Child("spinlocks", "spinlocks"), *s.Retries, fmt.Sprintf("must be %d or more", DefaultSpinlockRetries)))
	}
	if v := h.VendorID; v != nil && (v.Enabled == nil || *v.Enabled) {
		vp := hp.Child("vendorid", "vendorid")
		switch {
		case v.VendorID == "":
			errs = append(errs, field.Required(vp, "the vendor id, up to 12 characters, when vendorid is enabled"))
		case len(v.VendorID) > 12:
			errs = append(errs, field.TooLong(vp, v.VendorID, 12))
		case !vendorIDChars(v.VendorID):
			// QEMU splits -cpu's feature list at every comma, with no escape.
			errs = append(errs, field.Invalid(vp, v.VendorID, "must be printable ASCII characters other than ','"))
		}
	}
	if t := h.SyNICTimer; t != nil && t.Direct != nil && (t.Direct.Enabled == nil || *t.Direct.Enabled) && t.Enabled != nil && !*t.Enabled {
		errs = append(errs, field.Forbidden(hp.Child("synictimer", "direct"), "direct synthetic timers need synictimer enabled"))
	}
	if t := h.TLBFlush; t != nil && t.Enabled != nil && !*t.Enabled {
		for _, s := range []struct {
			name string
			fs   *FeatureState
		}{{"direct", t.Direct}, {"extended", t.Extended}} {
			if s.fs != nil && (s.fs.Enabled == nil || *s.fs.Enabled) {
				errs = append(errs, field.Forbidden(hp.Child("tlbflush", s.name), "needs tlbflush enabled"))
			}
		}
	}
	if t := h.SyNICTimer; t != nil && (t.Enabled == nil || *t.Enabled) && !HypervClock(d) {
		errs = append(errs, field.Required(p.Child("clock", "timer", "hyperv"),
			"features.hyperv.synictimer needs the Hyper-V clock: QEMU's synthetic timers (hv-stimer) require hv-time; add clock.timer.hyperv: {}"))
	}
	return errs
}

// validateHypervDependencies refuses an enabled Hyper-V feature whose requirement the spec
// disables, with KubeVirt's message. A requirement left unset is turned on by FillDefaults, so
// the check runs on a copy where it is (synictimer with synic unset and vpindex disabled is
// refused as synic, which the defaults would turn on, needing vpindex).
func validateHypervDependencies(h *FeatureHyperv, p *field.Path) field.ErrorList {
	h = h.DeepCopy()
	setHypervDependencies(h)
	var errs field.ErrorList
	for _, d := range hypervDependencies(h, p) {
		if d.on() && d.requires.off() {
			errs = append(errs, field.Invalid(d.path, "enabled", fmt.Sprintf("'%s' requires '%s', which was disabled.", d.path, d.requires.path)))
		}
	}
	return errs
}

// HypervClock says whether clock.timer.hyperv is present and not disabled.
func HypervClock(d *DomainSpec) bool {
	c := d.Clock
	if c == nil || c.Timer == nil || c.Timer.Hyperv == nil {
		return false
	}
	return c.Timer.Hyperv.Enabled == nil || *c.Timer.Hyperv.Enabled
}

// validateClock checks the clock: at most one of utc and timezone, a zone the tz database knows,
// an offset within MaxClockOffsetSeconds, and the timers' enums; p is the domain's path.
func validateClock(c *Clock, p *field.Path) field.ErrorList {
	if c == nil {
		return nil
	}
	cp := p.Child("clock")
	var errs field.ErrorList
	if c.UTC != nil && c.Timezone != nil {
		errs = append(errs, field.Forbidden(cp.Child("timezone"), "utc and timezone are mutually exclusive: set at most one"))
	}
	if u := c.UTC; u != nil && u.OffsetSeconds != nil && (*u.OffsetSeconds > MaxClockOffsetSeconds || *u.OffsetSeconds < -MaxClockOffsetSeconds) {
		errs = append(errs, field.Invalid(cp.Child("utc", "offsetSeconds"), *u.OffsetSeconds, "must be within 100 years of UTC"))
	}
	if tz := c.Timezone; tz != nil {
		if _, err := TimeZone(string(*tz)); err != nil {
			errs = append(errs, field.Invalid(cp.Child("timezone"), string(*tz), err.Error()))
		}
	}
	t := c.Timer
	if t == nil {
		return errs
	}
	tp := cp.Child("timer")
	if t.HPET != nil && t.HPET.TickPolicy != "" {
		errs = append(errs, validateEnum(tp.Child("hpet", "tickPolicy"), string(t.HPET.TickPolicy), string(HPETTickPolicyDelay),
			string(HPETTickPolicyCatchup), string(HPETTickPolicyMerge), string(HPETTickPolicyDiscard))...)
	}
	if t.PIT != nil && t.PIT.TickPolicy != "" {
		errs = append(errs, validateEnum(tp.Child("pit", "tickPolicy"), string(t.PIT.TickPolicy), string(PITTickPolicyDelay),
			string(PITTickPolicyCatchup), string(PITTickPolicyDiscard))...)
	}
	if r := t.RTC; r != nil {
		if r.TickPolicy != "" {
			errs = append(errs, validateEnum(tp.Child("rtc", "tickPolicy"), string(r.TickPolicy), string(RTCTickPolicyDelay), string(RTCTickPolicyCatchup))...)
		}
		if r.Track != "" {
			errs = append(errs, validateEnum(tp.Child("rtc", "track"), string(r.Track), string(TrackGuest), string(TrackWall))...)
		}
	}
	return errs
}

// TimeZone is the tz database zone named zone. The empty name and "Local" (which time.LoadLocation
// takes for UTC and for the node's own zone) are refused: the guest's zone must not depend on
// the node.
func TimeZone(zone string) (*time.Location, error) {
	if zone == "" || zone == "Local" {
		return nil, fmt.Errorf("must be a time zone name of the tz database, such as Europe/Berlin")
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return nil, fmt.Errorf("not a time zone name of the tz database, such as Europe/Berlin")
	}
	return loc, nil
}

func vendorIDChars(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e || s[i] == ',' {
			return false
		}
	}
	return true
}
