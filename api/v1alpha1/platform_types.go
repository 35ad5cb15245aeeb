package v1alpha1

// The Hyper-V enlightenments, the KVM features and the clock, as KubeVirt's kubevirt.io/v1 shapes
// them (its schema.go: FeatureHyperv, FeatureKVM, Clock, Timer). Each maps to one QEMU option;
// docs/kubevirt-compat.md lists the mapping.

// HyperVPassthrough turns on every Hyper-V enlightenment the host offers.
type HyperVPassthrough struct {
	// Enabled turns it on (the default when hypervPassthrough is present) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
}

// FeatureHyperv are the Hyper-V enlightenments, each off unless present.
type FeatureHyperv struct {
	// Relaxed tells the guest to relax its watchdog timeouts (hv-relaxed).
	// +optional
	Relaxed *FeatureState `json:"relaxed,omitempty"`
	// VAPIC gives the guest the VP assist page for paravirtual APIC access (hv-vapic).
	// +optional
	VAPIC *FeatureState `json:"vapic,omitempty"`
	// Spinlocks sets how many times the guest spins on a lock before it tells the host
	// (hv-spinlocks).
	// +optional
	Spinlocks *FeatureSpinlocks `json:"spinlocks,omitempty"`
	// VPIndex gives the guest its virtual processor index (hv-vpindex).
	// +optional
	VPIndex *FeatureState `json:"vpindex,omitempty"`
	// Runtime gives the guest its virtual processor run time (hv-runtime).
	// +optional
	Runtime *FeatureState `json:"runtime,omitempty"`
	// SyNIC is the synthetic interrupt controller (hv-synic); needs vpindex.
	// +optional
	SyNIC *FeatureState `json:"synic,omitempty"`
	// SyNICTimer are the synthetic timers (hv-stimer); needs synic and the Hyper-V clock
	// (clock.timer.hyperv). direct delivers their expiry as a normal interrupt (hv-stimer-direct).
	// +optional
	SyNICTimer *SyNICTimer `json:"synictimer,omitempty"`
	// Reset lets the guest reset itself through an MSR (hv-reset).
	// +optional
	Reset *FeatureState `json:"reset,omitempty"`
	// VendorID sets the hypervisor vendor the guest reads (hv-vendor-id).
	// +optional
	VendorID *FeatureVendorID `json:"vendorid,omitempty"`
	// Frequencies gives the guest its TSC and APIC frequencies (hv-frequencies).
	// +optional
	Frequencies *FeatureState `json:"frequencies,omitempty"`
	// Reenlightenment notifies the guest of TSC frequency changes (hv-reenlightenment).
	// +optional
	Reenlightenment *FeatureState `json:"reenlightenment,omitempty"`
	// TLBFlush is the paravirtual TLB shoot-down (hv-tlbflush); needs vpindex. direct
	// (hv-tlbflush-direct, needs vapic) and extended (hv-tlbflush-ext) refine it.
	// +optional
	TLBFlush *TLBFlush `json:"tlbflush,omitempty"`
	// IPI is the paravirtual inter-processor interrupt (hv-ipi); needs vpindex.
	// +optional
	IPI *FeatureState `json:"ipi,omitempty"`
	// EVMCS is the enlightened VMCS for nested Hyper-V (hv-evmcs, with the vmx CPU feature); needs
	// vapic.
	// +optional
	EVMCS *FeatureState `json:"evmcs,omitempty"`
}

// SyNICTimer are the Hyper-V synthetic timers.
type SyNICTimer struct {
	// Enabled turns the feature on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Direct delivers the timers' expiry as a normal interrupt rather than a SynIC message.
	// +optional
	Direct *FeatureState `json:"direct,omitempty"`
}

// TLBFlush is the Hyper-V paravirtual TLB flush.
type TLBFlush struct {
	// Enabled turns the feature on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Direct lets KVM handle a nested guest's flush hypercalls itself.
	// +optional
	Direct *FeatureState `json:"direct,omitempty"`
	// Extended lets the guest flush ranges of addresses.
	// +optional
	Extended *FeatureState `json:"extended,omitempty"`
}

// FeatureSpinlocks are the Hyper-V paravirtual spinlocks.
type FeatureSpinlocks struct {
	// Enabled turns the feature on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// Retries is how many times the guest spins before it tells the host: 4096 or more, 4096
	// when unset.
	// +optional
	// +kubebuilder:validation:Minimum=4096
	Retries *uint32 `json:"spinlocks,omitempty"`
}

// FeatureVendorID is the hypervisor vendor the guest reads in CPUID.
type FeatureVendorID struct {
	// Enabled turns the feature on (the default) or off.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`
	// VendorID is up to twelve printable ASCII characters; required when enabled.
	// +optional
	// +kubebuilder:validation:MaxLength=12
	VendorID string `json:"vendorid,omitempty"`
}

// FeatureKVM is how KVM shows itself to the guest.
type FeatureKVM struct {
	// Hidden hides KVM's CPUID signature from the guest. Defaults to false.
	// +optional
	Hidden bool `json:"hidden,omitempty"`
}

// Clock is the guest's real-time clock and its timers. At most one of utc and timezone is set;
// without either the RTC starts at UTC.
// +kubebuilder:validation:XValidation:rule="!(has(self.utc) && has(self.timezone))",message="utc and timezone are mutually exclusive: set at most one"
type Clock struct {
	ClockOffset `json:",inline"`
	// Timer are the guest's timers.
	// +optional
	Timer *Timer `json:"timer,omitempty"`
}

