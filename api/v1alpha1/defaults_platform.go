package v1alpha1

import "k8s.io/apimachinery/pkg/util/validation/field"

// DefaultSpinlockRetries is the Hyper-V spinlock retry count when spinlocks sets none, KubeVirt's
// documented default.
const DefaultSpinlockRetries uint32 = 4096

// fillHypervDefaults is KubeVirt's defaulting of the Hyper-V and KVM features: every present
// feature state is enabled unless set (SetDefaults_FeatureState, which KubeVirt's generated
// defaulter applies to each of them), spinlocks retry 4096 times unless set, then the features
// an enabled feature needs are turned on when the spec leaves them unset (the mutating webhook's
// SetHypervFeatureDependencies; one the spec disables is refused by validateHypervDependencies).
func fillHypervDefaults(f *Features) {
	defaultFeature(f.Pvspinlock)
	if hp := f.HypervPassthrough; hp != nil {
		// KubeVirt reads this pointer unchecked; a present {} means on, as for a feature state.
		hp.Enabled = trueUnlessSet(hp.Enabled)
	}
	h := f.Hyperv
	if h == nil {
		return
	}
	for _, fs := range []*FeatureState{h.Relaxed, h.VAPIC, h.VPIndex, h.Runtime, h.SyNIC, h.Reset,
		h.Frequencies, h.Reenlightenment, h.IPI, h.EVMCS} {
		defaultFeature(fs)
	}
	if s := h.Spinlocks; s != nil {
		s.Enabled = trueUnlessSet(s.Enabled)
		if s.Retries == nil {
			r := DefaultSpinlockRetries
			s.Retries = &r
		}
	}
	if v := h.VendorID; v != nil {
		v.Enabled = trueUnlessSet(v.Enabled)
	}
	if t := h.SyNICTimer; t != nil {
		t.Enabled = trueUnlessSet(t.Enabled)
		defaultFeature(t.Direct)
	}
	if t := h.TLBFlush; t != nil {
		t.Enabled = trueUnlessSet(t.Enabled)
		defaultFeature(t.Direct)
		defaultFeature(t.Extended)
	}
	setHypervDependencies(h)
}

// setHypervDependencies turns on, for each enabled feature, the features it needs that h leaves
// unset (KubeVirt's SetHypervFeatureDependencies).
func setHypervDependencies(h *FeatureHyperv) {
	for _, d := range hypervDependencies(h, nil) {
		if d.on() && d.requires.unset() {
			d.requires.enable()
		}
	}
}

// hypervFeature is one Hyper-V feature of a spec: its enabled flag (through the feature's own
// pointer, so that it can be created), and its field.
type hypervFeature struct {
	state **FeatureState // for features that are a FeatureState
	flag  func() **bool  // for the others (synictimer, tlbflush): their enabled flag, when present
	path  *field.Path
}

func (f hypervFeature) enabled() *bool {
	if f.state != nil {
		if *f.state == nil {
			return nil
		}
		return (*f.state).Enabled
	}
	if b := f.flag(); b != nil {
		return *b
	}
	return nil
}

func (f hypervFeature) present() bool {
	if f.state != nil {
		return *f.state != nil
	}
	return f.flag() != nil
}

// on: present and not disabled (an unset enabled flag means on).
func (f hypervFeature) on() bool { e := f.enabled(); return f.present() && (e == nil || *e) }

// off: present and disabled.
func (f hypervFeature) off() bool { e := f.enabled(); return f.present() && e != nil && !*e }

// unset: absent, or present with no enabled flag.
func (f hypervFeature) unset() bool { return f.enabled() == nil }

// enable turns a FeatureState feature on; the required features are all FeatureStates.
func (f hypervFeature) enable() {
	t := true
	if *f.state == nil {
		*f.state = &FeatureState{}
	}
	(*f.state).Enabled = &t
}

// hypervDependency: feature needs requires.
type hypervDependency struct {
	hypervFeature
	requires hypervFeature
}

// hypervDependencies are KubeVirt's (pkg/virt-api/webhooks/hyperv.go), leaves first so that
// turning on a requirement turns on its own: evmcs needs vapic; ipi, tlbflush and synic need
// vpindex; synictimer needs synic. QEMU's tlbflush direct needs vapic too (its
// docs/system/i386/hyperv.rst), which KubeVirt leaves to QEMU to refuse. p is the hyperv field's
// path (nil when only the states matter).
func hypervDependencies(h *FeatureHyperv, p *field.Path) []hypervDependency {
	vpindex := hypervFeature{state: &h.VPIndex, path: p.Child("vpindex")}
	vapic := hypervFeature{state: &h.VAPIC, path: p.Child("vapic")}
	synic := hypervFeature{state: &h.SyNIC, path: p.Child("synic")}
	tlbflush := hypervFeature{path: p.Child("tlbflush"), flag: func() **bool {
		if h.TLBFlush == nil {
			return nil
		}
		return &h.TLBFlush.Enabled
	}}
	var tlbDirect **FeatureState
	if h.TLBFlush != nil {
		tlbDirect = &h.TLBFlush.Direct
	} else {
		var none *FeatureState
		tlbDirect = &none
	}
	synictimer := hypervFeature{path: p.Child("synictimer"), flag: func() **bool {
		if h.SyNICTimer == nil {
			return nil
		}
		return &h.SyNICTimer.Enabled
	}}
	return []hypervDependency{
		{hypervFeature{state: &h.EVMCS, path: p.Child("evmcs")}, vapic},
		{hypervFeature{state: tlbDirect, path: p.Child("tlbflush", "direct")}, vapic},
		{hypervFeature{state: &h.IPI, path: p.Child("ipi")}, vpindex},
		{tlbflush, vpindex},
		{synictimer, synic},
		{synic, vpindex},
	}
}
