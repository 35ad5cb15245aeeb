package provider

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qvirt/qvirt/launcher/imagepull"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/local/podinit"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	v1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Container state reasons, as the kubelet writes them.
const (
	reasonCreating     = "ContainerCreating"
	reasonBackOff      = "CrashLoopBackOff"
	reasonImage        = "ErrImagePull"
	reasonImageBackOff = "ImagePullBackOff"
	reasonCompleted    = "Completed"
	reasonError        = "Error"
	reasonStartError   = "StartError"
	reasonSandboxFail  = "SandboxSetupFailed"

	// maxTerminationMessage is the kubelet's cap on a termination message.
	maxTerminationMessage = 4096
	// backoffReset is how long a container must run for its restart back-off to start over.
	backoffReset = 10 * time.Minute
)

// podRun supervises one pod: its sandbox (network namespace, volumes) and one goroutine per
// container. mu guards everything below it; notifications go out without it held.
type podRun struct {
	p   *pods
	key string
	dir string // podsDir/<uid>: volumes, termination files, pid files
	log string // logsDir/<ns>_<name>_<uid>

	stopCh chan struct{} // closed by the first stop
	done   chan struct{} // closed when processes and sandbox are gone

	mu           sync.Mutex
	pod          *corev1.Pod
	procs        []*os.Process // by container index; nil when not running
	netns        string
	cpuTasks     string             // the pod's cgroup's tasks file; "" when pods are not confined
	leases       []*imagepull.Lease // of the pod's image volumes, released when the pod is gone
	sandboxReady bool
	stopping     bool
	deleteObject bool
	finished     bool // processes and sandbox gone; run has read deleteObject
}

func newPodRun(p *pods, pod *corev1.Pod) *podRun {
	pod = pod.DeepCopy()
	uid := string(pod.UID)
	now := v1.Now()
	pod.Status.StartTime = &now
	pod.Status.HostIP = p.net.gateway.Addr().String()
	pod.Status.HostIPs = []corev1.HostIP{{IP: pod.Status.HostIP}}
	pod.Status.ContainerStatuses = make([]corev1.ContainerStatus, len(pod.Spec.Containers))
	for i, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses[i] = corev1.ContainerStatus{
			Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonCreating}},
		}
	}
	return &podRun{
		p:      p,
		key:    podKey(pod.Namespace, pod.Name),
		dir:    filepath.Join(PodsDir(p.opts.StateDir), uid),
		log:    filepath.Dir(LogPath(p.opts.StateDir, pod.Namespace, pod.Name, pod.UID, "")),
		stopCh: make(chan struct{}),
		done:   make(chan struct{}),
		pod:    pod,
		procs:  make([]*os.Process, len(pod.Spec.Containers)),
	}
}

func (r *podRun) uid() types.UID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pod.UID
}

func (r *podRun) snapshot() *corev1.Pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pod.DeepCopy()
}

func (r *podRun) updateMeta(pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pod.Labels = pod.Labels
	r.pod.Annotations = pod.Annotations
}

// update changes the status under the lock, recomputes phase and conditions, and notifies.
func (r *podRun) update(change func(st *corev1.PodStatus)) {
	r.mu.Lock()
	st := &r.pod.Status
	change(st)
	if st.Phase != corev1.PodFailed || st.Reason != reasonSandboxFail {
		st.Phase = podPhase(st.ContainerStatuses, r.pod.Spec.RestartPolicy, r.stopping)
	}
	st.Conditions = podConditions(st.Conditions, st.Phase, r.sandboxReady, st.ContainerStatuses, v1.Now())
	pod := r.pod.DeepCopy()
	r.mu.Unlock()
	r.p.notifyStatus(pod)
}

