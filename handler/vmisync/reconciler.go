// Package vmisync is the node agent's (qvirt-handler's) instance reconciler: for each instance on its node it
// sets up the guest's network in the launcher pod, starts the VM through the launcher's command
// socket, reflects the launcher's status in the instance's status and shuts the guest down when the
// instance is deleted. It reacts to the launchers' pushed status streams, not by polling.
//
// Who owns what in an instance's status: the cluster controller owns Pending, Scheduling and
// Scheduled and ends an instance whose pod failed or vanished; this reconciler owns Running,
// Succeeded and Failed from the guest, the Ready, Paused and Synchronized conditions, interfaces,
// volumeStatus and the QEMU and launcher versions.
package vmisync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	crhandler "sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/internal/patch"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// Event reasons on instances.
const (
	EventStarted             = "Started"
	EventGuestEnded          = "GuestEnded"
	EventShuttingDown        = "ShuttingDown"
	EventLauncherUnreachable = "LauncherUnreachable"
	EventSyncFailed          = "SyncFailed"
	EventNetworkSetupFailed  = "NetworkSetupFailed"
	EventKilledLeftover      = "KilledLeftoverGuest"
	// EventForeignLauncher: the process serving the launcher socket is not of the VMI's pod.
	EventForeignLauncher = "ForeignLauncher"
	// EventFeaturesLeftOut: the node left something of the spec out (translate's notes: Hyper-V
	// under emulation), with the reason.
	EventFeaturesLeftOut = "FeaturesLeftOut"
)

// Workers is how many of the node's instances are reconciled at once.
const Workers = 8

// Reconciler drives the launchers of the instances on one node.
type Reconciler struct {
	Client   client.Client
	Recorder record.EventRecorder
	// NodeName is this node; instances elsewhere are ignored.
	NodeName string
	// PodsDir is the kubelet's pods directory (podlayout.KubeletPodsDir on a node), where each
	// launcher pod's sockets volume is (podsockets.Dir).
	PodsDir string
	// Targets reads the instances migrating to this node (see TargetCacheOptions); their
	// status.nodeName is still the source's.
	Targets client.Reader
	// TargetSource is the watch of Targets' instances.
	TargetSource source.Source
	// Migrations is the cluster's migration configuration as it is now (qvirt-config): the
	// bandwidth per migration (0: unlimited) and the progress timeout. Unlimited bandwidth and no
	// progress timeout when nil.
	MigrationConfig func() config.MigrationConfig
	// Migrations carries this node's migration streams between node agents over mutual TLS
	// (handler/migproxy); without it the node can be neither source nor target.
	Migrations MigrationTunnel
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Launcher limits each call to a launcher and each reply (launcher.ClientOptions); the
	// production limits when zero. A launcher is untrusted: one that hangs costs its own instance
	// a timeout per retry, never the node's workers.
	Launcher launcher.ClientOptions
	// CPUManagerState is the kubelet's CPU manager checkpoint (cpumanager.StateFile), which shows
	// the CPUs a launcher's container has for itself; without it no vCPU is made real-time.
	CPUManagerState string

	// APIReader reads what the cache does not hold (the instance's PersistentVolumeClaims);
	// Client when nil.
	APIReader client.Reader

	launchers *launchers
	// superseded spares the conflict of a pass that read a version its own last write replaced
	// (the launcher's status stream queues the instance again while that write is on its way).
	superseded patch.Superseded
}

// SetupWithManager registers the reconciler. The manager's cache must hold only this node's
// instances and launcher pods (see CacheOptions).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.launchers = newLaunchers(r.Launcher, mgr.GetLogger().WithName("launchers"))
	if err := mgr.Add(stopStreams{r.launchers}); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).Named("node-vmi").
		// A Sync waits for QEMU to start and netsetup works in the pod's namespace: instances
		// starting together must not queue behind each other (the queue never runs one instance
		// twice at once; the launcher table is locked).
		WithOptions(controller.Options{MaxConcurrentReconciles: Workers}).
		For(&v1alpha1.VirtualMachineInstance{}).
		Watches(&corev1.Pod{}, crhandler.EnqueueRequestsFromMapFunc(podToVMI)).
		WatchesRawSource(source.Channel(r.launchers.events, &crhandler.EnqueueRequestForObject{}))
	if r.TargetSource != nil {
		b = b.WatchesRawSource(r.TargetSource)
	}
	return b.Complete(r)
}

