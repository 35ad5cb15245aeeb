package launcher

import (
	"slices"
	"testing"
	"time"
)

// TestAgentRetryWait: an agent that does not answer is retried at the next poll once, then less
// and less often, never less than every agentMaxRetryWait polls.
func TestAgentRetryWait(t *testing.T) {
	want := []int{0, 1, 2, 4, 8, 16, 32, 32, 32, 32}
	for i, w := range want {
		if got := agentRetryWait(i + 1); got != w {
			t.Errorf("after %d failures: skip %d polls, want %d", i+1, got, w)
		}
	}
	if got := agentRetryWait(1000); got != agentMaxRetryWait {
		t.Errorf("after 1000 failures: skip %d polls, want %d", got, agentMaxRetryWait)
	}
}

// TestAgentScheduleBacksOffWhileNothingChanges: a new agent is asked at once and every
// AgentPollInterval for agentFastPolls polls; while its answers stay the same the interval
// doubles up to AgentPollMax; a changed answer or a hot-plugged NIC brings the short interval
// back, and a failure retries at it.
func TestAgentScheduleBacksOffWhileNothingChanges(t *testing.T) {
	const s10, m1 = 10 * time.Second, time.Minute
	if AgentPollInterval != s10 || AgentPollMax != m1 {
		t.Fatalf("defaults %v and %v, want 10s and 1m", AgentPollInterval, AgentPollMax)
	}
	intervals := func(s *agentSchedule, changes ...bool) []time.Duration {
		var out []time.Duration
		for _, c := range changes {
			if !s.due() {
				t.Fatal("a poll was skipped without a failure")
			}
			s.answered(c)
			out = append(out, s.interval)
		}
		return out
	}
	same := func(n int) []bool { return make([]bool, n) }
	s := newAgentSchedule(AgentPollInterval, AgentPollMax)
	if !s.full() {
		t.Error("the first poll of a connection does not ask for the agent's and the OS's info")
	}
	// The first answer always changes the status (Connected).
	got := intervals(&s, append([]bool{true}, same(10)...)...)
	want := []time.Duration{s10, s10, s10, s10, s10, s10, 20 * time.Second, 40 * time.Second, m1, m1, m1}
	if !slices.Equal(got, want) {
		t.Fatalf("a new agent answering the same: intervals %v, want %v", got, want)
	}
	if got := intervals(&s, true, false); !slices.Equal(got, []time.Duration{s10, s10}) {
		t.Errorf("after a changed answer: %v, want the short interval again", got)
	}
	s = newAgentSchedule(AgentPollInterval, AgentPollMax)
	intervals(&s, append([]bool{true}, same(10)...)...)
	s.soon()
	if got := intervals(&s, same(7)...); !slices.Equal(got, []time.Duration{s10, s10, s10, s10, s10, s10, 20 * time.Second}) {
		t.Errorf("after soon (a hot-plugged NIC): %v, want a minute of polls at 10 s", got)
	}
	s.failed()
	s.failed()
	if s.interval != s10 || s.due() || !s.due() {
		t.Errorf("after two failures: interval %v, want 10s and one poll skipped", s.interval)
	}
}
