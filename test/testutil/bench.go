package testutil

import (
	"context"
	"runtime"

	"k8s.io/apimachinery/pkg/watch"
)

// LiveHeap is the heap in use after a full collection: what a benchmark's process holds.
func LiveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// DrainWatch hands every event of w to see until w ends or ctx is done, then stops w.
func DrainWatch(ctx context.Context, w watch.Interface, see func(watch.Event)) {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			see(ev)
		}
	}
}
