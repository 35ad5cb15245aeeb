package provider

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/qvirt/qvirt/internal/ctxsleep"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Probes, as the kubelet runs them (pkg/kubelet/prober): one worker per container run and probe
// kind, from the container's start; after initialDelaySeconds a probe every periodSeconds, each
// bounded by timeoutSeconds; a result changes only after successThreshold successes or
// failureThreshold failures in a row. Readiness starts as failed (the container is not Ready until
// its probe passes) and sets the container's ready flag, from which the pod's Ready condition and
// so Service endpoints follow. Liveness starts as passed; once it fails, the container is killed
// like a pod's deletion kills it (SIGTERM, SIGKILL after the grace period) and the restart policy
// decides what follows. An exec probe runs its command in the container's namespaces, as the
// container's user, and passes when it exits 0. A probe that cannot run at all (a gRPC probe,
// which virtual nodes do not run, or a port name the container does not declare) changes
// nothing, as a kubelet's probe error does, and says so in an Event.

// Probe defaults, the API server's for a pod's probe; pods reach the provider defaulted, but the
// zero values must never mean "probe continuously".
const (
	defaultProbePeriod    = 10 * time.Second
	defaultProbeTimeout   = time.Second
	defaultProbeSuccesses = 1
	defaultProbeFailures  = 3
	// probeUserAgent is what the kubelet's HTTP probes send (kube-probe/<major>.<minor>).
	probeUserAgent = "kube-probe/1.37"
	// maxProbeBody is how much of a response body an HTTP probe reads, as the kubelet.
	maxProbeBody = 10 << 10
	// maxProbeRedirects is how many redirects an HTTP probe follows.
	maxProbeRedirects = 10
)

// Event reasons of probes, the kubelet's.
const (
	eventUnhealthy = "Unhealthy"
	eventKilling   = "Killing"
	eventProbeWarn = "ProbeWarning"
)

type probeKind string

const (
	readiness probeKind = "Readiness"
	liveness  probeKind = "Liveness"
)

// errProbeNotRun is a probe that could not run: no result, as a kubelet's probe error.
var errProbeNotRun = errors.New("probe not run")

// startProbes starts the probe workers of container i's run by proc, which began at started; the
// returned function stops them and waits for them (call it once the process is gone). Without a
// readiness probe the container is Ready from its start, as startProcess marked it.
func (r *podRun) startProbes(i int, proc *os.Process, started time.Time) (stop func()) {
	r.mu.Lock()
	c := r.pod.Spec.Containers[i].DeepCopy()
	r.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	n := 0
	for _, w := range []struct {
		kind  probeKind
		probe *corev1.Probe
	}{{readiness, c.ReadinessProbe}, {liveness, c.LivenessProbe}} {
		if w.probe == nil {
			continue
		}
		n++
		go func() {
			defer func() { done <- struct{}{} }()
			r.probeWorker(ctx, i, c, w.kind, w.probe, proc, started)
		}()
	}
	return func() {
		cancel()
		for range n {
			<-done
		}
	}
}

// probeWorker runs one probe of one container run until ctx ends or, for liveness, the probe
// failed and the container was told to stop.
func (r *podRun) probeWorker(ctx context.Context, i int, c *corev1.Container, kind probeKind, pr *corev1.Probe, proc *os.Process, started time.Time) {
	period := seconds(pr.PeriodSeconds, defaultProbePeriod)
	timeout := seconds(pr.TimeoutSeconds, defaultProbeTimeout)
	successes := int(max(pr.SuccessThreshold, defaultProbeSuccesses))
	failures := int(pr.FailureThreshold)
	if failures <= 0 {
		failures = defaultProbeFailures
	}
	delay := time.Until(started.Add(time.Duration(pr.InitialDelaySeconds) * time.Second))
	if !ctxsleep.Sleep(ctx, delay) {
		return
	}
	passing := kind == liveness // the kubelet's initial results
	var last bool
	run := 0
	for {
		ok, out, err := r.runProbe(ctx, c, pr, timeout)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.p.event(r.snapshot(), corev1.EventTypeWarning, eventProbeWarn, fmt.Sprintf("%s probe of container %s not run: %v", kind, c.Name, err))
		default:
			if ok == last {
				run++
			} else {
				last, run = ok, 1
			}
			if !ok {
				r.p.event(r.snapshot(), corev1.EventTypeWarning, eventUnhealthy, fmt.Sprintf("%s probe failed: %s", kind, out))
			}
			if ok != passing && (ok && run >= successes || !ok && run >= failures) {
				passing = ok
				if kind == liveness {
					r.killForLiveness(c, proc)
					return
				}
				r.setReady(i, proc, ok)
			}
		}
		if !ctxsleep.Sleep(ctx, period) {
			return
		}
	}
}

