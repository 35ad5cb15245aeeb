package migration

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

const testUID = "mig-1"

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func runningVMI() *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm1", Namespace: "ns", UID: "vmi-uid"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1536Mi"))},
				Devices: v1alpha1.Devices{Interfaces: []v1alpha1.Interface{
					{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}},
				}},
			},
			Networks: []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}},
		},
		Status: v1alpha1.VirtualMachineInstanceStatus{Phase: v1alpha1.Running, NodeName: "node-a"},
	}
}

func targetPod(phase corev1.PodPhase, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "qvirt-launcher-vm1-tgt"},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: phase},
	}
}

func TestDecidePhase(t *testing.T) {
	withState := func(mut func(ms *v1alpha1.VirtualMachineInstanceMigrationState)) *v1alpha1.VirtualMachineInstance {
		vmi := runningVMI()
		vmi.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{
			MigrationUID: testUID, SourceNode: "node-a", TargetNode: "node-b", TargetPod: "qvirt-launcher-vm1-tgt",
		}
		if mut != nil {
			mut(vmi.Status.MigrationState)
		}
		return vmi
	}
	started := func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.TargetReady = true
		ms.StartTimestamp = &metav1.Time{Time: t0.Add(-10 * time.Minute)}
	}
	bridge := runningVMI()
	bridge.Spec.Domain.Devices.Interfaces[0] = v1alpha1.Interface{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}
	stopped := runningVMI()
	stopped.Status.Phase = v1alpha1.Succeeded
	deleting := targetPod(corev1.PodRunning, "node-b")
	deleting.DeletionTimestamp = &metav1.Time{Time: t0}
	abortAt := t0.Add(-30 * time.Second)
	oldAbortAt := t0.Add(-5 * time.Minute)
	handedOver := func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		started(ms)
		ms.SourceHandedOver = true
	}
	ended := targetPod(corev1.PodFailed, "node-b")

	cases := []struct {
		name       string
		in         phaseInput
		wantPhase  v1alpha1.VirtualMachineInstanceMigrationPhase
		wantReason string
		wantAction action
	}{
		{name: "new and admitted creates the target pod",
			in:        phaseInput{Phase: "", VMI: runningVMI()},
			wantPhase: v1alpha1.MigrationPending, wantReason: ReasonAdmitted, wantAction: actCreateTargetPod},
		{name: "held back by the limits",
			in:        phaseInput{Phase: v1alpha1.MigrationPending, VMI: runningVMI(), Limit: &limitHold{Reason: ReasonNodeLimitReached}},
			wantPhase: v1alpha1.MigrationPending, wantReason: ReasonNodeLimitReached},
		{name: "instance missing",
			in:        phaseInput{Phase: v1alpha1.MigrationPending},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonVMINotFound, wantAction: actFail},
		{name: "instance not running",
			in:        phaseInput{Phase: v1alpha1.MigrationPending, VMI: stopped},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonVMINotRunning, wantAction: actFail},
		{name: "not live-migratable",
			in:        phaseInput{Phase: v1alpha1.MigrationPending, VMI: bridge},
			wantPhase: v1alpha1.MigrationFailed, wantReason: v1alpha1.InterfaceNotLiveMigratableReason, wantAction: actFail},
		{name: "another migration goes first, even under the limits",
			in:        phaseInput{Phase: v1alpha1.MigrationPending, VMI: runningVMI(), InProgress: "other", Limit: &limitHold{Reason: ReasonClusterLimitReached}},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonMigrationInProgress, wantAction: actFail},
		{name: "pending with a target pod from a lost status write",
			in:        phaseInput{Phase: v1alpha1.MigrationPending, VMI: runningVMI(), TargetPod: targetPod(corev1.PodPending, "")},
			wantPhase: v1alpha1.MigrationScheduling},
		{name: "target pod not yet bound",
			in:        phaseInput{Phase: v1alpha1.MigrationScheduling, VMI: runningVMI(), TargetPod: targetPod(corev1.PodPending, "")},
			wantPhase: v1alpha1.MigrationScheduling},
		{name: "target pod bound but not running",
			in:        phaseInput{Phase: v1alpha1.MigrationScheduling, VMI: runningVMI(), TargetPod: targetPod(corev1.PodPending, "node-b")},
			wantPhase: v1alpha1.MigrationScheduling},
		{name: "target pod runs: hand over to the node agents",
			in:        phaseInput{Phase: v1alpha1.MigrationScheduling, VMI: runningVMI(), TargetPod: targetPod(corev1.PodRunning, "node-b")},
			wantPhase: v1alpha1.MigrationScheduled, wantAction: actStartMigration},
		{name: "target pod failed",
			in:        phaseInput{Phase: v1alpha1.MigrationScheduled, VMI: runningVMI(), TargetPod: targetPod(corev1.PodFailed, "node-b")},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonTargetPodFailed, wantAction: actFail},
		{name: "target pod gone",
			in:        phaseInput{Phase: v1alpha1.MigrationPreparingTarget, VMI: withState(nil)},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonTargetPodDeleted, wantAction: actFail},
		{name: "target pod being deleted",
			in:        phaseInput{Phase: v1alpha1.MigrationScheduling, VMI: runningVMI(), TargetPod: deleting},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonTargetPodDeleted, wantAction: actFail},
		{name: "state written",
			in:        phaseInput{Phase: v1alpha1.MigrationScheduled, UID: testUID, VMI: withState(nil), TargetPod: targetPod(corev1.PodRunning, "node-b")},
			wantPhase: v1alpha1.MigrationPreparingTarget},
		{name: "stale instance in the cache keeps the phase",
			in:        phaseInput{Phase: v1alpha1.MigrationPreparingTarget, UID: testUID, VMI: runningVMI(), TargetPod: targetPod(corev1.PodRunning, "node-b")},
			wantPhase: v1alpha1.MigrationPreparingTarget},
		{name: "instance status lost the state for good",
			in: phaseInput{Phase: v1alpha1.MigrationTargetReady, UID: testUID, VMI: runningVMI(), TargetPod: targetPod(corev1.PodRunning, "node-b"),
				Now: t0, AbortGrace: time.Minute, PhaseSince: t0.Add(-2 * time.Minute)},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonMigrationStateLost, wantAction: actFail},
		{name: "target ready",
			in: phaseInput{Phase: v1alpha1.MigrationPreparingTarget, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.TargetReady = true })},
			wantPhase: v1alpha1.MigrationTargetReady},
		{name: "running",
			in: phaseInput{Phase: v1alpha1.MigrationTargetReady, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(started), Now: t0, CompletionTimeout: time.Hour},
			wantPhase: v1alpha1.MigrationRunning},
		{name: "completed",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { started(ms); ms.Completed = true })},
			wantPhase: v1alpha1.MigrationSucceeded, wantReason: ReasonMigrationSucceeded, wantAction: actSucceed},
		{name: "completed is seen even when the cache skipped the earlier steps",
			in: phaseInput{Phase: v1alpha1.MigrationPreparingTarget, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { started(ms); ms.Completed = true })},
			wantPhase: v1alpha1.MigrationSucceeded, wantReason: ReasonMigrationSucceeded, wantAction: actSucceed},
		{name: "failed by the node agent",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { started(ms); ms.Failed = true })},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonMigrationFailed, wantAction: actFail},
		{name: "another migration's state is not ours",
			in: phaseInput{Phase: v1alpha1.MigrationScheduling, UID: "other", TargetPod: targetPod(corev1.PodPending, ""),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.Completed = true })},
			wantPhase: v1alpha1.MigrationScheduling},
		{name: "timed out: ask for an abort",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(started), Now: t0, CompletionTimeout: time.Minute, AbortGrace: time.Minute},
			wantPhase: v1alpha1.MigrationRunning, wantReason: ReasonCompletionTimeout, wantAction: actAbort},
		{name: "timed out, abort asked, within the grace",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(started), Now: t0, CompletionTimeout: time.Minute, AbortGrace: time.Minute, AbortRequestedAt: &abortAt},
			wantPhase: v1alpha1.MigrationRunning},
		{name: "timed out, abort confirmed",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
					started(ms)
					ms.AbortRequested, ms.Failed = true, true
				}), Now: t0, CompletionTimeout: time.Minute, AbortGrace: time.Minute, AbortRequestedAt: &abortAt},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonCompletionTimeout, wantAction: actFail},
		{name: "timed out, abort never confirmed",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(started), Now: t0, CompletionTimeout: time.Minute, AbortGrace: time.Minute, AbortRequestedAt: &oldAbortAt},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonCompletionTimeout, wantAction: actFail},
		// Once the source handed the guest over, only the target's node agent decides, unless no
		// target launcher can run the guest any more.
		{name: "handed over: a timeout is too late to abort",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(handedOver), Now: t0, CompletionTimeout: time.Minute, AbortGrace: time.Minute},
			wantPhase: v1alpha1.MigrationRunning},
		{name: "handed over: an abort never confirmed does not fail it",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(handedOver), Now: t0, CompletionTimeout: time.Minute, AbortGrace: time.Minute, AbortRequestedAt: &oldAbortAt},
			wantPhase: v1alpha1.MigrationRunning},
		{name: "handed over: a target pod being deleted is left to its node agent",
			in:        phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: deleting, VMI: withState(handedOver)},
			wantPhase: v1alpha1.MigrationRunning},
		{name: "handed over: the target pod ended",
			in:        phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: ended, VMI: withState(handedOver)},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonTargetPodFailed, wantAction: actFail},
		{name: "handed over: the target pod is gone",
			in:        phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, VMI: withState(handedOver)},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonTargetPodDeleted, wantAction: actFail},
		{name: "handed over and completed by the target's agent",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { handedOver(ms); ms.Completed = true })},
			wantPhase: v1alpha1.MigrationSucceeded, wantReason: ReasonMigrationSucceeded, wantAction: actSucceed},
		{name: "handed over and failed by the target's agent",
			in: phaseInput{Phase: v1alpha1.MigrationRunning, UID: testUID, TargetPod: targetPod(corev1.PodRunning, "node-b"),
				VMI: withState(func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { handedOver(ms); ms.Failed = true })},
			wantPhase: v1alpha1.MigrationFailed, wantReason: ReasonMigrationFailed, wantAction: actFail},
		{name: "terminal stays terminal",
			in:        phaseInput{Phase: v1alpha1.MigrationSucceeded},
			wantPhase: v1alpha1.MigrationSucceeded},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.in.UID == "" {
				tc.in.UID = testUID
			}
			got := decidePhase(tc.in)
			if got.Phase != tc.wantPhase || got.Reason != tc.wantReason || got.Action != tc.wantAction {
				t.Errorf("decidePhase = {%s %q action %d} (%s), want {%s %q action %d}",
					got.Phase, got.Reason, got.Action, got.Message, tc.wantPhase, tc.wantReason, tc.wantAction)
			}
		})
	}
}

func TestCompletionTimeout(t *testing.T) {
	spec := func(guest, request string) *v1alpha1.VirtualMachineInstanceSpec {
		s := &v1alpha1.VirtualMachineInstanceSpec{}
		if guest != "" {
			s.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse(guest))}
		}
		if request != "" {
			s.Domain.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(request)}
		}
		return s
	}
	cases := []struct {
		name   string
		spec   *v1alpha1.VirtualMachineInstanceSpec
		perGiB int64
		want   time.Duration
	}{
		{"no limit", spec("4Gi", ""), 0, 0},
		{"small guest counts one GiB", spec("256Mi", ""), 150, 150 * time.Second},
		{"started GiB count", spec("1536Mi", ""), 150, 300 * time.Second},
		{"guest memory wins over the request", spec("2Gi", "8Gi"), 10, 20 * time.Second},
		{"request when no guest memory", spec("", "3Gi"), 10, 30 * time.Second},
		{"nothing known", spec("", ""), 10, 10 * time.Second},
	}
	for _, tc := range cases {
		if got := v1alpha1.CompletionTimeout(tc.spec, tc.perGiB); got != tc.want {
			t.Errorf("%s: completionTimeout = %s, want %s", tc.name, got, tc.want)
		}
	}
}
