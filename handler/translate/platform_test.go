package translate_test

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/machine"
)

// windowsVMI is validVMI with KubeVirt's Windows platform (its vmi-windows example and common
// templates): Hyper-V enlightenments, the KVM features, and a clock with its timers.
func windowsVMI() *v1alpha1.VirtualMachineInstance {
	v := validVMI()
	d := &v.Spec.Domain
	d.Features = &v1alpha1.Features{
		KVM: &v1alpha1.FeatureKVM{Hidden: true}, Pvspinlock: &v1alpha1.FeatureState{Enabled: ptr.To(false)},
		Hyperv: &v1alpha1.FeatureHyperv{
			Relaxed: &v1alpha1.FeatureState{}, VAPIC: &v1alpha1.FeatureState{}, Spinlocks: &v1alpha1.FeatureSpinlocks{Retries: ptr.To[uint32](8191)},
			SyNICTimer: &v1alpha1.SyNICTimer{Direct: &v1alpha1.FeatureState{}}, Frequencies: &v1alpha1.FeatureState{},
			Reenlightenment: &v1alpha1.FeatureState{}, IPI: &v1alpha1.FeatureState{}, Runtime: &v1alpha1.FeatureState{},
			Reset: &v1alpha1.FeatureState{Enabled: ptr.To(false)}, TLBFlush: &v1alpha1.TLBFlush{Extended: &v1alpha1.FeatureState{}},
			VendorID: &v1alpha1.FeatureVendorID{VendorID: "KVM Hv"}, EVMCS: &v1alpha1.FeatureState{},
		},
	}
	d.Clock = &v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{}}, Timer: &v1alpha1.Timer{
		HPET: &v1alpha1.HPETTimer{Enabled: ptr.To(false)}, PIT: &v1alpha1.PITTimer{TickPolicy: v1alpha1.PITTickPolicyDelay},
		RTC: &v1alpha1.RTCTimer{TickPolicy: v1alpha1.RTCTickPolicyCatchup}, Hyperv: &v1alpha1.HypervTimer{}}}
	return v
}