// podToVMI maps a launcher pod to its instance (same namespace, name in the label).
func podToVMI(_ context.Context, o client.Object) []reconcile.Request {
	name := o.GetLabels()[v1alpha1.VMINameLabel]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: name}}}
}

// stopStreams ends the status streams when the manager stops; the launchers keep their VMs.
type stopStreams struct{ ls *launchers }

func (s stopStreams) Start(ctx context.Context) error {
	<-ctx.Done()
	s.ls.stopAll()
	return nil
}

// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances,verbs=get;list;watch
// +kubebuilder:rbac:groups=qvirt.io,resources=virtualmachineinstances/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get

// Reconcile brings one instance's launcher in line with the instance and the instance's status in
// line with the launcher. A status write that lost to a newer version is requeued (patch.Result).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return patch.Result(r.reconcile(ctx, req))
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var v v1alpha1.VirtualMachineInstance
	err := r.Client.Get(ctx, req.NamespacedName, &v)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	if r.superseded.Read(req.NamespacedName, &v, err) {
		return patch.StaleResult(), nil
	}
	if err != nil || v.Status.NodeName != r.NodeName {
		// Not (or no longer) running here: gone, migrated away, or coming here by migration.
		if err == nil {
			r.launchers.forget(v.UID)
		} else {
			r.launchers.forgetKey(req.NamespacedName)
		}
		return r.reconcileIncoming(ctx, req)
	}
	if v.Status.Phase.Final() {
		r.launchers.forget(v.UID)
		return ctrl.Result{}, r.stopLeftover(ctx, &v)
	}
	pod, err := r.launcherPod(ctx, &v)
	if err != nil {
		return ctrl.Result{}, err
	}
	if pod == nil || pod.Status.Phase != corev1.PodRunning {
		// The pod watch brings the instance back when its pod runs; a pod that ended or went
		// away may have left the guest's end in the status stream.
		return ctrl.Result{}, r.recordStreamedEnd(ctx, &v, pod)
	}
	r.launchers.place(v.UID, podsockets.Dir(r.PodsDir, pod.UID, v.UID))
	log := logr.FromContextOrDiscard(ctx).WithValues("pod", pod.Name)
	ctx = logr.NewContext(ctx, log)

	before := v.DeepCopy()
	s := &syncState{v: &v, pod: pod}
	syncErr := r.runPhases(ctx, s)
	if after, ok := waitFor(syncErr); ok {
		// The launcher phase waits: there is no launcher status to write.
		return ctrl.Result{RequeueAfter: after}, nil
	}
	r.applyStatus(s)
	if err := r.patchStatus(ctx, before, &v); err != nil {
		return ctrl.Result{}, err
	}
	if syncErr != nil {
		return ctrl.Result{}, syncErr
	}
	return ctrl.Result{RequeueAfter: s.requeueAfter}, nil
}

// syncState is one reconcile of an instance running on this node, shared by its phases: each
// phase reads what the earlier ones found and adds its own.
type syncState struct {
	v   *v1alpha1.VirtualMachineInstance
	pod *corev1.Pod
	// st is the launcher's status, set by the launcher phase; nil when the launcher cannot be
	// reached or is gone with its pod, which ends the phases.
	st *protocol.Status
	// failures are the hotplug failures per volume, for the instance's volumeStatus.
	failures hotplugFailures
	// requeueAfter asks for another reconcile that long after this one, when no event will come:
	// the shortest wait of a phase that the phases after it did not wait for (runPhases).
	requeueAfter time.Duration
}

// phase is one step of bringing the launcher in line with the instance. A hotplug phase is
// independent of the other hotplug phases: its failure (retried, with an Event) must not hold back
// theirs, so a volume that cannot be attached does not keep a vCPU or a NIC from being plugged.
type phase struct {
	name    string
	run     func(context.Context, *syncState) error
	hotplug bool
}