// run is the pod's life: sandbox, containers until none will run again, teardown.
func (r *podRun) run() {
	defer close(r.done)
	ctx := context.Background()
	uid := string(r.pod.UID)
	log := r.p.log.WithValues("pod", r.key, "uid", uid)
	mounts, err := r.prepareVolumes()
	if err == nil {
		err = r.setupNetwork(ctx, uid)
	}
	if err == nil {
		err = r.setupCPU()
	}
	if errors.Is(err, errStopped) {
		// Stopped while a volume was not ready: no container ever ran. The kubelet reports such a
		// container as below.
		r.update(func(st *corev1.PodStatus) {
			for i := range st.ContainerStatuses {
				st.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: 137, Reason: "ContainerStatusUnknown", FinishedAt: v1.Now(),
					Message: "the pod stopped before the container started: a volume was not ready"}}
			}
		})
	} else if err != nil {
		log.Error(err, "pod sandbox")
		r.update(func(st *corev1.PodStatus) {
			st.Phase, st.Reason, st.Message = corev1.PodFailed, reasonSandboxFail, err.Error()
			for i := range st.ContainerStatuses {
				st.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: 128, Reason: reasonSandboxFail, Message: err.Error(), FinishedAt: v1.Now()}}
			}
		})
	} else {
		var wg sync.WaitGroup
		for i := range r.pod.Spec.Containers {
			wg.Go(func() { r.superviseContainer(i, mounts) })
		}
		wg.Wait()
	}
	if err := r.p.net.del(ctx, r.pod); err != nil {
		log.Error(err, "pod network teardown")
	}
	if err := detachRecordedLoops(r.dir); err != nil {
		log.Error(err, "detach the pod's loop devices")
	}
	if err := r.p.cpu.removePod(r.pod.UID); err != nil {
		log.Error(err, "remove the pod's CPU cgroup")
	}
	r.releaseImages()
	_ = os.RemoveAll(r.dir)
	r.mu.Lock()
	r.sandboxReady = false
	r.finished = true
	deleting := r.deleteObject
	r.mu.Unlock()
	r.update(func(*corev1.PodStatus) {})
	log.Info("pod processes gone", "deleting", deleting)
	if deleting {
		r.finishDelete(ctx)
	}
}

func (r *podRun) setupNetwork(ctx context.Context, uid string) error {
	nsPath, ip, err := r.p.net.add(ctx, r.pod)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.netns = nsPath
	r.sandboxReady = true
	r.mu.Unlock()
	r.update(func(st *corev1.PodStatus) {
		st.PodIP = ip.String()
		st.PodIPs = []corev1.PodIP{{IP: ip.String()}}
	})
	return nil
}

// setupCPU gives the pod its CPU cgroup, where its processes start.
func (r *podRun) setupCPU() error {
	tasks, err := r.p.cpu.addPod(r.pod)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.cpuTasks = tasks
	r.mu.Unlock()
	return nil
}

// finishDelete deletes the pod object with grace 0 (its processes are gone, so nothing is left to
// wait for) and forgets the pod.
func (r *podRun) finishDelete(ctx context.Context) {
	pod := r.snapshot()
	zero := int64(0)
	err := r.p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, v1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &v1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		r.p.log.Error(err, "delete pod object", "pod", r.key)
	}
	r.p.forget(r)
}

// stop ends the pod: no more restarts, SIGTERM to every process now, SIGKILL to their process
// groups after grace. deleteObject asks for the pod object's deletion once all is gone. Safe to
// call many times; the first grace period wins.
func (r *podRun) stop(grace time.Duration, deleteObject bool) {
	r.mu.Lock()
	r.deleteObject = r.deleteObject || deleteObject
	first := !r.stopping
	r.stopping = true
	finished := r.finished
	procs := append([]*os.Process(nil), r.procs...)
	r.mu.Unlock()
	if finished {
		// Terminated on its own before: only the object (if asked) remains.
		if deleteObject {
			r.finishDelete(context.Background())
		}
		return
	}
	if !first {
		return
	}
	close(r.stopCh)
	for _, pr := range procs {
		if pr != nil {
			_ = pr.Signal(syscall.SIGTERM)
		}
	}
	go func() {
		select {
		case <-r.done:
		case <-time.After(grace):
			r.mu.Lock()
			procs := append([]*os.Process(nil), r.procs...)
			r.mu.Unlock()
			for _, pr := range procs {
				if pr != nil {
					_ = syscall.Kill(-pr.Pid, syscall.SIGKILL)
				}
			}
		}
	}()
}

func (r *podRun) isStopping() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopping
}

