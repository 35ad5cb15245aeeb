package launcher

import (
	"github.com/qvirt/qvirt/machine"
)

// The clock device kind: where the guest's RTC starts and what it follows, and KVM's PIT's
// lost-tick policy (the HPET and PIT themselves are machine options, firmware.go). Fixed when
// QEMU starts; a migration carries the RTC's state, so a target's start time does not matter.

// rtcBaseLayout is QEMU's -rtc base=datetime form, which it reads as UTC.
const rtcBaseLayout = "2006-01-02T15:04:05"

// clock: -rtc and -global kvm-pit.lost_tick_policy, only when the machine sets something, as
// libvirt maps a domain's <clock> (offset utc/timezone/adjustment, the rtc timer's track and
// tickpolicy, the pit's tickpolicy).
func (b *builder) clock() {
	c, cp := b.m.Clock, machinePath.Child("clock")
	var rtc string
	switch {
	case c.RTCOffsetSeconds != 0 && b.m.RTCStart.IsZero():
		b.fail(machine.Required(machinePath.Child("rtcStart"), "the RTC's start time, resolved on the host for a clock offset from UTC"))
	case c.RTCOffsetSeconds == 0 && !b.m.RTCStart.IsZero():
		b.fail(machine.Forbidden(machinePath.Child("rtcStart"), "a start time was resolved but the RTC starts at UTC"))
	case c.RTCOffsetSeconds != 0:
		rtc = "base=" + b.m.RTCStart.UTC().Format(rtcBaseLayout)
	case c.RTCClock != "" || c.RTCCatchUp:
		rtc = "base=utc"
	}
	switch c.RTCClock {
	case "":
	case machine.RTCClockVM, machine.RTCClockHost:
		rtc += ",clock=" + string(c.RTCClock)
	default:
		b.fail(machine.NotSupported(cp.Child("rtcClock"), c.RTCClock, []string{string(machine.RTCClockVM), string(machine.RTCClockHost)}))
	}
	if c.RTCCatchUp {
		rtc += ",driftfix=slew"
	}
	if rtc != "" {
		b.add("-rtc", rtc)
	}
	switch c.PITLostTicks {
	case "":
	case machine.LostTickDelay, machine.LostTickSlew, machine.LostTickDiscard:
		if c.NoPIT {
			b.fail(machine.Forbidden(cp.Child("pitLostTicks"), "the machine has no PIT"))
		}
		// KVM's in-kernel PIT; QEMU's own (under TCG) has no such property, and a global for a
		// device that is not created does nothing.
		b.add("-global", "kvm-pit.lost_tick_policy="+string(c.PITLostTicks))
	default:
		b.fail(machine.NotSupported(cp.Child("pitLostTicks"), c.PITLostTicks,
			[]string{string(machine.LostTickDelay), string(machine.LostTickSlew), string(machine.LostTickDiscard)}))
	}
}
