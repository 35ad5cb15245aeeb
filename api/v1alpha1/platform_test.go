package v1alpha1

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
)

func enabled() *FeatureState  { return &FeatureState{Enabled: ptr.To(true)} }
func disabled() *FeatureState { return &FeatureState{Enabled: ptr.To(false)} }

// TestHypervDefaults: KubeVirt's defaulting of the Hyper-V features (its mutating webhook's
// cases in pkg/virt-api/webhooks/mutating-webhook): present features are enabled, and the
// features an enabled one needs are turned on unless the spec sets them.
func TestHypervDefaults(t *testing.T) {
	cases := []struct {
		name string
		in   *FeatureHyperv
		want *FeatureHyperv
	}{
		{"empty hyperv stays empty", &FeatureHyperv{}, &FeatureHyperv{}},
		{"features without requirements only get enabled", &FeatureHyperv{Relaxed: &FeatureState{}, Runtime: enabled(), Reset: &FeatureState{}},
			&FeatureHyperv{Relaxed: enabled(), Runtime: enabled(), Reset: enabled()}},
		{"synictimer brings synic and vpindex", &FeatureHyperv{Relaxed: enabled(), SyNICTimer: &SyNICTimer{}},
			&FeatureHyperv{Relaxed: enabled(), VPIndex: enabled(), SyNIC: enabled(), SyNICTimer: &SyNICTimer{Enabled: ptr.To(true)}}},
		{"a disabled requirement stays disabled", &FeatureHyperv{VPIndex: disabled(), SyNICTimer: &SyNICTimer{Enabled: ptr.To(true)}, EVMCS: enabled()},
			&FeatureHyperv{VPIndex: disabled(), SyNIC: enabled(), SyNICTimer: &SyNICTimer{Enabled: ptr.To(true)}, EVMCS: enabled(), VAPIC: enabled()}},
		{"ipi and tlbflush bring vpindex, tlbflush direct vapic", &FeatureHyperv{IPI: &FeatureState{}, TLBFlush: &TLBFlush{Direct: &FeatureState{}}},
			&FeatureHyperv{IPI: enabled(), VPIndex: enabled(), VAPIC: enabled(), TLBFlush: &TLBFlush{Enabled: ptr.To(true), Direct: enabled()}}},
		{"a disabled feature needs nothing", &FeatureHyperv{SyNIC: disabled()}, &FeatureHyperv{SyNIC: disabled()}},
		{"spinlocks retry 4096 times unless set", &FeatureHyperv{Spinlocks: &FeatureSpinlocks{}},
			&FeatureHyperv{Spinlocks: &FeatureSpinlocks{Enabled: ptr.To(true), Retries: ptr.To[uint32](4096)}}},
		{"spinlocks keep their retries", &FeatureHyperv{Spinlocks: &FeatureSpinlocks{Retries: ptr.To[uint32](8191)}},
			&FeatureHyperv{Spinlocks: &FeatureSpinlocks{Enabled: ptr.To(true), Retries: ptr.To[uint32](8191)}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := &VirtualMachineInstanceSpec{Domain: DomainSpec{Features: &Features{Hyperv: tc.in}}}
			FillDefaults(spec)
			if got := spec.Domain.Features.Hyperv; !equality.Semantic.DeepEqual(got, tc.want) {
				g, _ := json.Marshal(got)
				w, _ := json.Marshal(tc.want)
				t.Fatalf("got  %s\nwant %s", g, w)
			}
		})
	}
	t.Run("hypervPassthrough and pvspinlock are enabled when present", func(t *testing.T) {
		spec := &VirtualMachineInstanceSpec{Domain: DomainSpec{Features: &Features{HypervPassthrough: &HyperVPassthrough{}, Pvspinlock: &FeatureState{}}}}
		FillDefaults(spec)
		if f := spec.Domain.Features; !*f.HypervPassthrough.Enabled || !*f.Pvspinlock.Enabled {
			t.Fatalf("got %+v %+v", f.HypervPassthrough, f.Pvspinlock)
		}
	})
}