// superviseContainer runs container i until it ends for good under the restart policy or the pod
// stops, restarting it with exponential back-off.
func (r *podRun) superviseContainer(i int, vols map[string]volume) {
	backoff := r.p.opts.RestartBackoff
	for {
		if r.isStopping() {
			r.endWaiting(i)
			return
		}
		started := time.Now()
		term, err := r.runOnce(i, vols)
		if errors.Is(err, errNoBinary) {
			r.update(func(st *corev1.PodStatus) {
				st.ContainerStatuses[i].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
					Reason: reasonImage, Message: err.Error()}}
			})
			return
		}
		restart := !r.isStopping() && shouldRestart(r.pod.Spec.RestartPolicy, term.ExitCode)
		r.update(func(st *corev1.PodStatus) {
			cs := &st.ContainerStatuses[i]
			cs.Ready, cs.Started = false, new(false)
			if restart {
				cs.LastTerminationState = corev1.ContainerState{Terminated: term}
				cs.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
					Reason: reasonBackOff, Message: fmt.Sprintf("back-off %s restarting failed container", backoff)}}
				return
			}
			cs.State = corev1.ContainerState{Terminated: term}
		})
		if !restart {
			return
		}
		if time.Since(started) > backoffReset {
			backoff = r.p.opts.RestartBackoff
		}
		select {
		case <-r.stopCh:
			r.endWaiting(i)
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, MaxRestartBackoff)
		r.update(func(st *corev1.PodStatus) { st.ContainerStatuses[i].RestartCount++ })
	}
}

// endWaiting turns a container waiting for a restart that will not come into its last
// termination.
func (r *podRun) endWaiting(i int) {
	r.update(func(st *corev1.PodStatus) {
		cs := &st.ContainerStatuses[i]
		if cs.State.Waiting == nil {
			return
		}
		if t := cs.LastTerminationState.Terminated; t != nil {
			cs.State = corev1.ContainerState{Terminated: t.DeepCopy()}
			return
		}
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: reasonCompleted, Message: "pod stopped before the container started", FinishedAt: v1.Now()}}
	})
}

// runOnce starts container i, reports it Running, and waits for it. It returns how the container
// terminated; a start failure is a termination with exit code 128, as runtimes report it.
func (r *podRun) runOnce(i int, vols map[string]volume) (*corev1.ContainerStateTerminated, error) {
	c := &r.pod.Spec.Containers[i]
	started := v1.Now()
	cmd, bin, termFile, err := r.command(i, vols)
	if errors.Is(err, errNoBinary) {
		return nil, err
	}
	if err == nil {
		var sb sandbox
		if sb, err = r.sandbox(c, cmd.Path, bin, termFile, vols); err == nil {
			err = r.startProcess(i, cmd, sb, volumeMountStatuses(c, vols))
		}
	}
	if err != nil {
		return &corev1.ContainerStateTerminated{ExitCode: 128, Reason: reasonStartError, Message: err.Error(),
			StartedAt: started, FinishedAt: v1.Now()}, nil
	}
	stopProbes := r.startProbes(i, cmd.Process, started.Time)
	_ = cmd.Wait()
	stopProbes()
	// The container is gone when its main process is: leftovers of its process group go too.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	r.mu.Lock()
	r.procs[i] = nil
	r.mu.Unlock()
	_ = os.Remove(filepath.Join(r.dir, c.Name+".pid"))
	if f, ok := cmd.Stdout.(*os.File); ok {
		_ = f.Close()
	}
	code := exitCode(cmd.ProcessState)
	term := &corev1.ContainerStateTerminated{ExitCode: code, Reason: reasonCompleted, StartedAt: started, FinishedAt: v1.Now(),
		ContainerID: containerID(cmd.Process.Pid)}
	if code != 0 {
		term.Reason = reasonError
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		term.Signal = int32(ws.Signal())
	}
	term.Message = r.terminationMessage(c, termFile, code)
	return term, nil
}

// sandbox is container c's: the pod's network namespace and hostname, the hidden paths, and the
// binds of its volumes, its termination-message file, its devices and its "image" (the directories
// of its binary and of the init, so they stay reachable, read-only, even from under a hidden path).
func (r *podRun) sandbox(c *corev1.Container, initBin, bin, termFile string, vols map[string]volume) (sandbox, error) {
	r.mu.Lock()
	sb := sandbox{netns: r.netns, cpuTasks: r.cpuTasks, hostname: podHostname(r.pod), hidden: r.p.opts.HiddenPaths}
	r.mu.Unlock()
	sb.mounts = append(containerMounts(c, vols), bindMount{source: termFile, target: terminationPath(c), file: true})
	for _, p := range []string{initBin, bin} {
		// By its real path: a bind onto a symlink (Debian's /bin) fails.
		dir, err := filepath.EvalSymlinks(filepath.Dir(p))
		if err != nil {
			return sandbox{}, fmt.Errorf("image of container %s: %w", c.Name, err)
		}
		sb.mounts = append(sb.mounts, bindMount{source: dir, target: dir, readOnly: true})
	}
	devs, err := r.deviceMounts(c)
	if err != nil {
		return sandbox{}, err
	}
	sb.mounts = append(sb.mounts, devs...)
	blocks, err := r.blockDeviceMounts(c, vols)
	if err != nil {
		return sandbox{}, err
	}
	sb.mounts = append(sb.mounts, blocks...)
	return sb, nil
}

