package vm

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func testVMI(phase v1alpha1.VirtualMachineInstancePhase, mods ...func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", UID: "uid-1", CreationTimestamp: metav1.NewTime(t0.Add(-time.Hour))},
		Status:     v1alpha1.VirtualMachineInstanceStatus{Phase: phase},
	}
	for _, m := range mods {
		m(vmi)
	}
	return vmi
}

func deleting(vmi *v1alpha1.VirtualMachineInstance) {
	vmi.DeletionTimestamp = &metav1.Time{Time: t0}
}

var (
	start     = v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}
	stop      = v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest}
	stopUID1  = v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: ptr.To(types.UID("uid-1"))}
	stopOther = v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: ptr.To(types.UID("uid-0"))}
)

func reqs(r ...v1alpha1.VirtualMachineStateChangeRequest) []v1alpha1.VirtualMachineStateChangeRequest {
	return r
}

func TestDecide(t *testing.T) {
	const (
		always = v1alpha1.RunStrategyAlways
		rerun  = v1alpha1.RunStrategyRerunOnFailure
		once   = v1alpha1.RunStrategyOnce
		manual = v1alpha1.RunStrategyManual
		halted = v1alpha1.RunStrategyHalted
	)
	backingOff := &v1alpha1.VirtualMachineStartFailure{ConsecutiveFailCount: 2, RetryAfterTimestamp: &metav1.Time{Time: t0.Add(20 * time.Second)}}
	expired := &v1alpha1.VirtualMachineStartFailure{ConsecutiveFailCount: 2, RetryAfterTimestamp: &metav1.Time{Time: t0.Add(-time.Second)}}

	type want struct {
		action      Action
		reason      string
		requests    int
		held        bool
		entered     v1alpha1.RunStrategy
		backingOff  bool
		warningNote bool
	}
	cases := []struct {
		name string
		in   decisionInput
		want want
	}{
		// Always
		{"always: no VMI creates", decisionInput{Strategy: always},
			want{action: ActionCreate, reason: ReasonRunStrategyStart, entered: always}},
		{"always: running keeps", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Running)},
			want{action: ActionNone, reason: ReasonInSync, entered: always}},
		{"always: guest shutdown deletes to recreate", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Succeeded)},
			want{action: ActionDelete, reason: ReasonVMIEnded, entered: always}},
		{"always: crash deletes to recreate", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Failed)},
			want{action: ActionDelete, reason: ReasonVMIEnded, entered: always}},
		{"always: deleting VMI waits", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Succeeded, deleting)},
			want{action: ActionNone, reason: ReasonInSync, entered: always}},
		{"always: back-off delays the create", decisionInput{Strategy: always, Entered: always, StartFailure: backingOff, Now: t0},
			want{action: ActionNone, reason: ReasonCrashLoopBackOff, entered: always, backingOff: true}},
		{"always: expired back-off creates", decisionInput{Strategy: always, Entered: always, StartFailure: expired, Now: t0},
			want{action: ActionCreate, reason: ReasonRunStrategyStart, entered: always}},
		{"always: stop deletes and holds", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Running), Requests: reqs(stop)},
			want{action: ActionDelete, reason: ReasonStopRequested, held: true, entered: always}},
		{"always: held stays down", decisionInput{Strategy: always, Entered: always, Held: true},
			want{action: ActionNone, reason: ReasonStoppedByRequest, held: true, entered: always}},
		{"always: start releases the hold", decisionInput{Strategy: always, Entered: always, Held: true, Requests: reqs(start)},
			want{action: ActionCreate, reason: ReasonStartRequested, entered: always}},
		{"always: a new strategy drops an old hold", decisionInput{Strategy: always, Entered: halted, Held: true},
			want{action: ActionCreate, reason: ReasonRunStrategyStart, entered: always}},
		{"always: start while running is consumed", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Running), Requests: reqs(start)},
			want{action: ActionNone, reason: ReasonInSync, entered: always}},
		{"always: restart deletes first", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Running), Requests: reqs(stopUID1, start)},
			want{action: ActionDelete, reason: ReasonStopRequested, requests: 1, held: true, entered: always}},
		{"always: restart waits for the old VMI", decisionInput{Strategy: always, Entered: always, Held: true, VMI: testVMI(v1alpha1.Running, deleting), Requests: reqs(start)},
			want{action: ActionNone, reason: ReasonWaitingForDeletion, requests: 1, entered: always}},
		{"always: restart creates once gone", decisionInput{Strategy: always, Entered: always, Held: true, Requests: reqs(start)},
			want{action: ActionCreate, reason: ReasonStartRequested, entered: always}},
		{"always: stale stop is dropped", decisionInput{Strategy: always, Entered: always, VMI: testVMI(v1alpha1.Running), Requests: reqs(stopOther)},
			want{action: ActionNone, reason: ReasonInSync, entered: always}},
		{"always: start waits for back-off and stays queued", decisionInput{Strategy: always, Entered: always, Held: true, Requests: reqs(start), StartFailure: backingOff, Now: t0},
			want{action: ActionNone, reason: ReasonCrashLoopBackOff, requests: 1, entered: always, backingOff: true}},

		// RerunOnFailure
		{"rerun: first start", decisionInput{Strategy: rerun, Entered: halted},
			want{action: ActionCreate, reason: ReasonRunStrategyStart, entered: rerun}},
		{"rerun: no VMI after entry stays down", decisionInput{Strategy: rerun, Entered: rerun},
			want{action: ActionNone, reason: ReasonInSync, entered: rerun}},
		{"rerun: guest shutdown stays down", decisionInput{Strategy: rerun, Entered: rerun, VMI: testVMI(v1alpha1.Succeeded)},
			want{action: ActionNone, reason: ReasonInSync, entered: rerun}},
		{"rerun: crash queues a start", decisionInput{Strategy: rerun, Entered: rerun, VMI: testVMI(v1alpha1.Failed)},
			want{action: ActionNone, reason: ReasonVMIFailed, requests: 1, entered: rerun}},
		{"rerun: queued start deletes the failed VMI", decisionInput{Strategy: rerun, Entered: rerun, VMI: testVMI(v1alpha1.Failed), Requests: reqs(start)},
			want{action: ActionDelete, reason: ReasonStartRequested, requests: 1, entered: rerun}},
		{"rerun: start after shutdown deletes the old VMI", decisionInput{Strategy: rerun, Entered: rerun, VMI: testVMI(v1alpha1.Succeeded), Requests: reqs(start)},
			want{action: ActionDelete, reason: ReasonStartRequested, requests: 1, entered: rerun}},
		{"rerun: stop deletes, no hold needed", decisionInput{Strategy: rerun, Entered: rerun, VMI: testVMI(v1alpha1.Running), Requests: reqs(stopUID1)},
			want{action: ActionDelete, reason: ReasonStopRequested, entered: rerun}},
		{"rerun: entering with an ended VMI replaces it", decisionInput{Strategy: rerun, Entered: manual, VMI: testVMI(v1alpha1.Succeeded)},
			want{action: ActionDelete, reason: ReasonRunStrategyStart, entered: manual}},
		{"rerun: entering waits for a deleting VMI", decisionInput{Strategy: rerun, Entered: halted, VMI: testVMI(v1alpha1.Running, deleting)},
			want{action: ActionNone, reason: ReasonWaitingForDeletion, entered: halted}},
		{"rerun: entering with a running VMI", decisionInput{Strategy: rerun, Entered: always, VMI: testVMI(v1alpha1.Running)},
			want{action: ActionNone, reason: ReasonInSync, entered: rerun}},
		{"rerun: first start waits for back-off", decisionInput{Strategy: rerun, Entered: manual, StartFailure: backingOff, Now: t0},
			want{action: ActionNone, reason: ReasonCrashLoopBackOff, entered: manual, backingOff: true}},

		// Once
		{"once: first start", decisionInput{Strategy: once},
			want{action: ActionCreate, reason: ReasonRunStrategyStart, entered: once}},
		{"once: guest shutdown stays", decisionInput{Strategy: once, Entered: once, VMI: testVMI(v1alpha1.Succeeded)},
			want{action: ActionNone, reason: ReasonInSync, entered: once}},
		{"once: crash stays", decisionInput{Strategy: once, Entered: once, VMI: testVMI(v1alpha1.Failed)},
			want{action: ActionNone, reason: ReasonInSync, entered: once}},
		{"once: gone stays gone", decisionInput{Strategy: once, Entered: once},
			want{action: ActionNone, reason: ReasonInSync, entered: once}},
		{"once: start request starts again", decisionInput{Strategy: once, Entered: once, Requests: reqs(start)},
			want{action: ActionCreate, reason: ReasonStartRequested, entered: once}},
		{"once: stop during entry counts as entered", decisionInput{Strategy: once, Entered: halted, VMI: testVMI(v1alpha1.Succeeded), Requests: reqs(stop)},
			want{action: ActionDelete, reason: ReasonStopRequested, entered: once}},

		// Manual
		{"manual: nothing without requests", decisionInput{Strategy: manual, Entered: manual},
			want{action: ActionNone, reason: ReasonInSync, entered: manual}},
		{"manual: guest shutdown stays", decisionInput{Strategy: manual, Entered: manual, VMI: testVMI(v1alpha1.Succeeded)},
			want{action: ActionNone, reason: ReasonInSync, entered: manual}},
		{"manual: crash stays", decisionInput{Strategy: manual, Entered: manual, VMI: testVMI(v1alpha1.Failed)},
			want{action: ActionNone, reason: ReasonInSync, entered: manual}},
		{"manual: start creates", decisionInput{Strategy: manual, Entered: manual, Requests: reqs(start)},
			want{action: ActionCreate, reason: ReasonStartRequested, entered: manual}},
		{"manual: stop deletes", decisionInput{Strategy: manual, Entered: manual, VMI: testVMI(v1alpha1.Running), Requests: reqs(stop)},
			want{action: ActionDelete, reason: ReasonStopRequested, entered: manual}},
		{"always: stop for a VMI already gone holds", decisionInput{Strategy: always, Entered: always, Requests: reqs(stopUID1)},
			want{action: ActionNone, reason: ReasonStoppedByRequest, held: true, entered: always}},
		{"manual: stop with no VMI is consumed", decisionInput{Strategy: manual, Entered: manual, Requests: reqs(stop)},
			want{action: ActionNone, reason: ReasonInSync, entered: manual}},

		// Halted
		{"halted: deletes a running VMI", decisionInput{Strategy: halted, Entered: always, VMI: testVMI(v1alpha1.Running)},
			want{action: ActionDelete, reason: ReasonRunStrategyHalted, entered: halted}},
		{"halted: deletes an ended VMI", decisionInput{Strategy: halted, Entered: halted, VMI: testVMI(v1alpha1.Succeeded)},
			want{action: ActionDelete, reason: ReasonRunStrategyHalted, entered: halted}},
		{"halted: nothing without VMI", decisionInput{Strategy: halted},
			want{action: ActionNone, reason: ReasonInSync, entered: halted}},
		{"halted: start refused", decisionInput{Strategy: halted, Entered: halted, Requests: reqs(start)},
			want{action: ActionNone, reason: ReasonInSync, entered: halted, warningNote: true}},
		{"halted: restart refused", decisionInput{Strategy: halted, Entered: halted, Requests: reqs(stop, start)},
			want{action: ActionNone, reason: ReasonInSync, entered: halted, warningNote: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decide(tc.in)
			got := want{action: d.Action, reason: d.Reason, requests: len(d.Requests), held: d.Held,
				entered: d.RunStrategy, backingOff: d.BackingOff}
			for _, n := range d.Notes {
				if n.Type == "Warning" {
					got.warningNote = true
				}
			}
			if got != tc.want {
				t.Errorf("decide() = %+v (message %q), want %+v", got, d.Message, tc.want)
			}
			if d.BackingOff && d.RequeueAfter <= 0 {
				t.Errorf("backing off without a requeue")
			}
		})
	}
}

