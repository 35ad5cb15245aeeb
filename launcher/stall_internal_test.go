package launcher

import (
	"testing"
	"time"
)

// The copy of local disks is stalled only when it copies nothing more for the timeout. A mirror
// reports no length before it has scanned its disk, then copies steadily: that copy must not be
// taken for a stall however long it runs, while one stuck at a byte count is.
func TestCopyStalledFollowsBytesCopied(t *testing.T) {
	start := time.Now()
	w := stallWatch{timeout: 2 * time.Second}
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	// 0 bytes known at first (no length yet), then 1 MiB more every 200 ms for 10 s.
	if w.copyStalled(0, at(0)) {
		t.Fatal("stalled at the first sample")
	}
	for i := 1; i <= 50; i++ {
		if w.copyStalled(int64(i)<<20, at(200*i)) {
			t.Fatalf("a copy at %d MiB after %d ms, 1 MiB more every 200 ms, was taken for a stall", i, 200*i)
		}
	}
	// Then stuck: a stall once the timeout has passed, not before.
	if w.copyStalled(50<<20, at(10000+1900)) {
		t.Fatal("stalled before the timeout")
	}
	if !w.copyStalled(50<<20, at(10000+2100)) {
		t.Fatal("a copy stuck at 50 MiB for 2.1 s was not taken for a stall")
	}
	if got := w.diskReason(); got != "no progress copying the local disks for 2s (stuck at 52428800 bytes copied): the migration was aborted (progressTimeout)" {
		t.Errorf("reason %q", got)
	}
}
