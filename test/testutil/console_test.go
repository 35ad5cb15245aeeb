package testutil

import "testing"

// TestLastTick: the counter's lines count, the broken echo of the command that started it does
// not (the console of a failed run of launcher's TestMigrationKeepsTheGuestRunning), and a
// console that joined mid-count reports from its second line.
func TestLastTick(t *testing.T) {
	for _, c := range []struct {
		text string
		want int
	}{
		{"QVIRT-GUEST-READY\r\ntick 1000\r\n\r\nBusyBox v1.35.0\r\n00 &\r\ntestguest:~# tick 100000 &\r\ntestguest:~# \x1b[6ntick 1\r\ntick 2\r\ntick 3\r\ntick 4\r\n", 4},
		{"tick 5\r\ntick 6\r\ntick 7\r\n", 7},
		{"tick 5\r\n", 0},
		{"", 0},
	} {
		if got := LastTick(c.text); got != c.want {
			t.Errorf("LastTick(%q) = %d, want %d", c.text, got, c.want)
		}
	}
}