func TestDecideRerunOnFailureQueuesOneStart(t *testing.T) {
	d := decide(decisionInput{Strategy: v1alpha1.RunStrategyRerunOnFailure, Entered: v1alpha1.RunStrategyRerunOnFailure,
		VMI: testVMI(v1alpha1.Failed)})
	if len(d.Requests) != 1 || d.Requests[0].Action != v1alpha1.StartRequest {
		t.Fatalf("requests = %+v, want one Start", d.Requests)
	}
	// The next pass sees the Start first and replaces the failed VMI; it does not queue another.
	d = decide(decisionInput{Strategy: v1alpha1.RunStrategyRerunOnFailure, Entered: v1alpha1.RunStrategyRerunOnFailure,
		VMI: testVMI(v1alpha1.Failed), Requests: d.Requests})
	if d.Action != ActionDelete || len(d.Requests) != 1 {
		t.Fatalf("second pass: action %s, requests %+v; want Delete keeping the Start", d.Action, d.Requests)
	}
}

func TestRunStrategy(t *testing.T) {
	cases := []struct {
		name     string
		strategy *v1alpha1.RunStrategy
		running  *bool
		want     v1alpha1.RunStrategy
	}{
		{"unset", nil, nil, v1alpha1.RunStrategyHalted},
		{"running true", nil, ptr.To(true), v1alpha1.RunStrategyAlways},
		{"running false", nil, ptr.To(false), v1alpha1.RunStrategyHalted},
		{"runStrategy wins", ptr.To(v1alpha1.RunStrategyManual), ptr.To(true), v1alpha1.RunStrategyManual},
	}
	for _, tc := range cases {
		vm := &v1alpha1.VirtualMachine{Spec: v1alpha1.VirtualMachineSpec{RunStrategy: tc.strategy, Running: tc.running}}
		if got := vm.EffectiveRunStrategy(); got != tc.want {
			t.Errorf("%s: runStrategy = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := backoff{Base: 10 * time.Second, Max: 5 * time.Minute}
	for n, want := range map[int]time.Duration{0: 0, 1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second,
		5: 160 * time.Second, 6: 5 * time.Minute, 60: 5 * time.Minute} {
		if got := b.delay(n); got != want {
			t.Errorf("delay(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestNextStartFailure(t *testing.T) {
	b := backoff{Base: 10 * time.Second, Max: 5 * time.Minute}
	ranAt := func(running, failed time.Time) func(*v1alpha1.VirtualMachineInstance) {
		return func(vmi *v1alpha1.VirtualMachineInstance) {
			vmi.CreationTimestamp = metav1.NewTime(running.Add(-time.Second))
			vmi.Status.PhaseTransitionTimestamps = []v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{
				{Phase: v1alpha1.Running, PhaseTransitionTimestamp: metav1.NewTime(running)},
			}
			if !failed.IsZero() {
				vmi.Status.PhaseTransitionTimestamps = append(vmi.Status.PhaseTransitionTimestamps,
					v1alpha1.VirtualMachineInstancePhaseTransitionTimestamp{Phase: v1alpha1.Failed, PhaseTransitionTimestamp: metav1.NewTime(failed)})
			}
		}
	}
	one := &v1alpha1.VirtualMachineStartFailure{ConsecutiveFailCount: 1, LastFailedVMIUID: "uid-0", RetryAfterTimestamp: &metav1.Time{Time: t0}}
	cases := []struct {
		name        string
		old         *v1alpha1.VirtualMachineStartFailure
		vmi         *v1alpha1.VirtualMachineInstance
		wantCount   int // 0: nil
		wantCounted bool
		wantRetry   time.Duration
		wantRecheck bool
	}{
		{"no VMI keeps", one, nil, 1, false, 0, false},
		{"never ran fails early", nil, testVMI(v1alpha1.Failed), 1, true, 10 * time.Second, false},
		{"second failure doubles", one, testVMI(v1alpha1.Failed), 2, true, 20 * time.Second, false},
		{"same VMI counted once", one, testVMI(v1alpha1.Failed, func(v *v1alpha1.VirtualMachineInstance) { v.UID = "uid-0" }), 1, false, 0, false},
		{"quick failure after running", one, testVMI(v1alpha1.Failed, ranAt(t0.Add(-2*time.Minute), t0.Add(-time.Minute))), 2, true, 20 * time.Second, false},
		{"failure after a long run resets", one, testVMI(v1alpha1.Failed, ranAt(t0.Add(-time.Hour), t0)), 0, false, 0, false},
		{"running briefly keeps and rechecks", one, testVMI(v1alpha1.Running, ranAt(t0.Add(-10*time.Second), time.Time{})), 1, false, 0, true},
		{"running a minute resets", one, testVMI(v1alpha1.Running, ranAt(t0.Add(-2*time.Minute), time.Time{})), 0, false, 0, false},
		{"guest shutdown keeps", one, testVMI(v1alpha1.Succeeded), 1, false, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sf, counted, recheck := nextStartFailure(tc.old, tc.vmi, t0, b)
			count := 0
			if sf != nil {
				count = sf.ConsecutiveFailCount
			}
			if count != tc.wantCount || counted != tc.wantCounted || (recheck > 0) != tc.wantRecheck {
				t.Fatalf("got count %d counted %v recheck %s; want %d %v recheck %v", count, counted, recheck, tc.wantCount, tc.wantCounted, tc.wantRecheck)
			}
			if tc.wantCounted {
				if got := sf.RetryAfterTimestamp.Sub(t0); got != tc.wantRetry {
					t.Errorf("retry after %s, want %s", got, tc.wantRetry)
				}
				if sf.LastFailedVMIUID != tc.vmi.UID {
					t.Errorf("lastFailedVMIUID %s, want %s", sf.LastFailedVMIUID, tc.vmi.UID)
				}
			}
		})
	}
}

func TestCeilSecond(t *testing.T) {
	if got := ceilSecond(t0.Add(1500 * time.Millisecond)); !got.Equal(t0.Add(2 * time.Second)) {
		t.Errorf("ceilSecond(+1.5s) = %s", got)
	}
	if got := ceilSecond(t0); !got.Equal(t0) {
		t.Errorf("ceilSecond(whole) = %s", got)
	}
}

// A Stop's grace period override (`qvirtctl stop --grace-period`/--force) reaches the deletion; a
// malformed one is reported and the instance's own grace period applies.
func TestDecideStopGracePeriod(t *testing.T) {
	withData := func(v string) v1alpha1.VirtualMachineStateChangeRequest {
		return v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest,
			Data: map[string]string{v1alpha1.StopGracePeriodDataKey: v}}
	}
	in := decisionInput{Strategy: v1alpha1.RunStrategyManual, Entered: v1alpha1.RunStrategyManual, VMI: testVMI(v1alpha1.Running)}
	for _, tc := range []struct {
		data    string
		want    *int64
		warning bool
	}{{"0", ptr.To[int64](0), false}, {"45", ptr.To[int64](45), false}, {"-1", nil, true}, {"soon", nil, true}} {
		in.Requests = reqs(withData(tc.data))
		d := decide(in)
		if d.Action != ActionDelete {
			t.Fatalf("data %q: action %s, want Delete", tc.data, d.Action)
		}
		if (d.GracePeriodSeconds == nil) != (tc.want == nil) || (tc.want != nil && *d.GracePeriodSeconds != *tc.want) {
			t.Errorf("data %q: grace period %v, want %v", tc.data, d.GracePeriodSeconds, tc.want)
		}
		if got := len(d.Notes) > 0 && d.Notes[0].Type == "Warning"; got != tc.warning {
			t.Errorf("data %q: warning %v, want %v (notes %+v)", tc.data, got, tc.warning, d.Notes)
		}
	}
}

// A Start request's paused flag (`qvirtctl start --paused`) reaches the creation; a malformed one
// is reported and the instance starts running.
func TestDecideStartPaused(t *testing.T) {
	in := decisionInput{Strategy: v1alpha1.RunStrategyManual, Entered: v1alpha1.RunStrategyManual}
	for _, tc := range []struct {
		data    map[string]string
		want    bool
		warning bool
	}{
		{nil, false, false},
		{map[string]string{v1alpha1.StartPausedDataKey: "true"}, true, false},
		{map[string]string{v1alpha1.StartPausedDataKey: "false"}, false, false},
		{map[string]string{v1alpha1.StartPausedDataKey: "yes"}, false, true},
	} {
		in.Requests = reqs(v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest, Data: tc.data})
		d := decide(in)
		if d.Action != ActionCreate {
			t.Fatalf("data %v: action %s, want Create", tc.data, d.Action)
		}
		if d.StartPaused != tc.want {
			t.Errorf("data %v: start paused %v, want %v", tc.data, d.StartPaused, tc.want)
		}
		if got := len(d.Notes) > 0 && d.Notes[0].Type == "Warning"; got != tc.warning {
			t.Errorf("data %v: warning %v, want %v (notes %+v)", tc.data, got, tc.warning, d.Notes)
		}
	}
}
