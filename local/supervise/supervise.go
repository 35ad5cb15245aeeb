// Package supervise runs a local cluster's components as host processes and keeps them running
// the way a Deployment or DaemonSet keeps its pods: a component that exits is started again after
// a back-off (1 s doubling to 30 s, reset after 60 s of running), each logs to
// <state>/logs/<name>.log, and every change of state is written to <state>/components.json for
// `qvirtctl local status` and for the cleanup after a crash.
package supervise

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Back-off between restarts.
const (
	minBackoff  = time.Second
	maxBackoff  = 30 * time.Second
	stableAfter = 60 * time.Second
)

// Component is one process to keep running.
type Component struct {
	Name string
	Path string
	Args []string
	Env  []string
	// Via, when set, is a command that execs Path with Args (nsenter into a namespace, say): the
	// process keeps its PID and, once exec'd, is Path, which is what the state file records.
	Via []string
	// Ready, when set, is polled (every 100 ms) after the first start until it returns nil; Start
	// returns once it does.
	Ready func(ctx context.Context) error
}

// Component states.
const (
	Running = "Running"
	Backoff = "CrashLoopBackOff"
	Stopped = "Stopped"
)

// State is what components.json says about a component.
type State struct {
	Name     string    `json:"name"`
	Path     string    `json:"path"`
	PID      int       `json:"pid,omitempty"`
	State    string    `json:"state"`
	Restarts int       `json:"restarts"`
	LastExit string    `json:"lastExit,omitempty"`
	Since    time.Time `json:"since"`
}

// Supervisor runs components. Safe for concurrent use.
type Supervisor struct {
	dir string

	mu      sync.Mutex
	order   []string
	running map[string]*proc
	ctls    map[string]*ctl
	states  map[string]*State
}

// proc is one run of a component.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{}
}

// ctl stops a component's keeper: Stop sets grace and closes stop; the keeper ends the current
// run (SIGTERM, SIGKILL after grace) and closes done.
type ctl struct {
	stop, done chan struct{}
	grace      time.Duration
}

// New supervises in stateDir (logs/ and components.json are made there).
func New(stateDir string) (*Supervisor, error) {
	if err := os.MkdirAll(filepath.Join(stateDir, "logs"), 0o755); err != nil {
		return nil, err
	}
	return &Supervisor{dir: stateDir, running: map[string]*proc{}, ctls: map[string]*ctl{}, states: map[string]*State{}}, nil
}

// LogPath is where a component's output goes.
func (s *Supervisor) LogPath(name string) string { return filepath.Join(s.dir, "logs", name+".log") }

// Start starts c, waits until it is ready (or ctx ends) and keeps it running until Stop.
func (s *Supervisor) Start(ctx context.Context, c Component) error {
	s.mu.Lock()
	if _, dup := s.states[c.Name]; dup {
		s.mu.Unlock()
		return fmt.Errorf("component %s started twice", c.Name)
	}
	s.order = append(s.order, c.Name)
	s.states[c.Name] = &State{Name: c.Name, Path: c.Path}
	k := &ctl{stop: make(chan struct{}), done: make(chan struct{})}
	s.ctls[c.Name] = k
	s.mu.Unlock()
	p, err := s.spawn(c)
	if err != nil {
		close(k.done)
		return err
	}
	go s.keep(c, k, p)
	if c.Ready == nil {
		return nil
	}
	for {
		err := c.Ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready (%s; log: %s, ending:\n%s): %w", c.Name, s.restarts(c.Name), s.LogPath(c.Name),
				logEnd(s.LogPath(c.Name), logEndBytes), errors.Join(ctx.Err(), err))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// logEndBytes is how much of a component's log an error that it is not ready quotes.
const logEndBytes = 2000

// restarts says how often name was started again, and how its last run ended.
func (s *Supervisor) restarts(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.states[name]
	out := fmt.Sprintf("restarted %d times", st.Restarts)
	if st.LastExit != "" {
		out += ", last exit " + st.LastExit
	}
	return out
}

// logEnd is the last n bytes of the file at path, from a line's start where there is one.
func logEnd(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err.Error()
	}
	off := max(0, info.Size()-n)
	b := make([]byte, info.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
		return err.Error()
	}
	if i := bytes.IndexByte(b, '\n'); off > 0 && i >= 0 {
		b = b[i+1:]
	}
	return string(bytes.TrimRight(b, "\n"))
}