// TestHyperV: under KVM the enlightenments reach QEMU's flags as libvirt gives them, with the
// features the enabled ones need (vpindex and synic for synictimer, vapic for evmcs) turned on as
// KubeVirt's webhook does; under emulation they are left out and the machine says why.
func TestHyperV(t *testing.T) {
	m, err := translate.Machine(windowsVMI(), translate.Host{NICs: hostNICs})
	if err != nil {
		t.Fatal(err)
	}
	want := &machine.HyperV{Relaxed: true, VAPIC: true, Spinlocks: 8191, VPIndex: true, Runtime: true, SyNIC: true, STimer: true,
		STimerDirect: true, VendorID: "KVM Hv", Frequencies: true, Reenlightenment: true, TLBFlush: true, TLBFlushExt: true,
		IPI: true, EVMCS: true, Time: true}
	if !reflect.DeepEqual(m.CPU.HyperV, want) {
		got, _ := json.Marshal(m.CPU.HyperV)
		exp, _ := json.Marshal(want)
		t.Fatalf("Hyper-V\n%s\nwant\n%s", got, exp)
	}
	if !m.CPU.KVMHidden || m.CPU.PVUnhalt == nil || *m.CPU.PVUnhalt || len(m.Notes) != 0 {
		t.Fatalf("kvm hidden %v, pv unhalt %v, notes %q; want hidden, pv unhalt off, no notes", m.CPU.KVMHidden, m.CPU.PVUnhalt, m.Notes)
	}
	argv := buildArgv(t, m)
	const cpu = "host,kvm=off,kvm-pv-unhalt=off,hv-relaxed=on,hv-vapic=on,hv-spinlocks=0x1fff,hv-vpindex=on,hv-runtime=on,hv-synic=on," +
		"hv-stimer=on,hv-stimer-direct=on,hv-vendor-id=KVM Hv,hv-frequencies=on,hv-reenlightenment=on,hv-tlbflush=on,hv-tlbflush-ext=on," +
		"hv-ipi=on,vmx=on,hv-evmcs=on,hv-time=on"
	if i := slices.Index(argv, "-cpu"); i < 0 || argv[i+1] != cpu {
		t.Fatalf("argv %q\nwant -cpu %s", argv, cpu)
	}

	t.Run("passthrough", func(t *testing.T) {
		v := validVMI()
		v.Spec.Domain.Features = &v1alpha1.Features{HypervPassthrough: &v1alpha1.HyperVPassthrough{}}
		// hv-passthrough includes hv-time.
		v.Spec.Domain.Clock = &v1alpha1.Clock{Timer: &v1alpha1.Timer{Hyperv: &v1alpha1.HypervTimer{}}}
		m, err := translate.Machine(v, translate.Host{NICs: hostNICs})
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.Index(buildArgv(t, m), "-cpu"); buildArgv(t, m)[i+1] != "host,hv-passthrough=on" {
			t.Fatalf("-cpu %s, want host,hv-passthrough=on", buildArgv(t, m)[i+1])
		}
	})
	t.Run("under emulation they are left out, with the reason", func(t *testing.T) {
		m, err := translate.Machine(windowsVMI(), translate.Host{Emulation: true, NICs: hostNICs})
		if err != nil {
			t.Fatal(err)
		}
		if m.CPU.HyperV != nil || !slices.Contains(m.Notes, translate.NoteHypervEmulation) {
			t.Fatalf("Hyper-V %+v, notes %q; want none, and the note saying why", m.CPU.HyperV, m.Notes)
		}
		if i := slices.Index(buildArgv(t, m), "-cpu"); buildArgv(t, m)[i+1] != "qemu64,kvm=off,kvm-pv-unhalt=off" {
			t.Fatalf("-cpu %s", buildArgv(t, m)[i+1])
		}
		// Not sent to the launcher.
		if desc, _ := json.Marshal(m); strings.Contains(string(desc), "emulation") {
			t.Fatalf("the note is in the machine description: %s", desc)
		}
	})
	t.Run("the Hyper-V clock alone is an enlightenment too", func(t *testing.T) {
		v := validVMI()
		v.Spec.Domain.Clock = &v1alpha1.Clock{Timer: &v1alpha1.Timer{Hyperv: &v1alpha1.HypervTimer{}}}
		m, err := translate.Machine(v, translate.Host{NICs: hostNICs})
		if err != nil || !reflect.DeepEqual(m.CPU.HyperV, &machine.HyperV{Time: true}) {
			t.Fatalf("%+v %v", m.CPU.HyperV, err)
		}
		v.Spec.Domain.Clock.Timer.Hyperv.Enabled = ptr.To(false)
		if m, err = translate.Machine(v, translate.Host{NICs: hostNICs}); err != nil || m.CPU.HyperV != nil {
			t.Fatalf("present: false: %+v %v", m.CPU.HyperV, err)
		}
	})
}