// startProcess starts container i's process in its sandbox and reports it running, with mounts
// as its volume mounts' status.
func (r *podRun) startProcess(i int, cmd *exec.Cmd, sb sandbox, mounts []corev1.VolumeMountStatus) error {
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return errors.New("pod is stopping")
	}
	// Start under the lock so stop sees the process and signals it.
	err := sb.start(cmd)
	if err == nil {
		r.procs[i] = cmd.Process
	}
	r.mu.Unlock()
	if err != nil {
		if f, ok := cmd.Stdout.(*os.File); ok {
			_ = f.Close()
		}
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	c := &r.pod.Spec.Containers[i]
	if err := writePidFile(filepath.Join(r.dir, c.Name+".pid"), cmd.Process.Pid); err != nil {
		r.p.log.Error(err, "pid file", "pod", r.key, "container", c.Name)
	}
	now := v1.Now()
	r.update(func(st *corev1.PodStatus) {
		cs := &st.ContainerStatuses[i]
		cs.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
		// With a readiness probe the container is Ready only once the probe passes (probe.go).
		cs.Ready, cs.Started = c.ReadinessProbe == nil, new(true)
		cs.ContainerID = containerID(cmd.Process.Pid)
		cs.VolumeMounts = mounts
	})
	return nil
}

func containerID(pid int) string { return fmt.Sprintf("process://%d", pid) }

// command builds container i's process: binary and argv from the image map with $(VAR) expanded,
// the resolved env, the log file as stdout and stderr, its own process group, and the pod's or
// container's runAsUser/runAsGroup, all through qvirt-pod-init in a new PID namespace. bin is the
// container's host binary; termFile is the fresh termination-message file.
func (r *podRun) command(i int, vols map[string]volume) (cmd *exec.Cmd, bin, termFile string, err error) {
	r.mu.Lock()
	pod := r.pod.DeepCopy()
	r.mu.Unlock()
	c := &pod.Spec.Containers[i]
	env, err := resolveEnv(pod, c, envSources{configMaps: r.p.configMaps, secrets: r.p.secrets,
		nodeAllocatable: defaultCapacity(), extra: r.p.opts.Env})
	if err != nil {
		return nil, "", "", err
	}
	lookup := envLookup(env)
	expand := func(ss []string) []string {
		out := make([]string, len(ss))
		for j, s := range ss {
			out[j] = expandVars(s, lookup)
		}
		return out
	}
	bin, args, err := argv(r.p.opts.Images, c.Image, expand(c.Command), expand(c.Args))
	if err != nil {
		return nil, "", "", err
	}
	termFile = filepath.Join(r.dir, c.Name+".termination-log")
	if err := os.WriteFile(termFile, nil, 0o666); err != nil {
		return nil, "", "", fmt.Errorf("termination-message file: %w", err)
	}
	_ = os.Chmod(termFile, 0o666)
	if err := os.MkdirAll(r.log, 0o755); err != nil {
		return nil, "", "", fmt.Errorf("log dir: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(r.log, c.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, "", "", fmt.Errorf("container log: %w", err)
	}
	initBin := r.p.opts.InitBinary
	cmd = &exec.Cmd{Path: initBin, Args: append([]string{initBin}, podinit.Args(bin, args, credential(pod, c))...),
		Env: env, Dir: c.WorkingDir, Stdout: logf, Stderr: logf}
	if cmd.Dir == "" {
		cmd.Dir = "/"
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: syscall.CLONE_NEWPID}
	return cmd, bin, termFile, nil
}

// credential is the container's runAsUser/runAsGroup, falling back to the pod's; nil runs as the
// provider's user.
func credential(pod *corev1.Pod, c *corev1.Container) *syscall.Credential {
	var uid, gid *int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
	}
	if uid == nil && gid == nil {
		return nil
	}
	cred := &syscall.Credential{}
	if uid != nil {
		cred.Uid = uint32(*uid)
	}
	if gid != nil {
		cred.Gid = uint32(*gid)
	} else if uid != nil {
		cred.Gid = uint32(*uid)
	}
	return cred
}

