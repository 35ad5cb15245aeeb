package vmisync

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// launchers holds one status stream per instance on this node: each status the launcher pushes is
// kept as the latest and queues the instance for reconciling, so the reconciler reacts to QEMU's
// events instead of polling. Safe for concurrent use.
type launchers struct {
	opts   launcher.ClientOptions
	events chan event.TypedGenericEvent[client.Object]
	log    logr.Logger

	mu sync.Mutex
	// dirs are the socket directories of the instances' launcher pods here, set by place.
	dirs     map[types.UID]launcher.Dir
	streams  map[types.UID]*stream
	progress map[types.UID]time.Time
	// resumes are when each instance's post-copy migration was last resumed (resumeDue).
	resumes  map[types.UID]time.Time
	failures map[types.UID]string
}

// stream is one instance's status stream.
type stream struct {
	key    client.ObjectKey
	cancel context.CancelFunc
	// latest is the last status received; nil before the first.
	latest *protocol.Status
	// read is the status the pass that started the stream acted on, until the first arrives.
	read *protocol.Status
	// ended is set when the stream is over (the launcher went away or the handler stops).
	ended bool
	// shuttingDown is set once a graceful shutdown was asked for.
	shuttingDown bool
}

func newLaunchers(opts launcher.ClientOptions, log logr.Logger) *launchers {
	return &launchers{opts: opts, log: log, dirs: map[types.UID]launcher.Dir{}, streams: map[types.UID]*stream{},
		progress: map[types.UID]time.Time{}, resumes: map[types.UID]time.Time{}, failures: map[types.UID]string{},
		events: make(chan event.TypedGenericEvent[client.Object], 1024)}
}

// place records where the instance's launcher pod on this node keeps its sockets.
func (ls *launchers) place(uid types.UID, dir launcher.Dir) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.dirs[uid] = dir
}

// dir is the instance's socket directory recorded by place ("" when none is).
func (ls *launchers) dir(uid types.UID) launcher.Dir {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.dirs[uid]
}

// client is the launcher client of an instance placed here, with the node agent's limits. An
// instance never placed gets a client whose calls fail: there is no socket to reach.
func (ls *launchers) client(uid types.UID) *launcher.Client {
	socket := "" // dials fail: "missing address"
	if d := ls.dir(uid); d != "" {
		socket = d.Command()
	}
	return launcher.NewClientWithOptions(socket, ls.opts)
}

// latest is the instance's last streamed status; ok is false when no stream is live (none
// started, or it ended before the guest did), so the caller asks the launcher directly and calls
// follow. A stream that ended after the guest's end keeps reporting it: the launcher may be gone.
func (ls *launchers) latest(uid types.UID) (st protocol.Status, ok bool) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	s := ls.streams[uid]
	if s == nil || s.latest == nil {
		return protocol.Status{}, false
	}
	if s.ended && s.latest.Exit == nil && s.latest.Phase != protocol.PhaseFailed {
		return protocol.Status{}, false
	}
	return *s.latest, true
}

// follow starts streaming the instance's status unless a live stream exists. read is the status
// the caller just read from the launcher and acts on: a first streamed status equal to it queues
// no pass, since the caller's pass is that pass.
func (ls *launchers) follow(vmi *v1alpha1.VirtualMachineInstance, read protocol.Status) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if s := ls.streams[vmi.UID]; s != nil && !s.ended {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &stream{key: client.ObjectKeyFromObject(vmi), cancel: cancel, read: &read}
	ls.streams[vmi.UID] = s
	key := &v1alpha1.VirtualMachineInstance{}
	key.Namespace, key.Name, key.UID = vmi.Namespace, vmi.Name, vmi.UID
	go ls.run(ctx, s, key)
}

func (ls *launchers) run(ctx context.Context, s *stream, key *v1alpha1.VirtualMachineInstance) {
	c := ls.client(key.UID)
	defer c.Close()
	err := c.Watch(ctx, func(st protocol.Status) bool {
		ls.mu.Lock()
		seen := s.read != nil && reflect.DeepEqual(*s.read, st)
		s.latest, s.read = &st, nil
		ls.mu.Unlock()
		if !seen {
			ls.notify(ctx, key)
		}
		return true
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		ls.log.V(1).Info("launcher status stream ended", "vmi", client.ObjectKeyFromObject(key), "error", err.Error())
	}
	ls.mu.Lock()
	s.ended = true
	ls.mu.Unlock()
	ls.notify(ctx, key)
}

// notify queues the instance for reconciling, unless its stream was stopped.
func (ls *launchers) notify(ctx context.Context, key client.Object) {
	select {
	case ls.events <- event.TypedGenericEvent[client.Object]{Object: key}:
	case <-ctx.Done():
	}
}

// progressDue reports whether the instance's migration progress was last written more than every
// ago, and if so counts this as a write.
func (ls *launchers) progressDue(uid types.UID, every time.Duration) bool {
	return ls.due(ls.progress, uid, every)
}

// resumeDue reports whether the instance's migration was last resumed more than every ago, and
// if so counts this as a resume.
func (ls *launchers) resumeDue(uid types.UID, every time.Duration) bool {
	return ls.due(ls.resumes, uid, every)
}

// due reports whether last[uid] is more than every ago, and if so sets it to now.
func (ls *launchers) due(last map[types.UID]time.Time, uid types.UID, every time.Duration) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if time.Since(last[uid]) < every {
		return false
	}
	last[uid] = time.Now()
	return true
}

// newFailure reports whether msg differs from the instance's last recorded failure, and records it.
func (ls *launchers) newFailure(uid types.UID, msg string) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.failures[uid] == msg {
		return false
	}
	ls.failures[uid] = msg
	return true
}

// forget stops the instance's stream, if any.
func (ls *launchers) forget(uid types.UID) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	delete(ls.progress, uid)
	delete(ls.resumes, uid)
	delete(ls.failures, uid)
	delete(ls.dirs, uid)
	if s := ls.streams[uid]; s != nil {
		s.cancel()
		delete(ls.streams, uid)
	}
}

// shutdown asks the launcher, once per instance, to power the guest off within grace (the spec's
// when nil), and reports whether this call asked. It runs in the background since it lasts until
// QEMU is gone, bounded by within; the status stream reports the end.
func (ls *launchers) shutdown(uid types.UID, grace *int64, within time.Duration) bool {
	ls.mu.Lock()
	s := ls.streams[uid]
	if s == nil || s.shuttingDown {
		ls.mu.Unlock()
		return false
	}
	s.shuttingDown = true
	ls.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		c := ls.client(uid)
		defer c.Close()
		if _, err := c.Shutdown(ctx, grace); err != nil {
			ls.log.Info("graceful shutdown ended with an error", "vmiUID", uid, "error", err.Error())
		}
	}()
	return true
}

// forgetKey stops the stream of the instance named key, which is gone from this node's cache.
func (ls *launchers) forgetKey(key client.ObjectKey) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for uid, s := range ls.streams {
		if s.key == key {
			s.cancel()
			delete(ls.streams, uid)
			delete(ls.progress, uid)
			delete(ls.dirs, uid)
		}
	}
}

// stopAll ends every stream (the handler is stopping; the launchers keep running).
func (ls *launchers) stopAll() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for uid, s := range ls.streams {
		s.cancel()
		delete(ls.streams, uid)
	}
}