// phases are the steps of a reconcile, in order: the launcher runs the instance (and its status is
// known) before a migration, real-time vCPUs, disk, NIC, vCPU or memory is synced with it.
func (r *Reconciler) phases() []phase {
	return []phase{
		{name: "launcher", run: r.launcherPhase},
		{name: "source migration", run: func(ctx context.Context, s *syncState) error { return r.syncSourceMigration(ctx, s.v, s.st) }},
		{name: "realtime", run: func(ctx context.Context, s *syncState) error { return r.syncRealtime(ctx, s.v, s.pod, s.st) }, hotplug: true},
		{name: "disks", run: r.disksPhase, hotplug: true},
		{name: "nics", run: func(ctx context.Context, s *syncState) error { return r.syncNICs(ctx, s.v, s.pod, s.st) }, hotplug: true},
		{name: "cpus", run: func(ctx context.Context, s *syncState) error { return r.syncCPUs(ctx, s.v, s.st) }, hotplug: true},
		{name: "memory", run: func(ctx context.Context, s *syncState) error { return r.syncMemory(ctx, s.v, s.st) }, hotplug: true},
	}
}

// runPhases runs the phases in order until one that is not a hotplug phase fails or no launcher
// status is left to sync with; the hotplug phases all run, and their errors are joined. A phase
// that waits (waitError) holds back no other while there is a launcher status: its wait becomes
// the state's requeueAfter.
func (r *Reconciler) runPhases(ctx context.Context, s *syncState) error {
	return runPhases(ctx, s, r.phases())
}

func runPhases(ctx context.Context, s *syncState, phases []phase) error {
	var hotplugErrs []error
	for _, p := range phases {
		err := p.run(ctx, s)
		if after, ok := waitFor(err); ok && s.st != nil {
			s.waitAtMost(after)
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("%s: %w", p.name, err)
			if !p.hotplug && len(hotplugErrs) == 0 {
				return err // alone, unjoined: waitFor reads a wait through single wrapping only
			}
			if !p.hotplug {
				return errors.Join(append(hotplugErrs, err)...)
			}
			hotplugErrs = append(hotplugErrs, err)
		}
		if s.st == nil {
			break
		}
	}
	return errors.Join(hotplugErrs...)
}

// waitAtMost asks for the next reconcile after d at the latest.
func (s *syncState) waitAtMost(d time.Duration) {
	if s.requeueAfter == 0 || d < s.requeueAfter {
		s.requeueAfter = d
	}
}

func (r *Reconciler) launcherPhase(ctx context.Context, s *syncState) error {
	var err error
	s.st, err = r.syncLauncher(ctx, s.v, s.pod)
	return err
}

// disksPhase keeps the hotplug failures even when it fails: they are the volumes' status.
func (r *Reconciler) disksPhase(ctx context.Context, s *syncState) error {
	var err error
	s.failures, err = r.syncDisks(ctx, s.v, s.pod, s.st)
	return err
}

// applyStatus writes the launcher's status into the instance's, with an Event when the guest
// ended. A guest that left for a migration target is the target's agent's to report.
func (r *Reconciler) applyStatus(s *syncState) {
	if s.st == nil || migratedAway(s.v, s.st) {
		return
	}
	r.recordEnded(s.v, applyLauncherStatus(s.v, s.pod, s.st, s.failures, r.now()))
}

// recordStreamedEnd records the guest's end that the launcher streamed before the agent got to it:
// the launcher lingers only a moment after the guest ends, and on a loaded node the kubelet can
// mark its pod ended, or remove the pod of a deleted instance, first. pod is nil when it is gone.
func (r *Reconciler) recordStreamedEnd(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) error {
	st, ok := r.launchers.latest(v.UID)
	if !ok || (st.Exit == nil && st.Phase != protocol.PhaseFailed) || migratedAway(v, &st) {
		return nil
	}
	before := v.DeepCopy()
	r.recordEnded(v, applyOutcome(v, pod, &st, r.now()))
	return r.patchStatus(ctx, before, v)
}

// recordEnded sends the GuestEnded Event when ended (applyOutcome's) says the guest ended.
func (r *Reconciler) recordEnded(v *v1alpha1.VirtualMachineInstance, ended string) {
	if ended == "" {
		return
	}
	eventType := corev1.EventTypeNormal
	if v.Status.Phase == v1alpha1.Failed {
		eventType = corev1.EventTypeWarning
	}
	r.Recorder.Event(v, eventType, EventGuestEnded, ended)
}

