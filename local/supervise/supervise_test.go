package supervise

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func waitState(t *testing.T, dir, name string, ok func(State) bool) State {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		states, err := ReadStates(dir)
		if err == nil {
			for _, st := range states {
				if st.Name == name && ok(st) {
					return st
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("component %s never reached the state wanted; states %+v (%v)", name, states, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newSupervisor is a Supervisor in a new directory, and the path of the command named cmd.
func newSupervisor(t *testing.T, cmd string) (s *Supervisor, dir, path string) {
	t.Helper()
	path, err := exec.LookPath(cmd)
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	s, err = New(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s, dir, path
}

func TestSuperviseRestartsAndStops(t *testing.T) {
	s, dir, sleep := newSupervisor(t, "sleep")
	marker := filepath.Join(dir, "ready")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	readyCalls := 0
	err := s.Start(ctx, Component{Name: "sleeper", Path: sleep, Args: []string{"1000"},
		Ready: func(context.Context) error {
			readyCalls++
			if readyCalls < 3 {
				return errors.New("not yet")
			}
			return os.WriteFile(marker, nil, 0o644)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("Start returned before the component was ready")
	}
	first := waitState(t, dir, "sleeper", func(st State) bool { return st.State == Running && st.PID != 0 })
	if !Alive(first.PID, sleep) {
		t.Fatalf("pid %d is not %s", first.PID, sleep)
	}

	if err := s.Kill("sleeper"); err != nil {
		t.Fatal(err)
	}
	second := waitState(t, dir, "sleeper", func(st State) bool { return st.State == Running && st.Restarts == 1 })
	if second.PID == first.PID || second.LastExit != "signal: killed" {
		t.Errorf("after a kill: %+v, want a new PID and lastExit signal: killed", second)
	}

	s.Stop(5 * time.Second)
	stopped := waitState(t, dir, "sleeper", func(st State) bool { return st.State == Stopped })
	if stopped.PID != 0 || Alive(second.PID, sleep) {
		t.Errorf("after Stop: %+v, process %d alive %t", stopped, second.PID, Alive(second.PID, sleep))
	}
	if data, err := os.ReadFile(s.LogPath("sleeper")); err != nil || len(data) == 0 {
		t.Errorf("no log at %s: %v", s.LogPath("sleeper"), err)
	}
}

func TestSuperviseBacksOffAFailingComponent(t *testing.T) {
	s, dir, falseBin := newSupervisor(t, "false")
	if err := s.Start(context.Background(), Component{Name: "crasher", Path: falseBin}); err != nil {
		t.Fatal(err)
	}
	// 1 s then 2 s of back-off: two restarts within about 3.5 s, not dozens.
	time.Sleep(3500 * time.Millisecond)
	st := waitState(t, dir, "crasher", func(State) bool { return true })
	if st.Restarts < 1 || st.Restarts > 3 || st.LastExit != "exit status 1" {
		t.Errorf("a component exiting at once: %+v, want 1-3 restarts with back-off and lastExit exit status 1", st)
	}
	s.Stop(time.Second)
	waitState(t, dir, "crasher", func(st State) bool { return st.State == Stopped })
}

// A component that never becomes ready: the error says how its runs ended and quotes its log's
// end, where it said why (a port taken), rather than only that a probe was refused.
func TestNotReadySaysWhy(t *testing.T) {
	s, _, sh := newSupervisor(t, "sh")
	defer s.Stop(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	err := s.Start(ctx, Component{Name: "taken", Path: sh, Args: []string{"-c", "echo 'listen tcp 127.0.0.1:9441: bind: address already in use' >&2; exit 1"},
		Ready: func(context.Context) error { return errors.New("connection refused") }})
	if err == nil {
		t.Fatal("a component that exits at once was ready")
	}
	for _, want := range []string{"taken not ready", "last exit exit status 1", "bind: address already in use", "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