// setReady records container i's readiness, unless the process has been replaced meanwhile.
func (r *podRun) setReady(i int, proc *os.Process, ready bool) {
	r.update(func(st *corev1.PodStatus) {
		cs := &st.ContainerStatuses[i]
		if cs.State.Running != nil && cs.ContainerID == containerID(proc.Pid) {
			cs.Ready = ready
		}
	})
}

// killForLiveness stops a container whose liveness probe failed, as the kubelet does: SIGTERM,
// then SIGKILL to its process group after the probe's or the pod's grace period. The container's
// supervisor sees it end and applies the restart policy.
func (r *podRun) killForLiveness(c *corev1.Container, proc *os.Process) {
	pod := r.snapshot()
	r.p.event(pod, corev1.EventTypeNormal, eventKilling, fmt.Sprintf("Container %s failed liveness probe, will be restarted", c.Name))
	grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	if c.LivenessProbe.TerminationGracePeriodSeconds != nil {
		grace = *c.LivenessProbe.TerminationGracePeriodSeconds
	}
	_ = proc.Signal(syscall.SIGTERM)
	go func() {
		t := time.NewTimer(time.Duration(grace) * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
			// The process may be gone and its pid reused only once it has been waited for, which
			// clears r.procs[i]: kill only while it is still this container's process.
			r.mu.Lock()
			alive := slices.Contains(r.procs, proc)
			r.mu.Unlock()
			if alive {
				_ = syscall.Kill(-proc.Pid, syscall.SIGKILL)
			}
		case <-r.done:
		}
	}()
}

// runProbe runs one probe against the pod: ok and the kubelet's output for a result, or an error
// when the probe could not run.
func (r *podRun) runProbe(ctx context.Context, c *corev1.Container, pr *corev1.Probe, timeout time.Duration) (ok bool, out string, err error) {
	pod := r.snapshot()
	host := pod.Status.PodIP
	switch {
	case pr.TCPSocket != nil:
		port, err := probePort(pr.TCPSocket.Port, c)
		if err != nil {
			return false, "", err
		}
		if pr.TCPSocket.Host != "" {
			host = pr.TCPSocket.Host
		}
		return probeTCP(ctx, net.JoinHostPort(host, strconv.Itoa(port)), timeout)
	case pr.HTTPGet != nil:
		g := pr.HTTPGet
		port, err := probePort(g.Port, c)
		if err != nil {
			return false, "", err
		}
		if g.Host != "" {
			host = g.Host
		}
		return probeHTTP(ctx, g, net.JoinHostPort(host, strconv.Itoa(port)), timeout)
	case pr.Exec != nil:
		return r.probeExec(ctx, c, pr.Exec.Command, timeout)
	case pr.GRPC != nil:
		return false, "", fmt.Errorf("%w: gRPC probes are not run by local mode's virtual nodes", errProbeNotRun)
	}
	return false, "", fmt.Errorf("%w: the probe has no action", errProbeNotRun)
}

// probePort is a probe's port number: the number, or the container port of that name.
func probePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal < 1 || p.IntVal > 65535 {
			return 0, fmt.Errorf("%w: port %d out of range", errProbeNotRun, p.IntVal)
		}
		return int(p.IntVal), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("%w: container %s has no port named %q", errProbeNotRun, c.Name, p.StrVal)
}