func exitCode(ps *os.ProcessState) int32 {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(ps.ExitCode())
}

func terminationPath(c *corev1.Container) string {
	if c.TerminationMessagePath != "" {
		return c.TerminationMessagePath
	}
	return corev1.TerminationMessagePathDefault
}

// terminationMessage is what the container wrote to its termination-message file, or with
// FallbackToLogsOnError and a failure, the tail of its log.
func (r *podRun) terminationMessage(c *corev1.Container, termFile string, code int32) string {
	msg := readTail(termFile, maxTerminationMessage, false)
	if msg == "" && code != 0 && c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		msg = readTail(filepath.Join(r.log, c.Name+".log"), 2048, true)
	}
	return msg
}

// readTail reads at most n bytes of a file: its head, or its tail when tail is set.
func readTail(path string, n int64, tail bool) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if tail {
		if fi, err := f.Stat(); err == nil && fi.Size() > n {
			_, _ = f.Seek(fi.Size()-n, io.SeekStart)
		}
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}

// EmptyDirPath is where a virtual node keeps pod podUID's emptyDir volume: the kubelet's layout
// (/var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~empty-dir/<volume>) under the node's state
// directory, so the node agent finds a launcher's sockets the same way on both kinds of node.
func EmptyDirPath(stateDir string, podUID types.UID, volume string) string {
	return podlayout.EmptyDir(PodsDir(stateDir), string(podUID), volume)
}

// PodsDir is a virtual node's counterpart of the kubelet's /var/lib/kubelet/pods.
func PodsDir(stateDir string) string { return filepath.Join(stateDir, podsDir) }

// volume is a pod volume's host path.
type volume struct {
	path string
	file bool
	// readOnly binds it read-only whatever the mount says (an image volume).
	readOnly bool
	// imageRef is an image volume's image by digest, for the container statuses.
	imageRef string
	// rdev is the device number of a block-mode claim's loop device; path is then the device.
	rdev uint64
}

// prepareVolumes makes the pod's directories and resolves its volumes: hostPath is the host path
// itself (created for the *OrCreate types), emptyDir a directory under the pod's state dir, image
// the pulled image, secret the Secret's files (secrets.go), configMap, downwardAPI and projected
// their files (configvolumes.go). Other volume sources are refused.
func (r *podRun) prepareVolumes() (map[string]volume, error) {
	if len(r.pod.Spec.InitContainers) > 0 {
		return nil, errors.New("spec.initContainers: not supported by the local node provider")
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, fmt.Errorf("pod dir: %w", err)
	}
	vols := map[string]volume{}
	for i, v := range r.pod.Spec.Volumes {
		switch {
		case v.HostPath != nil:
			vol, err := hostPathVolume(v.HostPath, r.p.opts.HostPathRoots)
			if err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			vols[v.Name] = vol
		case v.EmptyDir != nil:
			dir := EmptyDirPath(r.p.opts.StateDir, r.pod.UID, v.Name)
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			// World-writable like the kubelet's, whatever runAsUser the containers have.
			_ = os.Chmod(dir, 0o777)
			vols[v.Name] = volume{path: dir}
		case v.Image != nil:
			vol, err := r.pullImageVolume(&r.pod.Spec.Volumes[i])
			if errors.Is(err, errStopped) {
				return nil, err
			}
			if err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			vols[v.Name] = vol
		case v.Secret != nil:
			vol, err := r.secretVolume(v.Name, v.Secret)
			if err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			vols[v.Name] = vol
		case v.ConfigMap != nil:
			vol, err := r.configMapVolume(v.Name, v.ConfigMap)
			if err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			vols[v.Name] = vol
		case v.DownwardAPI != nil:
			vol, err := r.downwardAPIVolume(v.Name, v.DownwardAPI)
			if err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			vols[v.Name] = vol
		case v.Projected != nil:
			vol, err := r.projectedVolume(v.Name, v.Projected)
			if err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			vols[v.Name] = vol
		case v.PersistentVolumeClaim != nil:
			vol, err := r.claimVolume(v.Name, v.PersistentVolumeClaim)
			if err != nil {
				return nil, fmt.Errorf("spec.volumes[%d] (%s): %w", i, v.Name, err)
			}
			vols[v.Name] = vol
		default:
			return nil, fmt.Errorf("spec.volumes[%d] (%s): only hostPath, emptyDir, image, secret, configMap, downwardAPI, projected and persistentVolumeClaim are supported by the local node provider", i, v.Name)
		}
	}
	return vols, nil
}

