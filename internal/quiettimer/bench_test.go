package quiettimer

import (
	"testing"
	"time"

	"github.com/qvirt/qvirt/test/testutil"
)

// BenchmarkTimerFire is what waiting out one timer costs a process that does nothing else: the
// wake-ups of all its threads (wakeups/fire) and their CPU time per firing, for a Go timer and for
// a Timer. Each firing ends a wait long enough for the runtime's monitor thread to fall asleep
// (the launcher's is a minute: run it with -benchtime=10x or more).
func BenchmarkTimerFire(b *testing.B) {
	const wait = 500 * time.Millisecond
	b.Run("go", func(b *testing.B) {
		tm := time.NewTimer(time.Hour)
		defer tm.Stop()
		fires(b, func() { tm.Reset(wait); <-tm.C })
	})
	b.Run("timerfd", func(b *testing.B) {
		tm := New()
		defer tm.Close()
		fires(b, func() { tm.Reset(wait); <-tm.C })
	})
}

// fires runs fire b.N times and reports the process's wake-ups and CPU per run.
func fires(b *testing.B, fire func()) {
	fire() // settled: the first use's allocations and thread starts are not counted
	cpu0, runs0 := testutil.MustSchedStats(b, 0)
	b.ResetTimer()
	for range b.N {
		fire()
	}
	b.StopTimer()
	cpu1, runs1 := testutil.MustSchedStats(b, 0)
	b.ReportMetric(float64(runs1-runs0)/float64(b.N), "wakeups/fire")
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "cpu-µs/fire")
}