// spawn starts one run of c.
func (s *Supervisor) spawn(c Component) (*proc, error) {
	log, err := os.OpenFile(s.LogPath(c.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	argv := append(append(slices.Clone(c.Via), c.Path), c.Args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), c.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a Ctrl-C on the terminal reaches `local up`, which stops the
	// components in order, not every component at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	fmt.Fprintf(log, "--- %s start %v\n", time.Now().Format(time.RFC3339), argv)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", c.Name, err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	s.mu.Lock()
	s.running[c.Name] = p
	st := s.states[c.Name]
	st.PID, st.State, st.Since = cmd.Process.Pid, Running, time.Now()
	s.saveLocked()
	s.mu.Unlock()
	return p, nil
}

// keep restarts c whenever it exits, until Stop.
func (s *Supervisor) keep(c Component, k *ctl, p *proc) {
	defer close(k.done)
	backoff := minBackoff
	for {
		started := time.Now()
		select {
		case <-k.stop:
			terminate(p, k.grace)
			s.setState(c.Name, Stopped, p.cmd.ProcessState.String())
			return
		case <-p.exited:
		}
		if time.Since(started) > stableAfter {
			backoff = minBackoff
		}
		s.setState(c.Name, Backoff, p.cmd.ProcessState.String())
		select {
		case <-k.stop:
			s.setState(c.Name, Stopped, "")
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
		next, err := s.spawn(c)
		if err != nil {
			s.setState(c.Name, Backoff, err.Error())
			continue
		}
		s.mu.Lock()
		s.states[c.Name].Restarts++
		s.saveLocked()
		s.mu.Unlock()
		p = next
	}
}

func (s *Supervisor) setState(name, state, lastExit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.states[name]
	st.State, st.Since = state, time.Now()
	if lastExit != "" {
		st.LastExit = lastExit
	}
	if state != Running {
		st.PID = 0
	}
	s.saveLocked()
}

// Stop stops the components in the reverse order of their start: SIGTERM, SIGKILL after grace.
func (s *Supervisor) Stop(grace time.Duration) {
	s.mu.Lock()
	order := slices.Clone(s.order)
	s.mu.Unlock()
	slices.Reverse(order)
	for _, name := range order {
		s.mu.Lock()
		k := s.ctls[name]
		s.mu.Unlock()
		k.grace = grace
		close(k.stop)
		<-k.done
	}
}

// terminate ends a run: SIGTERM, then SIGKILL after grace.
func terminate(p *proc, grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// Kill sends SIGKILL to a running component (for tests of the restart).
func (s *Supervisor) Kill(name string) error {
	s.mu.Lock()
	p := s.running[name]
	s.mu.Unlock()
	if p == nil {
		return fmt.Errorf("no component %s", name)
	}
	return p.cmd.Process.Kill()
}

// Signal sends sig to a running component and returns its PID; the component is started again
// after it exits, as a Deployment replaces a deleted pod (SIGTERM is what a pod deletion sends).
func (s *Supervisor) Signal(name string, sig syscall.Signal) (int, error) {
	s.mu.Lock()
	p := s.running[name]
	s.mu.Unlock()
	if p == nil {
		return 0, fmt.Errorf("no component %s", name)
	}
	return p.cmd.Process.Pid, p.cmd.Process.Signal(sig)
}

func (s *Supervisor) saveLocked() {
	var out []State
	for _, name := range s.order {
		out = append(out, *s.states[name])
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return
	}
	tmp := filepath.Join(s.dir, ".components.json.tmp")
	if os.WriteFile(tmp, data, 0o644) == nil {
		_ = os.Rename(tmp, filepath.Join(s.dir, "components.json"))
	}
}

// ReadStates reads components.json of stateDir; a recorded PID whose process is gone (or is
// another program now) reads as Stopped.
func ReadStates(stateDir string) ([]State, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, "components.json"))
	if err != nil {
		return nil, err
	}
	var out []State
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(stateDir, "components.json"), err)
	}
	for i := range out {
		if out[i].PID != 0 && !Alive(out[i].PID, out[i].Path) {
			out[i].State, out[i].PID = Stopped, 0
		}
	}
	return out, nil
}

// Alive reports whether pid runs the program at path (a recycled PID does not count).
func Alive(pid int, path string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	return exe == path
}

// HTTPReady is a readiness check (Process.Ready): GET url answers 200. tlsConfig, when set, gives
// the client its TLS configuration for an https url.
func HTTPReady(url string, tlsConfig func() (*tls.Config, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		tr := &http.Transport{}
		if tlsConfig != nil {
			cfg, err := tlsConfig()
			if err != nil {
				return err
			}
			tr.TLSClientConfig = cfg
		}
		defer tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}
