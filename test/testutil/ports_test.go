package testutil

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortsAreBelowTheEphemeralRange: single ports, pairs and runs are free, below the
// ephemeral range, and never handed out twice.
func TestFreePortsAreBelowTheEphemeralRange(t *testing.T) {
	_, hi := belowEphemeral(t)
	seen := map[int]bool{}
	take := func(port, n int) {
		for i := range n {
			p := port + i
			if p > hi+1 || seen[p] {
				t.Fatalf("port %d (run of %d from %d): want it below %d and not handed out before", p, n, port, hi+2)
			}
			seen[p] = true
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("port %d (run of %d from %d) is not free: %v", p, n, port, err)
			}
			l.Close()
		}
	}
	for range 30 {
		take(FreePort(t), 1)
		take(FreePortPair(t), 2)
		take(FreePortRun(t, 3), 3)
	}
}
