package vmisync

import (
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// A status stream queues the instance for each status the launcher pushes, except a first one
// equal to the status the pass that started the stream read and acted on: that pass is the one it
// would queue (it queued a second pass for every start, whose write lost to the first's with a
// conflict when the cache lagged). Its end queues one more.
func TestStreamQueuesNoPassForTheStatusAlreadyRead(t *testing.T) {
	read := protocol.Status{UID: "vmi-1", Phase: protocol.PhaseRunning, RunState: "running", PID: 42}
	paused := read
	paused.RunState = "paused"
	dir := launcher.Dir(t.TempDir())
	serveStatuses(t, dir.Command(), read, paused)

	ls := newLaunchers(launcher.ClientOptions{}, logr.Discard())
	v := &v1alpha1.VirtualMachineInstance{}
	v.Namespace, v.Name, v.UID = "ns", "vm", types.UID("vmi-1")
	ls.place(v.UID, dir)
	ls.follow(v, read)

	deadline := time.Now().Add(30 * time.Second)
	for !streamEnded(ls, v.UID) || len(ls.events) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the stream did not end, or queued %d passes", len(ls.events))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The end's pass is queued just after the stream is marked ended.
	time.Sleep(100 * time.Millisecond)
	if n := len(ls.events); n != 2 {
		t.Errorf("%d passes queued, want 2: one for the status that changed, one for the stream's end", n)
	}
	if st, ok := ls.latest(v.UID); ok || st.RunState != "" {
		t.Errorf("latest after the stream ended without the guest's end: %+v %v, want none", st, ok)
	}
}

func streamEnded(ls *launchers, uid types.UID) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	s := ls.streams[uid]
	return s != nil && s.ended
}

// serveStatuses answers a status watch on socket with statuses, one per line, and ends it.
func serveStatuses(t *testing.T, socket string, statuses ...protocol.Status) {
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		enc := json.NewEncoder(w)
		for _, st := range statuses {
			_ = enc.Encode(st)
			w.(http.Flusher).Flush()
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}
