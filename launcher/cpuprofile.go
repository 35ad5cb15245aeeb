package launcher

import (
	"context"
	"os"
	"runtime/pprof"
	"time"

	"github.com/go-logr/logr"

	"github.com/qvirt/qvirt/launcher/protocol"
)

// profileTail is how long a start-up profile goes on after the guest first runs: the status
// reaching the node agent is part of the start.
const profileTail = time.Second

// profileStart writes a CPU profile of this process to file, from now until l's guest first runs
// (or fails) and profileTail after, so `make profile` shows where a launcher's start goes; file
// appears once complete. The returned stop ends it sooner (the launcher is stopping) and waits
// until the file is written. A profile that cannot be written is logged: it never stops the guest.
func profileStart(l *Launcher, file string, log logr.Logger) (stop func()) {
	partial := file + ".partial"
	f, err := os.Create(partial)
	if err != nil {
		log.Error(err, "CPU profile")
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		log.Error(err, "CPU profile", "file", file)
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	written := make(chan struct{})
	go func() {
		defer close(written)
		if waitFirstRun(ctx, l) {
			select {
			case <-time.After(profileTail):
			case <-ctx.Done():
			}
		}
		pprof.StopCPUProfile()
		err := f.Close()
		if err == nil {
			err = os.Rename(partial, file)
		}
		if err != nil {
			log.Error(err, "CPU profile", "file", file)
			_ = os.Remove(partial)
		}
	}()
	return func() {
		cancel()
		<-written
	}
}

// waitFirstRun waits until l's guest runs or the start failed; false when ctx ended first.
func waitFirstRun(ctx context.Context, l *Launcher) bool {
	for {
		st, changed := l.Status(ctx)
		if st.Phase == protocol.PhaseRunning || st.Phase == protocol.PhaseFailed || st.Exit != nil {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}