// ClockOffset is where the guest's RTC starts.
type ClockOffset struct {
	// UTC starts the RTC at UTC, or offsetSeconds from it, at each start of the instance.
	// +optional
	UTC *ClockOffsetUTC `json:"utc,omitempty"`
	// Timezone starts the RTC at the local time of this zone (a tz database name such as
	// Europe/Berlin), as Windows expects.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Timezone *ClockOffsetTimezone `json:"timezone,omitempty"`
}

// ClockOffsetUTC is an RTC that starts at UTC plus an offset.
type ClockOffsetUTC struct {
	// OffsetSeconds is added to UTC, within 100 years either way.
	// +optional
	OffsetSeconds *int `json:"offsetSeconds,omitempty"`
}

// ClockOffsetTimezone is a tz database zone name.
type ClockOffsetTimezone string

// Timer are the guest's timers; a timer left out keeps QEMU's default.
type Timer struct {
	// HPET is the High Precision Event Timer; present: false leaves it out.
	// +optional
	HPET *HPETTimer `json:"hpet,omitempty"`
	// KVM is the paravirtual KVM clock; present: false hides it.
	// +optional
	KVM *KVMTimer `json:"kvm,omitempty"`
	// PIT is the i8254 Programmable Interval Timer; present: false leaves it out.
	// +optional
	PIT *PITTimer `json:"pit,omitempty"`
	// RTC is the real-time clock; it cannot be left out.
	// +optional
	RTC *RTCTimer `json:"rtc,omitempty"`
	// Hyperv is the Hyper-V reference clock (QEMU's hv-time), which synictimer needs. Needs KVM:
	// dropped under emulation, with an event saying so.
	// +optional
	Hyperv *HypervTimer `json:"hyperv,omitempty"`
}

// HPETTickPolicy is what happens to the HPET's ticks QEMU could not deliver in time.
// +kubebuilder:validation:Enum=delay;catchup;merge;discard
type HPETTickPolicy string

// PITTickPolicy is what happens to the PIT's ticks QEMU could not deliver in time.
// +kubebuilder:validation:Enum=delay;catchup;discard
type PITTickPolicy string

// RTCTickPolicy is what happens to the RTC's ticks QEMU could not deliver in time.
// +kubebuilder:validation:Enum=delay;catchup
type RTCTickPolicy string

// RTCTimerTrack is the clock the RTC follows.
// +kubebuilder:validation:Enum=guest;wall
type RTCTimerTrack string

// Tick policies and RTC tracks, as in KubeVirt.
const (
	HPETTickPolicyDelay   HPETTickPolicy = "delay"
	HPETTickPolicyCatchup HPETTickPolicy = "catchup"
	HPETTickPolicyMerge   HPETTickPolicy = "merge"
	HPETTickPolicyDiscard HPETTickPolicy = "discard"

	PITTickPolicyDelay   PITTickPolicy = "delay"
	PITTickPolicyCatchup PITTickPolicy = "catchup"
	PITTickPolicyDiscard PITTickPolicy = "discard"

	RTCTickPolicyDelay   RTCTickPolicy = "delay"
	RTCTickPolicyCatchup RTCTickPolicy = "catchup"

	TrackGuest RTCTimerTrack = "guest"
	TrackWall  RTCTimerTrack = "wall"
)

// RTCTimer is the real-time clock.
type RTCTimer struct {
	// TickPolicy: delay (QEMU's default) or catchup (late ticks delivered faster until the guest
	// caught up, QEMU's driftfix=slew).
	// +optional
	TickPolicy RTCTickPolicy `json:"tickPolicy,omitempty"`
	// Enabled (present) false is accepted with a warning and has no effect, as under KubeVirt
	// (libvirt always gives QEMU its -rtc): the RTC is part of the q35 chipset.
	// +optional
	Enabled *bool `json:"present,omitempty"`
	// Track: guest (the RTC stops while the guest is paused, QEMU's clock=vm) or wall (the
	// host's clock, QEMU's clock=host). QEMU's default when unset.
	// +optional
	Track RTCTimerTrack `json:"track,omitempty"`
}

// HPETTimer is the High Precision Event Timer.
type HPETTimer struct {
	// TickPolicy is accepted with a warning and has no effect, as under KubeVirt (libvirt drops
	// it): QEMU's HPET has no lost-tick policy (a late periodic timer raises one interrupt and
	// skips the periods it missed).
	// +optional
	TickPolicy HPETTickPolicy `json:"tickPolicy,omitempty"`
	// Enabled (present) false leaves the HPET out. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}

// PITTimer is the i8254 Programmable Interval Timer.
type PITTimer struct {
	// TickPolicy: delay, catchup or discard (KVM's in-kernel PIT; under emulation QEMU's PIT has
	// no such policy and the setting does nothing).
	// +optional
	TickPolicy PITTickPolicy `json:"tickPolicy,omitempty"`
	// Enabled (present) false leaves the PIT out. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}

// KVMTimer is the paravirtual KVM clock.
type KVMTimer struct {
	// Enabled (present) false hides the KVM clock from the guest. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}

// HypervTimer is the Hyper-V reference clock.
type HypervTimer struct {
	// Enabled (present) false leaves it out. Defaults to true.
	// +optional
	Enabled *bool `json:"present,omitempty"`
}
