package vm

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Crash-loop defaults, as KubeVirt's order of magnitude: 10 s, 20 s, 40 s, ... capped at 5 minutes.
const (
	DefaultBackoffBase = 10 * time.Second
	DefaultBackoffMax  = 5 * time.Minute
	// FailedEarlyWindow: an instance that fails within this time of its creation, or that never
	// reached Running, counts as a failed start.
	FailedEarlyWindow = 5 * time.Minute
	// ResetAfter: an instance Running this long ends the crash loop (status.startFailure cleared).
	ResetAfter = time.Minute
)

// backoff is the crash-loop delay schedule: Base * 2^(n-1) before the start that follows the n-th
// failed start in a row, capped at Max.
type backoff struct {
	Base, Max time.Duration
}

func (b backoff) delay(failures int) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := b.Base
	for i := 1; i < failures; i++ {
		d *= 2
		if d >= b.Max {
			return b.Max
		}
	}
	return min(d, b.Max)
}

// phaseTime is when vmi last entered phase, or the zero time.
func phaseTime(vmi *v1alpha1.VirtualMachineInstance, phase v1alpha1.VirtualMachineInstancePhase) time.Time {
	var t time.Time
	for _, pt := range vmi.Status.PhaseTransitionTimestamps {
		if pt.Phase == phase && pt.PhaseTransitionTimestamp.After(t) {
			t = pt.PhaseTransitionTimestamp.Time
		}
	}
	return t
}

// failedEarly is true for a Failed instance that never reached Running or failed within
// FailedEarlyWindow of its creation: a failed start rather than the end of a working run.
func failedEarly(vmi *v1alpha1.VirtualMachineInstance, now time.Time) bool {
	if vmi.Status.Phase != v1alpha1.Failed {
		return false
	}
	if phaseTime(vmi, v1alpha1.Running).IsZero() {
		return true
	}
	failedAt := phaseTime(vmi, v1alpha1.Failed)
	if failedAt.IsZero() {
		failedAt = now
	}
	return failedAt.Sub(vmi.CreationTimestamp.Time) < FailedEarlyWindow
}

// nextStartFailure updates the crash-loop record from the instance: a Failed instance not yet
// counted that failed early adds a failure and sets the time of the next allowed start (rounded up
// to a whole second, the precision status keeps); a Failed instance that had run for a while, or a
// Running one running for ResetAfter, clears it. counted reports a newly counted failure; recheck,
// when positive, is when a Running instance will have run long enough to clear it.
func nextStartFailure(old *v1alpha1.VirtualMachineStartFailure, vmi *v1alpha1.VirtualMachineInstance, now time.Time, b backoff) (sf *v1alpha1.VirtualMachineStartFailure, counted bool, recheck time.Duration) {
	if vmi == nil {
		return old, false, 0
	}
	switch vmi.Status.Phase {
	case v1alpha1.Failed:
		if old != nil && old.LastFailedVMIUID == vmi.UID {
			return old, false, 0
		}
		if !failedEarly(vmi, now) {
			return nil, false, 0
		}
		n := 1
		if old != nil {
			n = old.ConsecutiveFailCount + 1
		}
		retry := ceilSecond(now.Add(b.delay(n)))
		return &v1alpha1.VirtualMachineStartFailure{
			ConsecutiveFailCount: n,
			LastFailedVMIUID:     vmi.UID,
			RetryAfterTimestamp:  &metav1.Time{Time: retry},
		}, true, 0
	case v1alpha1.Running:
		if old == nil {
			return nil, false, 0
		}
		since := phaseTime(vmi, v1alpha1.Running)
		if since.IsZero() {
			since = vmi.CreationTimestamp.Time
		}
		if ran := now.Sub(since); ran < ResetAfter {
			return old, false, ResetAfter - ran
		}
		return nil, false, 0
	}
	return old, false, 0
}

// backoffLeft is how long a start must still wait.
func backoffLeft(sf *v1alpha1.VirtualMachineStartFailure, now time.Time) time.Duration {
	if sf == nil || sf.RetryAfterTimestamp == nil {
		return 0
	}
	return max(sf.RetryAfterTimestamp.Sub(now), 0)
}

func ceilSecond(t time.Time) time.Time {
	if tr := t.Truncate(time.Second); !tr.Equal(t) {
		return tr.Add(time.Second)
	}
	return t
}