// errStopped ends a pod's preparation when the pod is stopped while it waits for a volume: to pull
// an image again, or for an object or a claim's binding.
var errStopped = errors.New("the pod stopped before its volumes were ready")

// pullError is a failed pull of an image volume's image, which a kubelet retries.
type pullError struct{ err error }

func (e *pullError) Error() string { return e.err.Error() }
func (e *pullError) Unwrap() error { return e.err }

// pullImageVolume gets the image of image volume v as a kubelet does. A failed pull leaves the
// containers that mount the volume waiting with reason ErrImagePull and the pull's error, then
// ImagePullBackOff ("Back-off pulling image ...") until the provider pulls again: after
// ImagePullBackoff, doubling up to MaxImagePullBackoff, for as long as the pod exists. The pod
// stays Pending meanwhile; it does not fail.
func (r *podRun) pullImageVolume(v *corev1.Volume) (volume, error) {
	backoff := r.p.opts.ImagePullBackoff
	for {
		vol, err := r.imageVolume(v.Image)
		var pe *pullError
		if !errors.As(err, &pe) {
			if err == nil {
				r.setImageWaiting(v.Name, reasonCreating, "")
			}
			return vol, err
		}
		r.p.log.Info("image volume pull failed", "pod", r.key, "volume", v.Name, "retryIn", backoff, "error", err.Error())
		// A kubelet shows ErrImagePull until its next look at the pod, then ImagePullBackOff for
		// the rest of the back-off.
		r.setImageWaiting(v.Name, reasonImage, err.Error())
		shown := min(backoff/2, 2*time.Second)
		if !r.wait(shown) {
			return volume{}, errStopped
		}
		r.setImageWaiting(v.Name, reasonImageBackOff, fmt.Sprintf("Back-off pulling image %q: %v", v.Image.Reference, err))
		if !r.wait(backoff - shown) {
			return volume{}, errStopped
		}
		backoff = min(2*backoff, MaxImagePullBackoff)
	}
}

// wait sleeps for d unless the pod stops first; it reports whether the pod is still to run.
func (r *podRun) wait(d time.Duration) bool {
	select {
	case <-r.stopCh:
		return false
	case <-time.After(d):
		return true
	}
}

// setImageWaiting sets the waiting reason and message of each container that mounts volume.
func (r *podRun) setImageWaiting(volume, reason, message string) {
	r.update(func(st *corev1.PodStatus) {
		for i, c := range r.pod.Spec.Containers {
			if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume }) {
				continue
			}
			st.ContainerStatuses[i].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
		}
	})
}

// imageVolume pulls (or finds in the node's cache, checked) the image of an image volume with the
// pod's imagePullSecrets, as the kubelet does, and holds it until the pod is gone. A failed pull
// is a *pullError.
func (r *podRun) imageVolume(src *corev1.ImageVolumeSource) (volume, error) {
	if r.p.images == nil {
		return volume{}, fmt.Errorf("image %s: this node has no image cache (provider Options.ImageCache)", src.Reference)
	}
	auth, skipped := podKeychain(r.pod, r.p.secrets)
	for _, err := range skipped {
		r.p.log.Info("pulling without an imagePullSecret", "pod", r.key, "image", src.Reference, "reason", err.Error())
	}
	lease, err := r.p.images.Acquire(context.Background(), src.Reference, imagepull.PullPolicy(src.PullPolicy), auth)
	if err != nil {
		return volume{}, &pullError{err}
	}
	if lease.Discarded != nil {
		r.p.log.Info("cached image changed after unpacking: pulled again", "pod", r.key, "image", src.Reference, "reason", lease.Discarded.Error())
	}
	r.mu.Lock()
	r.leases = append(r.leases, lease)
	r.mu.Unlock()
	return volume{path: lease.Dir, readOnly: true, imageRef: lease.ImageRef}, nil
}