// syncLauncher makes sure the launcher runs the instance (network first), follows its status
// stream and, for a deleted instance, asks for the graceful shutdown. It returns the launcher's
// status, nil when the launcher cannot be reached; its error is recorded in the Synchronized
// condition and an Event, and retried with backoff.
func (r *Reconciler) syncLauncher(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) (*protocol.Status, error) {
	st, streaming := r.launchers.latest(v.UID)
	if !streaming {
		c := r.launchers.client(v.UID)
		defer c.Close()
		var err error
		if st, err = c.Status(ctx); err != nil {
			if notListening(err) && r.startedRecently(pod) {
				return nil, errLauncherStarting
			}
			if !pod.DeletionTimestamp.IsZero() {
				// The pod is going away (deleted, or the source of a finished migration): its
				// launcher may already be gone, and nothing is left to do.
				return nil, nil
			}
			return nil, r.syncFailed(v, ReasonLauncherUnreachable, EventLauncherUnreachable,
				fmt.Errorf("launcher of pod %s at %s: %w", pod.Name, r.launchers.dir(v.UID).Command(), err))
		}
		if st.Phase == protocol.PhaseWaiting && v.DeletionTimestamp.IsZero() {
			if st, err = r.startLauncher(ctx, v, pod, c, false); err != nil {
				return nil, err
			}
		}
		r.launchers.follow(v, st)
	}
	if st.UID != "" && st.UID != string(v.UID) {
		return nil, r.syncFailed(v, ReasonSyncFailed, EventSyncFailed,
			fmt.Errorf("the launcher in pod %s runs VMI %s, not this one", pod.Name, st.UID))
	}
	setSynchronized(v, nil, "", r.now())
	if !v.DeletionTimestamp.IsZero() && (st.Phase == protocol.PhaseRunning || st.Phase == protocol.PhaseStarting) {
		if r.launchers.shutdown(v.UID, stopGracePeriod(v), shutdownWithin(v)) {
			r.Recorder.Event(v, corev1.EventTypeNormal, EventShuttingDown, "The instance is being deleted: powering the guest off")
		}
	}
	return &st, nil
}

// A launcher pod's container is reported running a moment before the launcher listens. For this
// long after the container started, a missing socket is waited for quietly (polled every
// launcherStartPoll) rather than reported on the instance.
const (
	launcherStartGrace = 10 * time.Second
	launcherStartPoll  = 200 * time.Millisecond
)

var errLauncherStarting = &waitError{"the launcher is starting", launcherStartPoll}

// waitError is what a phase returns when it waits for something no event announces (a launcher's
// socket, a handover, a post-copy, a resume's next turn): the instance is looked at again after
// the wait, and nothing is recorded as a failure.
type waitError struct {
	what  string
	after time.Duration
}

func (e *waitError) Error() string { return e.what }

// waitFor is the wait err asks for, if it is a wait and nothing else: a wait joined with a
// failure (errors.Join) is a failure, so it is looked for through single wrapping only.
func waitFor(err error) (time.Duration, bool) {
	for ; err != nil; err = errors.Unwrap(err) {
		if w, ok := err.(*waitError); ok {
			return w.after, true
		}
	}
	return 0, false
}

// notListening reports whether err says nobody listens on the socket (yet, or any more).
func notListening(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// startedRecently reports whether the pod's compute container started within launcherStartGrace.
func (r *Reconciler) startedRecently(pod *corev1.Pod) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == podlayout.ComputeContainer && cs.State.Running != nil {
			return r.now().Sub(cs.State.Running.StartedAt.Time) < launcherStartGrace
		}
	}
	return false
}

// stopLeftover kills a guest still running for a finished instance: one the controller failed
// while this node was unresponsive, say. The instance's outcome is decided; a second copy of the
// guest must not run on.
func (r *Reconciler) stopLeftover(ctx context.Context, v *v1alpha1.VirtualMachineInstance) error {
	dir, err := podsockets.Running(r.PodsDir, r.NodeName, v)
	if err != nil {
		return nil // no launcher pod here
	}
	c := launcher.NewClientWithOptions(dir.Command(), r.Launcher)
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil || st.UID != string(v.UID) || st.Exit != nil {
		return nil // no launcher, or its guest already ended
	}
	if st.Phase != protocol.PhaseRunning && st.Phase != protocol.PhaseStarting && st.Phase != protocol.PhaseIncoming {
		return nil
	}
	if err := c.Kill(ctx); err != nil {
		return fmt.Errorf("kill the guest of a %s instance: %w", v.Status.Phase, err)
	}
	r.Recorder.Eventf(v, corev1.EventTypeWarning, EventKilledLeftover, "Killed the guest still running for this %s instance", v.Status.Phase)
	return nil
}

