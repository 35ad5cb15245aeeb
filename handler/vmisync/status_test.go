package vmisync

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

func TestApplyLauncherStatus(t *testing.T) {
	now := metav1.NewTime(time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC))
	pod := &corev1.Pod{
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", Image: "qvirt-launcher:v1"}}},
		Status: corev1.PodStatus{PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}}},
	}
	running := protocol.Status{Phase: protocol.PhaseRunning, RunState: "running", QEMUVersion: "7.2.15",
		NICs:  []protocol.NICStatus{{Name: "default", MAC: "02:00:00:00:00:01"}},
		Disks: []protocol.DiskStatus{{Name: "root"}}}
	paused := running
	paused.Paused, paused.RunState = true, "paused"
	ioError := paused
	ioError.RunState = "io-error"
	startedPaused := paused
	startedPaused.RunState = "prelaunch"
	shutdown := protocol.Status{Phase: protocol.PhaseSucceeded, Exit: &protocol.Exit{Reason: protocol.ExitGuestShutdown}}
	crashed := protocol.Status{Phase: protocol.PhaseFailed, Exit: &protocol.Exit{Reason: protocol.ExitCrashed, Detail: "signal 11"}}
	starting := protocol.Status{Phase: protocol.PhaseStarting}

	cases := map[string]struct {
		st                     protocol.Status
		phase                  v1alpha1.VirtualMachineInstancePhase
		reason                 string
		ready                  metav1.ConditionStatus
		pausedReason, endEvent string
		startPaused            bool
	}{
		"running is Ready":         {st: running, phase: v1alpha1.Running, ready: metav1.ConditionTrue},
		"paused is not Ready":      {st: paused, phase: v1alpha1.Running, ready: metav1.ConditionFalse, pausedReason: ReasonPausedByUser},
		"an I/O error pauses":      {st: ioError, phase: v1alpha1.Running, ready: metav1.ConditionFalse, pausedReason: ReasonPausedIOError},
		"started paused":           {st: startedPaused, startPaused: true, phase: v1alpha1.Running, ready: metav1.ConditionFalse, pausedReason: ReasonPausedStartStrategy},
		"reset while stopped":      {st: startedPaused, phase: v1alpha1.Running, ready: metav1.ConditionFalse, pausedReason: "PausedPrelaunch"},
		"starting keeps the phase": {st: starting, phase: v1alpha1.Scheduled, ready: metav1.ConditionFalse},
		"a clean poweroff":         {st: shutdown, phase: v1alpha1.Succeeded, reason: "GuestShutdown", ready: metav1.ConditionFalse, endEvent: "The guest ended: guest shutdown"},
		"a crash":                  {st: crashed, phase: v1alpha1.Failed, reason: "QEMUCrashed", ready: metav1.ConditionFalse, endEvent: "The guest ended: crashed: signal 11"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := &v1alpha1.VirtualMachineInstance{}
			v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
			v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}}
			v.Status.Phase = v1alpha1.Scheduled
			if tc.startPaused {
				v.Spec.StartStrategy = ptr.To(v1alpha1.StartStrategyPaused)
			}
			ended := applyLauncherStatus(v, pod, &tc.st, nil, now)
			if v.Status.Phase != tc.phase || v.Status.Reason != tc.reason || ended != tc.endEvent {
				t.Errorf("phase %s reason %q event %q, want %s %q %q", v.Status.Phase, v.Status.Reason, ended, tc.phase, tc.reason, tc.endEvent)
			}
			if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceReady); c == nil || c.Status != tc.ready {
				t.Errorf("Ready %+v, want %s", c, tc.ready)
			}
			c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstancePaused)
			if got := ""; c != nil {
				got = c.Reason
				if got != tc.pausedReason {
					t.Errorf("Paused reason %q, want %q", got, tc.pausedReason)
				}
			} else if tc.pausedReason != "" {
				t.Errorf("no Paused condition, want reason %q", tc.pausedReason)
			}
			if tc.st.Phase == protocol.PhaseRunning {
				want := v1alpha1.VirtualMachineInstanceNetworkInterface{Name: "default", MAC: "02:00:00:00:00:01", IP: "10.0.0.7", IPs: []string{"10.0.0.7"}}
				if len(v.Status.Interfaces) != 1 || v.Status.Interfaces[0].IP != want.IP || v.Status.Interfaces[0].MAC != want.MAC {
					t.Errorf("interfaces %+v, want %+v", v.Status.Interfaces, want)
				}
				if v.Status.QEMUVersion != "7.2.15" || v.Status.LauncherContainerImageVersion != "qvirt-launcher:v1" {
					t.Errorf("versions %q %q", v.Status.QEMUVersion, v.Status.LauncherContainerImageVersion)
				}
			}
		})
	}
}

