package launcher

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// ServeVM returns, and the launcher's process exits, as soon as ServeOn does: a status watch must
// be over by then, its last status sent, or the exit cuts the stream before the guest's end
// reaches the node agent (which then never records how the guest ended). The same goes for a reply
// being written, such as the node agent's POST /v1/shutdown.
func TestServeOnEndsStatusWatchesBeforeItReturns(t *testing.T) {
	l := New(t.TempDir(), HostResolver{}, Options{Log: logr.Discard()})
	socket := filepath.Join(t.TempDir(), SocketName)
	ln, err := Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	served := make(chan error, 1)
	go func() { served <- ServeOn(ctx, ln, l, logr.Discard()) }()

	first := make(chan protocol.Status, 1)
	watched := make(chan error, 1)
	var last atomic.Pointer[protocol.Status]
	go func() {
		watched <- NewClient(socket).Watch(context.Background(), func(st protocol.Status) bool {
			last.Store(&st)
			select {
			case first <- st:
			default:
			}
			return true
		})
	}()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no status on the watch")
	}

	// The status changes as the server stops, as it does when the guest ends: the watch must send
	// it before it ends.
	l.terminate()
	stop()
	if err := <-served; err != nil {
		t.Fatalf("ServeOn: %v", err)
	}
	// The stream's end is already on its way to the client; a stream left open would only end
	// at the process's exit, which this test process does not do.
	select {
	case err := <-watched:
		if err != nil {
			t.Errorf("the watch ended with %v, want a clean end", err)
		}
		if st := last.Load(); !st.Terminated {
			t.Errorf("the watch's last status %+v, want the one the server stopped with (terminated)", st)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeOn returned while a status watch was still open: an exiting launcher cuts it")
	}
}