// reconcileIncoming handles an instance that is not running on this node: one migrating here is
// prepared as a migration target.
func (r *Reconciler) reconcileIncoming(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if r.Targets == nil {
		return ctrl.Result{}, nil
	}
	var v v1alpha1.VirtualMachineInstance
	if err := r.Targets.Get(ctx, req.NamespacedName, &v); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	err := r.reconcileTarget(ctx, &v)
	if after, ok := waitFor(err); ok {
		return ctrl.Result{RequeueAfter: after}, nil
	}
	return ctrl.Result{}, err
}

// migratedAway reports whether the guest left for a migration target, or waits at the handover
// (switchover.go): from then on the target's agent reports the guest, and the source's stopped,
// quitting QEMU must not; unless the target failed and the source lost its copy meanwhile.
func migratedAway(v *v1alpha1.VirtualMachineInstance, st *protocol.Status) bool {
	ms := v.Status.MigrationState
	if st.Exit != nil && st.Exit.Reason == protocol.ExitMigrated {
		return true
	}
	if st.Migration != nil && st.Migration.Role == protocol.RoleSource && st.Migration.Status == "completed" {
		return st.Exit == nil || ms == nil || !ms.Failed
	}
	return ms != nil && ms.Completed && ms.SourceNode == v.Status.NodeName
}

// startLauncher sets up the guest's network and sends the launcher the instance to run, or, for
// a migration target (incoming), to wait for.
func (r *Reconciler) startLauncher(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, c *launcher.Client, incoming bool) (protocol.Status, error) {
	if err := speaksProtocol(ctx, c); err != nil {
		return protocol.Status{}, r.syncFailed(v, ReasonProtocolMismatch, EventSyncFailed, err)
	}
	// Before its namespaces are touched or it is sent anything: is it the pod's?
	peer, err := r.peer(ctx, v)
	if errors.Is(err, podsockets.ErrForeignPeer) {
		return protocol.Status{}, r.syncFailed(v, ReasonForeignLauncher, EventForeignLauncher, err)
	}
	if err != nil {
		return protocol.Status{}, r.syncFailed(v, ReasonLauncherUnreachable, EventLauncherUnreachable, fmt.Errorf("find the launcher process: %w", err))
	}
	nics, err := setupNetwork(v, pod, peer)
	if err != nil {
		return protocol.Status{}, r.syncFailed(v, ReasonNetworkSetupFailed, EventNetworkSetupFailed, err)
	}
	vols, err := r.podVolumes(ctx, v, pod)
	if err != nil {
		return protocol.Status{}, r.syncFailed(v, ReasonSyncFailed, EventSyncFailed, fmt.Errorf("the launcher pod's volumes: %w", err))
	}
	m, err := translate.Machine(v, translate.Host{Emulation: launcherEmulation(pod), NICs: nics, SkipNotRealised: incoming, Pod: vols, NodeName: r.NodeName})
	if err == nil && incoming {
		err = targetMachine(v, m)
	}
	if err == nil {
		err = prepareHostDisks(peer, m.Disks)
	}
	if err != nil {
		return protocol.Status{}, r.syncFailed(v, ReasonSyncFailed, EventSyncFailed, fmt.Errorf("describe the machine: %w", err))
	}
	st, err := c.Sync(ctx, &protocol.SyncRequest{Machine: *m, Incoming: incoming})
	if err != nil {
		return protocol.Status{}, r.syncFailed(v, ReasonSyncFailed, EventSyncFailed, fmt.Errorf("start the VM: %s%w", specFieldOf(v, err), err))
	}
	if !incoming {
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventStarted, "QEMU started in pod %s", pod.Name)
		for _, n := range m.Notes {
			r.Recorder.Event(v, corev1.EventTypeWarning, EventFeaturesLeftOut, n)
		}
	}
	return st, nil
}

// peer is the process serving the instance's launcher socket, checked to be of its launcher pod
// before the node agent wires networking into its namespaces or sends it anything.
func (r *Reconciler) peer(ctx context.Context, v *v1alpha1.VirtualMachineInstance) (launcher.Peer, error) {
	dir := r.launchers.dir(v.UID)
	peer, err := launcher.PeerOf(ctx, dir.Command())
	if err != nil {
		return launcher.Peer{}, err
	}
	if err := podsockets.VerifyPeer(peer, dir); err != nil {
		return launcher.Peer{}, err
	}
	return peer, nil
}