func TestVolumes(t *testing.T) {
	v := &v1alpha1.VirtualMachineInstance{}
	v.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root"}, {Name: "hot"}, {Name: "new"}, {Name: "bad"}}
	st := &protocol.Status{Phase: protocol.PhaseRunning,
		Disks:      []protocol.DiskStatus{{Name: "root"}, {Name: "hot", Hotplugged: true}, {Name: "gone", Hotplugged: true}},
		Hotplugged: []machine.Disk{{Name: "hot", Port: "hotplug1"}, {Name: "gone", Port: "hotplug0"}}}
	got := volumes(v, st, hotplugFailures{"bad": "attach volume \"bad\": no such file"})
	want := []v1alpha1.VolumeStatus{
		{Name: "root", Phase: v1alpha1.VolumeReady},
		{Name: "hot", Phase: v1alpha1.VolumeReady, Hotplugged: true, Target: "hotplug1"},
		{Name: "new", Phase: v1alpha1.VolumePending, Hotplugged: true},
		{Name: "bad", Phase: v1alpha1.VolumeFailed, Hotplugged: true, Reason: ReasonHotplugFailed, Message: "attach volume \"bad\": no such file"},
		{Name: "gone", Phase: v1alpha1.VolumeDetached, Hotplugged: true},
	}
	if len(got) != len(want) {
		t.Fatalf("volumes %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("volume %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestReadinessProbeGatesReady: with a readiness probe, a running guest is Ready only while its
// launcher pod is (the kubelet runs the probe), and the reason and message say which probe holds
// it back; without one the pod's readiness does not matter.
func TestReadinessProbeGatesReady(t *testing.T) {
	now := metav1.Now()
	running := protocol.Status{Phase: protocol.PhaseRunning, RunState: "running"}
	podReady := func(s corev1.ConditionStatus) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "qvirt-launcher-web-x"}}
		if s != "" {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: s, Reason: "ContainersNotReady",
				Message: "containers with unready status: [compute]"}}
		}
		return p
	}
	probe := &v1alpha1.Probe{Handler: v1alpha1.Handler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(81)}}}
	cases := map[string]struct {
		probe      *v1alpha1.Probe
		pod        *corev1.Pod
		ready      metav1.ConditionStatus
		reason     string
		msgContain string
	}{
		"no probe, pod not ready": {pod: podReady(corev1.ConditionFalse), ready: metav1.ConditionTrue, reason: ReasonGuestRunning},
		"probe passed":            {probe: probe, pod: podReady(corev1.ConditionTrue), ready: metav1.ConditionTrue, reason: ReasonGuestRunning},
		"probe failing":           {probe: probe, pod: podReady(corev1.ConditionFalse), ready: metav1.ConditionFalse, reason: ReasonReadinessProbeFailed, msgContain: "spec.readinessProbe (tcpSocket port 81) has not passed (containers with unready status: [compute])"},
		"pod without a Ready yet": {probe: probe, pod: podReady(""), ready: metav1.ConditionFalse, reason: ReasonReadinessProbeFailed, msgContain: "tcpSocket port 81"},
		"no pod":                  {probe: probe, ready: metav1.ConditionFalse, reason: ReasonReadinessProbeFailed, msgContain: "no launcher pod"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := &v1alpha1.VirtualMachineInstance{}
			v.Spec.ReadinessProbe = tc.probe
			setGuestConditions(v, tc.pod, &running, false, now)
			c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
			if c == nil || c.Status != tc.ready || c.Reason != tc.reason || !strings.Contains(c.Message, tc.msgContain) {
				t.Errorf("Ready = %+v, want %s %s with a message containing %q", c, tc.ready, tc.reason, tc.msgContain)
			}
		})
	}
}

// TestLivenessKillFailsTheInstance: a guest the launcher powered off because it was told to stop
// (SIGTERM) while its pod stays, which is how the kubelet stops a compute container whose
// liveness probe failed, fails the instance with a reason naming the probe (so that
// RerunOnFailure restarts it), not Succeeded with GuestShutdown; a pod deletion's stop and a
// guest's own poweroff stay as they were.
func TestLivenessKillFailsTheInstance(t *testing.T) {
	now := metav1.Now()
	live := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(81)}}}
	pod := func(probe *corev1.Probe, deleted bool) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "compute", LivenessProbe: probe}}}}
		if deleted {
			p.DeletionTimestamp = &now
		}
		return p
	}
	ended := protocol.Status{Phase: protocol.PhaseSucceeded, Exit: &protocol.Exit{Reason: protocol.ExitGuestShutdown}}
	terminated := ended
	terminated.Terminated = true
	killed := protocol.Status{Phase: protocol.PhaseFailed, Terminated: true, Exit: &protocol.Exit{Reason: protocol.ExitKilled, Detail: "signal killed"}}
	cases := map[string]struct {
		pod        *corev1.Pod
		st         protocol.Status
		phase      v1alpha1.VirtualMachineInstancePhase
		reason     string
		msgContain string
	}{
		"liveness probe failed": {pod(live, false), terminated, v1alpha1.Failed, ReasonLivenessProbeFailed,
			"spec.livenessProbe failed. The guest ended: guest shutdown"},
		"liveness probe failed, QEMU killed after the grace period": {pod(live, false), killed, v1alpha1.Failed, ReasonLivenessProbeFailed,
			"spec.livenessProbe failed. The guest ended: killed: signal killed"},
		"stopped without a liveness probe": {pod(nil, false), terminated, v1alpha1.Failed, ReasonLauncherTerminated, "told to stop (SIGTERM)"},
		"pod deleted":                      {pod(live, true), terminated, v1alpha1.Succeeded, "GuestShutdown", "The guest ended: guest shutdown"},
		"the guest powered off itself":     {pod(live, false), ended, v1alpha1.Succeeded, "GuestShutdown", "The guest ended: guest shutdown"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := &v1alpha1.VirtualMachineInstance{}
			v.Status.Phase = v1alpha1.Running
			msg := applyLauncherStatus(v, tc.pod, &tc.st, nil, now)
			if v.Status.Phase != tc.phase || v.Status.Reason != tc.reason || !strings.Contains(msg, tc.msgContain) {
				t.Errorf("phase %s reason %q event %q, want %s %q with %q", v.Status.Phase, v.Status.Reason, msg, tc.phase, tc.reason, tc.msgContain)
			}
		})
	}
}