func (r *podRun) releaseImages() {
	r.mu.Lock()
	leases := r.leases
	r.leases = nil
	r.mu.Unlock()
	for _, l := range leases {
		l.Release()
	}
}

// volumeMountStatuses are container c's mounts for its status, with the digest of the image of an
// image volume. The kubelet reports them once the container exists, with its start.
func volumeMountStatuses(c *corev1.Container, vols map[string]volume) []corev1.VolumeMountStatus {
	var out []corev1.VolumeMountStatus
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			continue
		}
		ms := corev1.VolumeMountStatus{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly || v.readOnly}
		if v.imageRef != "" {
			ms.VolumeStatus = &corev1.VolumeStatus{Image: &corev1.ImageVolumeStatus{ImageRef: v.imageRef}}
		}
		out = append(out, ms)
	}
	return out
}

func hostPathVolume(hp *corev1.HostPathVolumeSource, roots map[string]string) (volume, error) {
	hp = hp.DeepCopy()
	hp.Path = redirect(hp.Path, roots)
	t := corev1.HostPathUnset
	if hp.Type != nil {
		t = *hp.Type
	}
	switch t {
	case corev1.HostPathDirectoryOrCreate:
		if err := os.MkdirAll(hp.Path, 0o755); err != nil {
			return volume{}, fmt.Errorf("hostPath %s: %w", hp.Path, err)
		}
	case corev1.HostPathFileOrCreate:
		f, err := os.OpenFile(hp.Path, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return volume{}, fmt.Errorf("hostPath %s: %w", hp.Path, err)
		}
		_ = f.Close()
	}
	fi, err := os.Stat(hp.Path)
	if err != nil {
		return volume{}, fmt.Errorf("hostPath %s: %w", hp.Path, err)
	}
	return volume{path: hp.Path, file: !fi.IsDir()}, nil
}

// redirect is path under the root its longest matching prefix in roots maps to, or path itself.
func redirect(path string, roots map[string]string) string {
	best := ""
	for prefix := range roots {
		if (path == prefix || strings.HasPrefix(path, strings.TrimSuffix(prefix, "/")+"/")) && len(prefix) > len(best) {
			best = prefix
		}
	}
	if best == "" {
		return path
	}
	return filepath.Join(roots[best], strings.TrimPrefix(path, best))
}

// containerMounts are the container's volumeMounts as binds; a hostPath mounted at its own path
// read-write needs none.
func containerMounts(c *corev1.Container, vols map[string]volume) []bindMount {
	var out []bindMount
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			continue
		}
		src := v.path
		if m.SubPath != "" {
			src = filepath.Join(src, m.SubPath)
		}
		fi, err := os.Stat(src)
		file := err == nil && !fi.IsDir()
		out = append(out, bindMount{source: src, target: m.MountPath, readOnly: m.ReadOnly || v.readOnly, file: file})
	}
	return out
}

// devices are the device nodes behind the device resources a container may request, as the
// kubelet's device plugins give them.
var devices = map[corev1.ResourceName]struct {
	path         string
	major, minor uint32
}{
	ResourceTun: {"/dev/net/tun", 10, 200},
	ResourceKVM: {"/dev/kvm", 10, 232},
}

// deviceMounts give the container the devices it requests the way a container runtime does on a
// real node: a node of its own, openable by whatever user the container runs as (a host's device
// node may be root's alone), bound over the host's in the container's mount namespace.
func (r *podRun) deviceMounts(c *corev1.Container) ([]bindMount, error) {
	var out []bindMount
	for res, dev := range devices {
		if _, ok := c.Resources.Limits[res]; !ok {
			continue
		}
		if _, err := os.Stat(dev.path); err != nil {
			continue // the host has none: the container sees that, as on a real node without it
		}
		node := filepath.Join(r.dir, "dev", c.Name, filepath.Base(dev.path))
		if err := os.MkdirAll(filepath.Dir(node), 0o755); err != nil {
			return nil, err
		}
		_ = os.Remove(node)
		if err := unix.Mknod(node, unix.S_IFCHR|0o666, int(unix.Mkdev(dev.major, dev.minor))); err != nil {
			return nil, fmt.Errorf("device %s for %s: %w", dev.path, res, err)
		}
		if err := os.Chmod(node, 0o666); err != nil { // past the umask
			return nil, err
		}
		out = append(out, bindMount{source: node, target: dev.path, file: true})
	}
	return out, nil
}