// specFieldOf is "<spec field>: " for a launcher's refusal of a machine field translated from one
// field of v's spec, so the condition names what the user wrote; "" otherwise.
func specFieldOf(v *v1alpha1.VirtualMachineInstance, err error) string {
	var apiErr *launcher.APIError
	if !errors.As(err, &apiErr) {
		return ""
	}
	if f := translate.SpecField(v, apiErr.Field); f != "" {
		return f + ": "
	}
	return ""
}

// speaksProtocol checks that the launcher speaks the protocol this node agent sends machines in. A
// launcher from an older or newer build that does not is left alone, with a condition naming both
// versions: the pod must be recreated with a launcher image of this qvirt version.
func speaksProtocol(ctx context.Context, c *launcher.Client) error {
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("ask the launcher for its protocol versions: %w", err)
	}
	if slices.Contains(info.Protocols, machine.Protocol) {
		return nil
	}
	return fmt.Errorf("the launcher speaks protocol version(s) %s, this node agent speaks %s: recreate the launcher pod with this qvirt version's launcher image",
		strings.Join(info.Protocols, ", "), machine.Protocol)
}

// syncFailed records err on the instance (condition and Event) and returns it for a retry. A
// launcher that did not answer in time, or answered too much, is reported as such whatever the
// call was.
func (r *Reconciler) syncFailed(v *v1alpha1.VirtualMachineInstance, reason, eventReason string, err error) error {
	var timeout *launcher.TimeoutError
	var tooLarge *launcher.ReplyTooLargeError
	switch {
	case errors.As(err, &timeout):
		reason, eventReason = ReasonLauncherTimeout, EventLauncherUnreachable
	case errors.As(err, &tooLarge):
		reason, eventReason = ReasonLauncherReplyTooLarge, EventLauncherUnreachable
	}
	prev := findCondition(v, ConditionSynchronized)
	setSynchronized(v, err, reason, r.now())
	if prev == nil || prev.Reason != reason || prev.Message != err.Error() {
		r.Recorder.Event(v, corev1.EventTypeWarning, eventReason, err.Error())
	}
	return err
}

func findCondition(v *v1alpha1.VirtualMachineInstance, t string) *metav1.Condition {
	for i := range v.Status.Conditions {
		if v.Status.Conditions[i].Type == t {
			return &v.Status.Conditions[i]
		}
	}
	return nil
}

// launcherPod is the instance's running launcher pod on this node (not a migration target's).
func (r *Reconciler) launcherPod(ctx context.Context, v *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(v.Namespace), client.MatchingLabels{v1alpha1.VMIUIDLabel: string(v.UID)}); err != nil {
		return nil, fmt.Errorf("list launcher pods: %w", err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != r.NodeName {
			continue
		}
		if _, active := v.Status.ActivePods[p.UID]; active {
			return p, nil
		}
	}
	return nil, nil
}

// patchStatus writes the status changed since before, locked on before's resourceVersion; an
// instance gone meanwhile has nothing left to record.
func (r *Reconciler) patchStatus(ctx context.Context, before, v *v1alpha1.VirtualMachineInstance) error {
	_, err := r.superseded.NewStatus(r.Client, before).Patch(ctx, v)
	return client.IgnoreNotFound(err)
}

func (r *Reconciler) now() metav1.Time {
	if r.Now != nil {
		return metav1.NewTime(r.Now().Truncate(time.Second))
	}
	return metav1.NewTime(time.Now().Truncate(time.Second))
}

// shutdownWithin bounds a graceful shutdown call: the grace period the launcher gives the guest,
// plus a margin for QEMU to quit.
func shutdownWithin(v *v1alpha1.VirtualMachineInstance) time.Duration {
	grace := v1alpha1.TerminationGracePeriodSeconds(&v.Spec)
	if g := stopGracePeriod(v); g != nil {
		grace = *g
	}
	return time.Duration(grace)*time.Second + launcher.DefaultCallTimeout
}

// stopGracePeriod is the grace period override the VM controller recorded for a requested stop
// (`qvirtctl stop --grace-period`), nil when there is none or it is unreadable.
func stopGracePeriod(v *v1alpha1.VirtualMachineInstance) *int64 {
	raw, ok := v.Annotations[v1alpha1.StopGracePeriodAnnotation]
	if !ok {
		return nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 0 {
		return nil
	}
	return &n
}