// TestClock: domain.clock reaches QEMU as libvirt maps KubeVirt's <clock>.
func TestClock(t *testing.T) {
	cases := []struct {
		name  string
		clock v1alpha1.Clock
		want  machine.Clock
		argv  []string // in order, each once
	}{
		{"utc", v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{}}}, machine.Clock{}, nil},
		{"utc with an offset, the rtc catching up on guest time", v1alpha1.Clock{
			ClockOffset: v1alpha1.ClockOffset{UTC: &v1alpha1.ClockOffsetUTC{OffsetSeconds: ptr.To(-3600)}},
			Timer:       &v1alpha1.Timer{RTC: &v1alpha1.RTCTimer{TickPolicy: v1alpha1.RTCTickPolicyCatchup, Track: v1alpha1.TrackGuest}}},
			machine.Clock{RTCOffsetSeconds: -3600, RTCClock: machine.RTCClockVM, RTCCatchUp: true},
			[]string{"-rtc", "base=2026-01-02T02:04:05,clock=vm,driftfix=slew"}},
		{"a zone without daylight saving time", v1alpha1.Clock{ClockOffset: v1alpha1.ClockOffset{Timezone: ptr.To(v1alpha1.ClockOffsetTimezone("Etc/GMT-3"))}},
			machine.Clock{RTCOffsetSeconds: 3 * 3600}, []string{"-rtc", "base=2026-01-02T06:04:05"}},
		{"the rtc on the wall clock", v1alpha1.Clock{Timer: &v1alpha1.Timer{RTC: &v1alpha1.RTCTimer{Track: v1alpha1.TrackWall, TickPolicy: v1alpha1.RTCTickPolicyDelay}}},
			machine.Clock{RTCClock: machine.RTCClockHost}, []string{"-rtc", "base=utc,clock=host"}},
		{"pit catchup, no hpet", v1alpha1.Clock{Timer: &v1alpha1.Timer{PIT: &v1alpha1.PITTimer{TickPolicy: v1alpha1.PITTickPolicyCatchup},
			HPET: &v1alpha1.HPETTimer{Enabled: ptr.To(false)}}},
			machine.Clock{PITLostTicks: machine.LostTickSlew, NoHPET: true},
			[]string{"-machine", "q35,hpet=off", "-accel", "kvm", "-global", "kvm-pit.lost_tick_policy=slew"}},
		{"pit discard", v1alpha1.Clock{Timer: &v1alpha1.Timer{PIT: &v1alpha1.PITTimer{TickPolicy: v1alpha1.PITTickPolicyDiscard}}},
			machine.Clock{PITLostTicks: machine.LostTickDiscard}, []string{"kvm-pit.lost_tick_policy=discard"}},
		{"no pit, hpet present", v1alpha1.Clock{Timer: &v1alpha1.Timer{PIT: &v1alpha1.PITTimer{Enabled: ptr.To(false)}, HPET: &v1alpha1.HPETTimer{}}},
			machine.Clock{NoPIT: true}, []string{"-machine", "q35,pit=off", "-accel", "kvm"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := validVMI()
			v.Spec.Domain.Clock = &tc.clock
			m, err := translate.Machine(v, translate.Host{NICs: hostNICs})
			if err != nil {
				t.Fatal(err)
			}
			if m.Clock != tc.want {
				t.Fatalf("clock %+v, want %+v", m.Clock, tc.want)
			}
			argv := buildArgv(t, m)
			at := 0
			for _, a := range tc.argv {
				i := slices.Index(argv[at:], a)
				if i < 0 {
					t.Fatalf("argv %q: no %q after position %d", argv, a, at)
				}
				at += i + 1
			}
			if tc.want == (machine.Clock{}) && (slices.Contains(argv, "-rtc") || slices.Contains(argv, "-global")) {
				t.Fatalf("argv %q: QEMU's defaults need no option", argv)
			}
		})
	}
	t.Run("the kvm timer is the kvmclock CPU flag", func(t *testing.T) {
		v := validVMI()
		v.Spec.Domain.Clock = &v1alpha1.Clock{Timer: &v1alpha1.Timer{KVM: &v1alpha1.KVMTimer{Enabled: ptr.To(false)}}}
		m, err := translate.Machine(v, translate.Host{NICs: hostNICs})
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.Index(buildArgv(t, m), "-cpu"); buildArgv(t, m)[i+1] != "host,kvmclock=off" {
			t.Fatalf("-cpu %s, want host,kvmclock=off", buildArgv(t, m)[i+1])
		}
	})
}

// rtcStart is the time buildArgv resolves an offset RTC against: 2026-01-02T03:04:05Z.
var rtcStart = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// buildArgv is the launcher's command line for m, with its images and RTC start resolved as
// HostResolver would (the RTC against rtcStart).
func buildArgv(t *testing.T, m *machine.Machine) []string {
	t.Helper()
	lm := &launcher.Machine{Machine: *m, RunDir: "/run/q", Images: map[string]launcher.DiskImage{}}
	for _, d := range m.Disks {
		lm.Images[d.Name] = launcher.DiskImage{Path: "/images/" + d.Name, Format: "qcow2"}
	}
	if m.Clock.RTCOffsetSeconds != 0 {
		lm.RTCStart = rtcStart.Add(time.Duration(m.Clock.RTCOffsetSeconds) * time.Second)
	}
	argv, err := launcher.BuildArgv(lm)
	if err != nil {
		t.Fatal(err)
	}
	return argv
}
