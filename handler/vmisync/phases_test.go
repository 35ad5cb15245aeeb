package vmisync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher/protocol"
)

// A hotplug phase that fails (a volume that cannot be attached, retried) must not hold back the
// others: the vCPUs a user asked for are plugged all the same, and the error names the failing
// phase. A failing launcher phase still ends the reconcile.
func TestHotplugPhasesRunDespiteAnotherFailing(t *testing.T) {
	var ran []string
	step := func(name string, err error) func(context.Context, *syncState) error {
		return func(_ context.Context, s *syncState) error {
			ran = append(ran, name)
			if name == "launcher" && err == nil {
				s.st = &protocol.Status{Phase: protocol.PhaseRunning}
			}
			return err
		}
	}
	phases := func(launcherErr error) []phase {
		return []phase{
			{name: "launcher", run: step("launcher", launcherErr)},
			{name: "disks", run: step("disks", errors.New("attach volume \"bad\": no such claim")), hotplug: true},
			{name: "nics", run: step("nics", nil), hotplug: true},
			{name: "cpus", run: step("cpus", nil), hotplug: true},
		}
	}
	err := runPhases(context.Background(), &syncState{}, phases(nil))
	if want := []string{"launcher", "disks", "nics", "cpus"}; !slices.Equal(ran, want) {
		t.Errorf("phases run %v, want %v", ran, want)
	}
	if err == nil || !strings.Contains(err.Error(), `disks: attach volume "bad"`) {
		t.Errorf("error %v, want the disks phase's", err)
	}

	ran = nil
	err = runPhases(context.Background(), &syncState{}, phases(errLauncherStarting))
	if !slices.Equal(ran, []string{"launcher"}) || !errors.Is(err, errLauncherStarting) {
		t.Errorf("after a failing launcher phase: ran %v, error %v; want only the launcher phase and its error", ran, err)
	}
}

// A phase that waits holds back none after it while the launcher's status is known, and the
// reconcile comes back after the shortest wait asked for.
func TestWaitingPhasesRequeueAtTheShortestWait(t *testing.T) {
	var ran []string
	wait := func(name string, err error) phase {
		return phase{name: name, run: func(_ context.Context, s *syncState) error {
			ran = append(ran, name)
			s.st = &protocol.Status{Phase: protocol.PhaseRunning}
			return err
		}}
	}
	s := &syncState{}
	err := runPhases(context.Background(), s, []phase{
		wait("launcher", nil), wait("resume", errResumeLater), wait("post-copy", errPostCopyWatch), wait("disks", nil),
	})
	if err != nil || s.requeueAfter != recoveryPoll || len(ran) != 4 {
		t.Errorf("ran %v, error %v, requeue after %v; want all four phases, no error, after %v", ran, err, s.requeueAfter, recoveryPoll)
	}
}

// Each wait reaches the reconcile's requeue with its own delay, through the phases' wrapping; a
// wait joined with a failure is a failure (its error must not be dropped).
func TestWaitFor(t *testing.T) {
	for _, c := range []struct {
		err   error
		after time.Duration
		wait  bool
	}{
		{errLauncherStarting, launcherStartPoll, true},
		{errHandoverPending, launcherStartPoll, true},
		{errPostCopyWatch, recoveryPoll, true},
		{errResumeLater, resumeRetry, true},
		{fmt.Errorf("launcher: %w", errLauncherStarting), launcherStartPoll, true},
		{errors.Join(errors.New("disks: attach volume \"bad\""), fmt.Errorf("launcher: %w", errLauncherStarting)), 0, false},
		{errors.New("the launcher is starting"), 0, false},
		{nil, 0, false},
	} {
		if after, wait := waitFor(c.err); after != c.after || wait != c.wait {
			t.Errorf("waitFor(%v) = %v, %v; want %v, %v", c.err, after, wait, c.after, c.wait)
		}
	}
}