func probeTCP(ctx context.Context, addr string, timeout time.Duration) (bool, string, error) {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false, err.Error(), nil
	}
	_ = conn.Close()
	return true, "", nil
}

// probeHTTP sends the kubelet's GET: its User-Agent and Accept unless the probe sets them, TLS
// without verification for HTTPS, redirects followed; a status from 200 to 399 passes.
func probeHTTP(ctx context.Context, g *corev1.HTTPGetAction, hostPort string, timeout time.Duration) (bool, string, error) {
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	u := &url.URL{Scheme: scheme, Host: hostPort}
	if g.Path != "" {
		ref, err := url.Parse(g.Path)
		if err != nil {
			return false, "", fmt.Errorf("%w: path %q: %v", errProbeNotRun, g.Path, err)
		}
		u = u.ResolveReference(ref)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, "", fmt.Errorf("%w: %v", errProbeNotRun, err)
	}
	req.Header.Set("User-Agent", probeUserAgent)
	req.Header.Set("Accept", "*/*")
	for _, h := range g.HTTPHeaders {
		if h.Name == "Host" {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	client := &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true, Proxy: nil},
		CheckRedirect: func(_ *http.Request, via []*http.Request) error {
			if len(via) >= maxProbeRedirects {
				return errors.New("stopped after 10 redirects")
			}
			return nil
		},
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error(), nil
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody))
	if resp.StatusCode >= http.StatusOK && resp.StatusCode < http.StatusBadRequest {
		return true, "", nil
	}
	return false, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode), nil
}

func seconds(n int32, def time.Duration) time.Duration {
	if n <= 0 {
		return def
	}
	return time.Duration(n) * time.Second
}

// probeExec runs an exec probe's command in container c (its image's binary, command[0] as
// argv[0], as argv maps a container's command) with the container's environment and user; exit 0
// passes, and the output (at most maxProbeBody bytes) is the failure's message. A command that
// outlives the timeout is killed and fails, as the kubelet's exec probes do.
func (r *podRun) probeExec(ctx context.Context, c *corev1.Container, command []string, timeout time.Duration) (bool, string, error) {
	if len(command) == 0 {
		return false, "", fmt.Errorf("%w: exec probe without a command", errProbeNotRun)
	}
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	i := slices.IndexFunc(pod.Spec.Containers, func(x corev1.Container) bool { return x.Name == c.Name })
	var proc *os.Process
	if i >= 0 {
		proc = r.procs[i]
	}
	r.mu.Unlock()
	if proc == nil {
		return false, "", fmt.Errorf("%w: container %s is not running", errProbeNotRun, c.Name)
	}
	bin, args, err := argv(r.p.opts.Images, c.Image, command, nil)
	if err != nil {
		return false, "", fmt.Errorf("%w: %v", errProbeNotRun, err)
	}
	env, err := resolveEnv(pod, c, envSources{configMaps: r.p.configMaps, secrets: r.p.secrets,
		nodeAllocatable: defaultCapacity(), extra: r.p.opts.Env})
	if err != nil {
		return false, "", fmt.Errorf("%w: environment: %v", errProbeNotRun, err)
	}
	out := &cappedBuffer{max: maxProbeBody}
	cmd := &exec.Cmd{Path: bin, Args: args, Env: env, Dir: "/", Stdout: out, Stderr: out}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: credential(pod, c)}
	if err := startInContainer(proc.Pid, cmd); err != nil {
		return false, "", fmt.Errorf("%w: %v", errProbeNotRun, err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err = <-waited:
	case <-t.C:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
		return false, fmt.Sprintf("command %q timed out", strings.Join(command, " ")), nil
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
		return false, "", ctx.Err()
	}
	if err == nil {
		return true, out.String(), nil
	}
	msg := out.String()
	if msg == "" {
		msg = fmt.Sprintf("command %q exited with code %d", strings.Join(command, " "), cmd.ProcessState.ExitCode())
	}
	return false, msg, nil
}

// cappedBuffer keeps the first max bytes written to it and discards the rest.
type cappedBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
