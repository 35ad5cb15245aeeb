package launcher

import "testing"

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
