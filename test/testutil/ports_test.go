package testutil

import (
	"net"
	"strconv"
	"testing"
)

func TestFreePortPairIsBelowTheEphemeralRange(t *testing.T) {
	_, hi := belowEphemeral(t)
	seen := map[int]bool{}
	for range 50 {
		port := FreePortPair(t)
		if port+1 > hi+1 || seen[port] || seen[port+1] {
			t.Fatalf("port pair %d: want it below %d and not handed out before", port, hi+2)
		}
		seen[port], seen[port+1] = true, true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+1))
		if err != nil {
			t.Fatalf("port %d (pair %d) is not free: %v", port+1, port, err)
		}
		l.Close()
	}
}