// TestValidateFeaturesAndClock: each refusal names the field at fault, from one valid VM with
// a Windows-like platform (KubeVirt's vmi-windows example) changed one thing at a time.
func TestValidateFeaturesAndClock(t *testing.T) {
	windows := func() *VirtualMachine {
		vm := validVM()
		d := &vm.Spec.Template.Spec.Domain
		d.Features = &Features{ACPI: &FeatureState{}, APIC: &FeatureAPIC{}, KVM: &FeatureKVM{Hidden: true}, Pvspinlock: disabled(),
			Hyperv: &FeatureHyperv{Relaxed: &FeatureState{}, VAPIC: &FeatureState{}, Spinlocks: &FeatureSpinlocks{Retries: ptr.To[uint32](8191)},
				SyNICTimer: &SyNICTimer{Direct: &FeatureState{}}, TLBFlush: &TLBFlush{Extended: &FeatureState{}}, IPI: &FeatureState{},
				VendorID: &FeatureVendorID{VendorID: "KVMKVMKVM"}, Frequencies: &FeatureState{}, Reenlightenment: &FeatureState{},
				Runtime: &FeatureState{}, Reset: &FeatureState{}, EVMCS: &FeatureState{}}}
		d.Clock = &Clock{ClockOffset: ClockOffset{Timezone: ptr.To(ClockOffsetTimezone("Europe/Berlin"))}, Timer: &Timer{
			HPET: &HPETTimer{Enabled: ptr.To(false)}, PIT: &PITTimer{TickPolicy: PITTickPolicyDelay},
			RTC: &RTCTimer{TickPolicy: RTCTickPolicyCatchup, Track: TrackGuest}, Hyperv: &HypervTimer{}, KVM: &KVMTimer{}}}
		return vm
	}
	if errs := ValidateVirtualMachine(windows()); len(errs) != 0 {
		t.Fatalf("the base object must be valid, got %v", errs)
	}
	const hv = "spec.template.spec.domain.features.hyperv"
	cases := []struct {
		name   string
		mutate func(d *DomainSpec)
		path   string
		detail string
	}{
		{"synic with vpindex disabled", func(d *DomainSpec) { d.Features.Hyperv.VPIndex = disabled() },
			hv + ".synic", "'" + hv + ".synic' requires '" + hv + ".vpindex', which was disabled."},
		{"synictimer with synic disabled", func(d *DomainSpec) { d.Features.Hyperv.SyNIC = disabled() },
			hv + ".synictimer", "requires '" + hv + ".synic'"},
		{"evmcs with vapic disabled", func(d *DomainSpec) { d.Features.Hyperv.VAPIC = disabled() }, hv + ".evmcs", "requires '" + hv + ".vapic'"},
		{"ipi with vpindex disabled", func(d *DomainSpec) {
			d.Features.Hyperv.VPIndex, d.Features.Hyperv.SyNICTimer = disabled(), nil
		}, hv + ".ipi", "requires '" + hv + ".vpindex'"},
		{"tlbflush direct with vapic disabled", func(d *DomainSpec) {
			d.Features.Hyperv.VAPIC, d.Features.Hyperv.EVMCS, d.Features.Hyperv.TLBFlush.Direct = disabled(), nil, &FeatureState{}
		}, hv + ".tlbflush.direct", "requires '" + hv + ".vapic'"},
		{"hyperv with hypervPassthrough", func(d *DomainSpec) { d.Features.HypervPassthrough = &HyperVPassthrough{} }, hv, "HypervPassthrough"},
		{"too few spinlock retries", func(d *DomainSpec) { d.Features.Hyperv.Spinlocks.Retries = ptr.To[uint32](4095) }, hv + ".spinlocks.spinlocks", "4096"},
		{"vendor id too long", func(d *DomainSpec) { d.Features.Hyperv.VendorID.VendorID = "thirteen-char" }, hv + ".vendorid.vendorid", "12"},
		{"vendor id with a comma", func(d *DomainSpec) { d.Features.Hyperv.VendorID.VendorID = "KVM,KVM" }, hv + ".vendorid.vendorid", "','"},
		{"vendor id enabled but empty", func(d *DomainSpec) { d.Features.Hyperv.VendorID.VendorID = "" }, hv + ".vendorid.vendorid", "12"},
		{"synictimer without the Hyper-V clock", func(d *DomainSpec) { d.Clock.Timer.Hyperv = nil },
			"spec.template.spec.domain.clock.timer.hyperv", "hv-time"},
		{"direct timers with synictimer disabled", func(d *DomainSpec) {
			d.Features.Hyperv.SyNICTimer.Enabled = ptr.To(false)
		}, hv + ".synictimer.direct", "synictimer enabled"},
		{"extended tlbflush with tlbflush disabled", func(d *DomainSpec) {
			d.Features.Hyperv.TLBFlush.Enabled = ptr.To(false)
		}, hv + ".tlbflush.extended", "tlbflush enabled"},
		{"utc and timezone", func(d *DomainSpec) { d.Clock.UTC = &ClockOffsetUTC{} }, "spec.template.spec.domain.clock.timezone", "at most one"},
		{"unknown time zone", func(d *DomainSpec) { d.Clock.Timezone = ptr.To(ClockOffsetTimezone("Mars/Olympus_Mons")) },
			"spec.template.spec.domain.clock.timezone", "tz database"},
		{"the node's own zone", func(d *DomainSpec) { d.Clock.Timezone = ptr.To(ClockOffsetTimezone("Local")) },
			"spec.template.spec.domain.clock.timezone", "tz database"},
		{"offset beyond 100 years", func(d *DomainSpec) {
			d.Clock.Timezone, d.Clock.UTC = nil, &ClockOffsetUTC{OffsetSeconds: ptr.To(MaxClockOffsetSeconds + 1)}
		}, "spec.template.spec.domain.clock.utc.offsetSeconds", "100 years"},
		{"pit merge", func(d *DomainSpec) { d.Clock.Timer.PIT.TickPolicy = "merge" }, "spec.template.spec.domain.clock.timer.pit.tickPolicy", "supported"},
		{"rtc discard", func(d *DomainSpec) { d.Clock.Timer.RTC.TickPolicy = "discard" }, "spec.template.spec.domain.clock.timer.rtc.tickPolicy", "supported"},
		{"rtc track boot", func(d *DomainSpec) { d.Clock.Timer.RTC.Track = "boot" }, "spec.template.spec.domain.clock.timer.rtc.track", "supported"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vm := windows()
			tc.mutate(&vm.Spec.Template.Spec.Domain)
			errs := ValidateVirtualMachine(vm)
			if !hasPath(errs, tc.path) {
				t.Fatalf("want an error at %s, got %v", tc.path, errs)
			}
			if !strings.Contains(errs.ToAggregate().Error(), tc.detail) {
				t.Fatalf("want the error to say %q, got %v", tc.detail, errs)
			}
		})
	}
	t.Run("a requirement the defaults turn on is not refused", func(t *testing.T) {
		vm := windows()
		vm.Spec.Template.Spec.Domain.Features.Hyperv.VPIndex = nil
		vm.Spec.Template.Spec.Domain.Features.Hyperv.SyNIC = nil
		if errs := ValidateVirtualMachine(vm); len(errs) != 0 {
			t.Fatalf("want no error, got %v", errs)
		}
	})
	t.Run("synictimer with vpindex disabled is refused before the defaults turn synic on", func(t *testing.T) {
		vm := windows()
		vm.Spec.Template.Spec.Domain.Features.Hyperv.VPIndex = disabled()
		if errs := ValidateVirtualMachine(vm); !hasPath(errs, hv+".synic") {
			t.Fatalf("want an error at %s.synic, got %v", hv, errs)
		}
	})
}

func TestHypervPassthroughIsNotMigratable(t *testing.T) {
	spec := &validVM().Spec.Template.Spec
	spec.Domain.Features = &Features{HypervPassthrough: &HyperVPassthrough{}}
	if ok, reason, _ := LiveMigratable(spec); ok || reason != HypervPassthroughReason {
		t.Fatalf("LiveMigratable = %v, %q; want false, %q", ok, reason, HypervPassthroughReason)
	}
	spec.Domain.Features.HypervPassthrough.Enabled = ptr.To(false)
	if ok, _, msg := LiveMigratable(spec); !ok {
		t.Fatalf("disabled passthrough: not migratable: %s", msg)
	}
}
