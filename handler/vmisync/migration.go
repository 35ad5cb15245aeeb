package vmisync

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/qmp"
)

// Live migration, the node agents' half of the contract in controllers/migration: the controller
// writes migrationState's identity (migrationUid, source and target node and pod) and
// abortRequested. The target node's agent starts the target launcher waiting for the guest and
// sets targetReady and targetNodeAddress; the source node's agent then starts the outgoing
// migration (startTimestamp), reports its progress, and ends it with completed or failed
// (endTimestamp, failureReason). The controller then moves the instance to the target.

// MigrationTunnel carries migration streams between node agents (handler/migproxy): no launcher
// pod listens on the network for a guest, so only the source node's agent, with a handler
// certificate, can feed a target.
type MigrationTunnel interface {
	// Address is where source agents reach this node's endpoint (host:port).
	Address() string
	// Expect opens this node's endpoint for the memory streams of migration uid (the main one and
	// one per parallel channel), from the agent of node source, to socket (a host path).
	Expect(uid types.UID, socket, source string, streams int)
	// Forward listens on socket (a host path, handed to owner) for the source QEMU's streams and
	// carries them to the target endpoint at addr, the agent of node target, as migration uid;
	// stop ends the wait.
	Forward(socket string, owner int, addr, target string, uid types.UID, streams int) (stop func(), err error)
	// ExpectDisks and ForwardDisks are Expect and Forward for the NBD connections of a block
	// migration, which copy the instance's local disks before its memory.
	ExpectDisks(uid types.UID, socket string)
	// ExpectRecovery opens the endpoint once more for the main stream of a post-copy migration
	// whose link broke, to socket, where the target QEMU listens again.
	ExpectRecovery(uid types.UID, socket, source string)
	ForwardDisks(socket string, owner int, addr, target string, uid types.UID) (stop func(), err error)
	// Cut closes the streams of migration uid under way, which a source QEMU stuck writing to a
	// target that stopped reading needs to see its migration end.
	Cut(uid types.UID)
}

// errNoTunnel is a node agent started without its migration endpoint.
var errNoTunnel = errors.New("this node agent has no migration endpoint (its migration TLS is not configured)")

// progressInterval bounds how often a running migration's progress is written to the instance.
const progressInterval = time.Second

// postCopyRecovery is how long both launchers of a migration in post-copy wait for its broken
// link to be mended (a node agent restarting: the stream runs through the agents) before the
// guest, split between them, is lost. An agent restart takes seconds; a node's a few minutes.
const postCopyRecovery = 5 * time.Minute

// recoveryPoll is how often the target's agent looks at a migration in post-copy: no event tells
// it that its target launcher paused, or went on.
const recoveryPoll = time.Second

// Event reasons of migrations on instances.
const (
	EventMigrationTargetReady = "MigrationTargetReady"
	EventMigrationStarted     = "MigrationStarted"
	EventMigrationFailed      = "MigrationFailed"
	EventMigrationCompleted   = "MigrationCompleted"
	EventMigrationRecovering  = "MigrationRecovering"
	EventMigrationResumed     = "MigrationResumed"
)

// openMigration is the instance's migration state while it is under way (not completed or failed).
func openMigration(v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstanceMigrationState {
	ms := v.Status.MigrationState
	if ms == nil || ms.MigrationUID == "" || ms.Completed || ms.Failed {
		return nil
	}
	return ms
}

// reconcileTarget prepares this node's target launcher for an incoming migration: network, an
// incoming QEMU with the source's device set, listening in its pod for this node's migration endpoint, then targetReady. A
// target that cannot be prepared fails the migration, recorded in migrationState: the guest
// stays on the source, and the migration's owner sees why instead of a migration pending forever.
func (r *Reconciler) reconcileTarget(ctx context.Context, v *v1alpha1.VirtualMachineInstance) error {
	ms := openMigration(v)
	if ms == nil || ms.TargetNode != r.NodeName {
		return nil
	}
	if ms.TargetReady && ms.SourceHandedOver {
		return r.takeOver(ctx, v) // switchover.go
	}
	if ms.TargetReady && ms.Mode == v1alpha1.MigrationPostCopy {
		if err := r.recoverTarget(ctx, v, ms); err != nil {
			return err
		}
		return errPostCopyWatch
	}
	if ms.TargetReady {
		r.reopenTarget(v, ms)
		return nil
	}
	pod, err := r.targetPod(ctx, v, ms)
	if err != nil || pod == nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
		return err
	}
	before := v.DeepCopy()
	listen, err := r.prepareTarget(ctx, v, pod)
	if _, wait := waitFor(err); wait || (err != nil && ctx.Err() != nil) {
		return err
	}
	if err != nil {
		// The Synchronized condition is the source's agent's while the guest runs there.
		v.Status.Conditions = before.Status.Conditions
		r.failTargetMigration(v, err)
		return r.patchStatus(ctx, before, v)
	}
	v.Status.MigrationState.TargetReady = true
	v.Status.MigrationState.TargetNodeAddress = listen
	r.Recorder.Eventf(v, corev1.EventTypeNormal, EventMigrationTargetReady, "Target pod %s on node %s waits for the guest at %s", pod.Name, r.NodeName, listen)
	return r.patchStatus(ctx, before, v)
}

// reopenTarget opens the endpoint again for a target made ready before this agent restarted, as
// long as the source has not started (the endpoint refuses a second stream of a migration anyway).
func (r *Reconciler) reopenTarget(v *v1alpha1.VirtualMachineInstance, ms *v1alpha1.VirtualMachineInstanceMigrationState) {
	if r.Migrations == nil || ms.StartTimestamp != nil {
		return
	}
	if d := r.launchers.dir(v.UID); d != "" {
		r.expectMigration(v, ms, d)
	}
}

// expectMigration opens this node's endpoint for the migration's streams to the target launcher
// in d: its memory, and the copy of its local disks (v1alpha1.LocalDisks) before that.
func (r *Reconciler) expectMigration(v *v1alpha1.VirtualMachineInstance, ms *v1alpha1.VirtualMachineInstanceMigrationState, d launcher.Dir) {
	r.Migrations.Expect(ms.MigrationUID, d.MigrationIn(), ms.SourceNode, memoryStreams(ms.MigrationConfiguration))
	if len(v1alpha1.LocalDisks(&v.Spec)) > 0 {
		r.Migrations.ExpectDisks(ms.MigrationUID, d.NBDIn())
	}
}

// prepareTarget starts the target launcher waiting for the guest on a socket in its pod and opens
// this node's migration endpoint for it; it returns the endpoint's address, where the source's
// agent sends to.
func (r *Reconciler) prepareTarget(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) (string, error) {
	r.launchers.place(v.UID, podsockets.Dir(r.PodsDir, pod.UID, v.UID))
	c := r.launchers.client(v.UID)
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		if notListening(err) && r.startedRecently(pod) {
			return "", errLauncherStarting
		}
		return "", r.syncFailed(v, ReasonLauncherUnreachable, EventLauncherUnreachable, fmt.Errorf("target launcher of pod %s: %w", pod.Name, err))
	}
	if st.Phase == protocol.PhaseWaiting {
		if _, err := r.startLauncher(ctx, v, pod, c, true); err != nil {
			return "", err
		}
	}
	if r.Migrations == nil {
		return "", r.syncFailed(v, ReasonSyncFailed, EventSyncFailed, errNoTunnel)
	}
	if st.Migration == nil || st.Migration.Role != protocol.RoleTarget {
		mcfg := v.Status.MigrationState.MigrationConfiguration
		req := protocol.MigrationTarget{Listen: launcher.ListenUnix, Parallel: parallelStreams(mcfg), PostCopy: postCopyAfter(&v.Spec, mcfg) > 0}
		if req.PostCopy {
			req.PostCopyRecovery = postCopyRecovery
		}
		if _, err := c.PrepareMigrationTarget(ctx, req); err != nil {
			return "", r.syncFailed(v, ReasonSyncFailed, EventSyncFailed, fmt.Errorf("prepare the migration target in pod %s: %w", pod.Name, err))
		}
	}
	r.expectMigration(v, v.Status.MigrationState, r.launchers.dir(v.UID))
	return r.Migrations.Address(), nil
}

// failTargetMigration ends the migration for a target that cannot take the guest.
func (r *Reconciler) failTargetMigration(v *v1alpha1.VirtualMachineInstance, err error) {
	ms := v.Status.MigrationState
	ms.Failed = true
	ms.FailureReason = fmt.Sprintf("the target on node %s cannot start: %v", r.NodeName, err)
	if ms.EndTimestamp == nil {
		ms.EndTimestamp = ptr.To(metav1.NewTime(r.now().Time))
	}
	r.Recorder.Eventf(v, corev1.EventTypeWarning, EventMigrationFailed, "%s", ms.FailureReason)
}

// targetPod is the migration's target launcher pod on this node.
func (r *Reconciler) targetPod(ctx context.Context, v *v1alpha1.VirtualMachineInstance, ms *v1alpha1.VirtualMachineInstanceMigrationState) (*corev1.Pod, error) {
	var pod corev1.Pod
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: v.Namespace, Name: ms.TargetPod}, &pod)
	if err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if pod.Spec.NodeName != r.NodeName || pod.Labels[v1alpha1.MigrationUIDLabel] != string(ms.MigrationUID) {
		return nil, nil
	}
	return &pod, nil
}

// syncSourceMigration drives the source side from the launcher's status st: start the outgoing
// migration once the target is ready, cancel it when an abort is requested, and record progress
// and the outcome in migrationState.
func (r *Reconciler) syncSourceMigration(ctx context.Context, v *v1alpha1.VirtualMachineInstance, st *protocol.Status) error {
	if held, err := r.syncSourceHandover(ctx, v, st); held || err != nil {
		return err // switchover.go
	}
	ms := openMigration(v)
	if ms == nil || ms.SourceNode != r.NodeName {
		return nil
	}
	info := st.Migration
	if ms.StartTimestamp == nil && outgoing(info) {
		// The launcher migrates already: this copy of the instance predates our own record of
		// the start (the cache lags behind the status write, or the write was lost). Starting
		// again would open a second tunnel on the socket the source QEMU is about to connect
		// to, and remove it when the launcher refuses the second start.
		ms.StartTimestamp = ptr.To(metav1.NewTime(r.now().Time))
	}
	ours := info != nil && info.Role == protocol.RoleSource && ms.StartTimestamp != nil
	switch {
	case ours && (migrationEnded(info.Status) || postCopyLost(st)):
		if info.Status != string(qmp.MigrationCompleted) {
			r.cutStreams(ms.MigrationUID) // nothing of a failed migration may linger in the tunnel
		}
		r.finishSourceMigration(v, info)
		return nil
	case ours && info.Status == string(qmp.MigrationCancelling):
		// The launcher gave up (a stall, a cancel): what it sent may be stuck in the tunnel.
		r.cutStreams(ms.MigrationUID)
		r.recordProgress(v, info)
		return nil
	case ours && info.PostCopy:
		// Past the switch to post-copy the guest runs on the target: an abort is too late (the
		// launcher refuses it), and the mode must reach the controller at once, which then
		// never deletes the target pod for an abort.
		ms.Mode = v1alpha1.MigrationPostCopy
		r.recordProgress(v, info)
		if info.Status == string(qmp.MigrationPostcopyPaused) && ms.TargetRecoveryReady {
			return r.resumePostCopy(ctx, v, ms)
		}
		return nil
	case ms.AbortRequested && ms.StartTimestamp == nil:
		r.failSourceMigration(v, "aborted before it started")
		return nil
	case ms.AbortRequested:
		c := r.launchers.client(v.UID)
		defer c.Close()
		if err := c.CancelMigration(ctx); err != nil {
			return fmt.Errorf("cancel the migration: %w", err)
		}
		return nil
	case ours:
		r.recordProgress(v, info)
		return nil
	case !ms.TargetReady || ms.TargetNodeAddress == "" || st.Phase != protocol.PhaseRunning:
		return nil
	}
	// The streamed status st may lag behind the launcher (this agent's own start just now, its
	// status write done, the stream not yet showing it): a second start would be refused and
	// fail the migration, so the launcher itself is asked first.
	running, err := r.migratingNow(ctx, v)
	if err != nil {
		return err
	}
	if running {
		ms.StartTimestamp = ptr.To(metav1.NewTime(r.now().Time))
		return nil
	}
	if err := unplugPending(v, st); err != nil {
		r.failSourceMigration(v, err.Error())
		return nil
	}
	if err := r.startOutgoing(ctx, v, ms); err != nil {
		r.failSourceMigration(v, fmt.Sprintf("start: %v", err))
		return nil
	}
	ms.StartTimestamp = ptr.To(metav1.NewTime(r.now().Time))
	r.Recorder.Eventf(v, corev1.EventTypeNormal, EventMigrationStarted, "Migrating to node %s at %s", ms.TargetNode, ms.TargetNodeAddress)
	return nil
}

// migratingNow asks the source launcher itself (not its status stream) whether it sends the
// guest already.
func (r *Reconciler) migratingNow(ctx context.Context, v *v1alpha1.VirtualMachineInstance) (bool, error) {
	c := r.launchers.client(v.UID)
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return false, fmt.Errorf("the source launcher's status before the start: %w", err)
	}
	return outgoing(st.Migration), nil
}

// startOutgoing opens the tunnel to the target node's endpoint on a socket in the source pod and
// has the source QEMU send there.
func (r *Reconciler) startOutgoing(ctx context.Context, v *v1alpha1.VirtualMachineInstance, ms *v1alpha1.VirtualMachineInstanceMigrationState) error {
	if r.Migrations == nil {
		return errNoTunnel
	}
	hostDir := r.launchers.dir(v.UID)
	if hostDir == "" {
		return fmt.Errorf("the source launcher's socket directory is unknown")
	}
	stop, err := r.Migrations.Forward(hostDir.MigrationOut(), podlayout.LauncherUID, ms.TargetNodeAddress, ms.TargetNode, ms.MigrationUID, memoryStreams(ms.MigrationConfiguration))
	if err != nil {
		return fmt.Errorf("open the migration tunnel: %w", err)
	}
	// The launcher sees its socket directory at podlayout.SocketDir.
	inPod := launcher.VMIDir(podlayout.SocketDir, v.UID)
	req := protocol.MigrationSource{URI: "unix:" + inPod.MigrationOut(), BandwidthBytesPerSecond: r.migrationBandwidth(ms.MigrationConfiguration),
		Parallel: parallelStreams(ms.MigrationConfiguration)}
	if c := ms.MigrationConfiguration; c != nil && c.AllowAutoConverge != nil {
		req.AutoConverge = *c.AllowAutoConverge
	}
	if after := postCopyAfter(&v.Spec, ms.MigrationConfiguration); after > 0 {
		req.PostCopy, req.PostCopyAfter, req.PostCopyRecovery = true, after, postCopyRecovery
	}
	if r.MigrationConfig != nil {
		req.ProgressTimeout = time.Duration(r.MigrationConfig().ProgressTimeout) * time.Second
	}
	if len(v1alpha1.LocalDisks(&v.Spec)) > 0 {
		// The local disks are copied first, through the same tunnel (blockmigration.go in the
		// launcher); a launcher too old to copy them refuses the request.
		stopDisks, err := r.Migrations.ForwardDisks(hostDir.NBDOut(), podlayout.LauncherUID, ms.TargetNodeAddress, ms.TargetNode, ms.MigrationUID)
		if err != nil {
			stop()
			return fmt.Errorf("open the tunnel for the local disks: %w", err)
		}
		prev := stop
		stop = func() { prev(); stopDisks() }
		req.BlockMigration = &protocol.BlockMigration{URI: "unix:" + inPod.NBDOut()}
	}
	c := r.launchers.client(v.UID)
	defer c.Close()
	if err := c.MigrateSource(ctx, req); err != nil {
		stop()
		return err
	}
	return nil
}

// cutStreams closes the tunnel's streams of migration uid, if this agent has a tunnel.
func (r *Reconciler) cutStreams(uid types.UID) {
	if r.Migrations != nil {
		r.Migrations.Cut(uid)
	}
}

// parallelStreams are the migration's parallel streams (its configuration's, fixed by the
// controller at the start, so both node agents read the same); nil for one stream.
func parallelStreams(c *v1alpha1.MigrationConfiguration) *protocol.ParallelStreams {
	if c == nil || c.ParallelMigrationThreads == nil || *c.ParallelMigrationThreads < 1 {
		return nil
	}
	p := &protocol.ParallelStreams{Channels: int(*c.ParallelMigrationThreads)}
	if c.ParallelMigrationCompression != nil {
		p.Compression = string(*c.ParallelMigrationCompression)
	}
	return p
}

// postCopyAfter is when the migration switches to post-copy: at its completion timeout, when
// its configuration (fixed by the controller at the start, which turned allowPostCopy off where
// the target node or the instance's disks rule it out) allows post-copy; 0 when it never does,
// also without a completion timeout, as KubeVirt.
func postCopyAfter(spec *v1alpha1.VirtualMachineInstanceSpec, c *v1alpha1.MigrationConfiguration) time.Duration {
	if !c.PostCopy() || c.CompletionTimeoutPerGiB == nil {
		return 0
	}
	return v1alpha1.CompletionTimeout(spec, *c.CompletionTimeoutPerGiB)
}

// memoryStreams is how many connections the migration's memory takes: the main one and one per
// parallel channel.
func memoryStreams(c *v1alpha1.MigrationConfiguration) int {
	if p := parallelStreams(c); p != nil {
		return 1 + p.Channels
	}
	return 1
}

// migrationBandwidth is the cap for the launcher: the migration's own configuration's (its
// MigrationPolicy over the cluster's, fixed by the controller at the start), else the node
// agent's view of the cluster's (a migration started by a controller that predates policies);
// unlimited when it says 0, as KubeVirt's bandwidthPerMigration.
func (r *Reconciler) migrationBandwidth(c *v1alpha1.MigrationConfiguration) int64 {
	var b int64
	switch {
	case c != nil && c.BandwidthPerMigration != nil:
		b = c.BandwidthPerMigration.Value()
	case r.MigrationConfig != nil:
		bw := r.MigrationConfig().BandwidthPerMigration
		b = bw.Value()
	}
	if b > 0 {
		return b
	}
	return -1
}

// outgoing says whether info is a source launcher's migration still under way.
func outgoing(info *protocol.MigrationInfo) bool {
	return info != nil && info.Role == protocol.RoleSource && !migrationEnded(info.Status)
}

func migrationEnded(status string) bool {
	switch qmp.MigrationStatus(status) {
	case qmp.MigrationCompleted, qmp.MigrationFailed, qmp.MigrationCancelled:
		return true
	}
	return false
}

// postCopyLost says whether a migration paused after its switch to post-copy (a broken link) can
// no longer be resumed: its QEMU ended (the launcher's recovery window ran out, or it crashed).
func postCopyLost(st *protocol.Status) bool {
	info := st.Migration
	return st.Exit != nil && info != nil && info.PostCopy && info.Status == string(qmp.MigrationPostcopyPaused)
}

func (r *Reconciler) finishSourceMigration(v *v1alpha1.VirtualMachineInstance, info *protocol.MigrationInfo) {
	ms := v.Status.MigrationState
	setProgress(ms, info)
	if info.Status == string(qmp.MigrationCompleted) {
		// The target's agent completes the migration once it runs the guest (switchover.go).
		return
	}
	ms.EndTimestamp = ptr.To(metav1.NewTime(r.now().Time))
	reason := info.Status
	if info.Error != "" {
		reason += ": " + info.Error
	}
	r.failSourceMigration(v, reason)
}

func (r *Reconciler) failSourceMigration(v *v1alpha1.VirtualMachineInstance, reason string) {
	ms := v.Status.MigrationState
	ms.Failed, ms.FailureReason = true, reason
	if ms.EndTimestamp == nil {
		ms.EndTimestamp = ptr.To(metav1.NewTime(r.now().Time))
	}
	if ms.Mode == v1alpha1.MigrationPostCopy {
		r.Recorder.Eventf(v, corev1.EventTypeWarning, EventMigrationFailed,
			"Migration to node %s failed after its switch to post-copy: %s; the guest ran on the target since and is lost", ms.TargetNode, reason)
		return
	}
	r.Recorder.Eventf(v, corev1.EventTypeWarning, EventMigrationFailed, "Migration to node %s failed: %s; the guest keeps running here", ms.TargetNode, reason)
}

// recordProgress writes the transfer counters, at most once per progressInterval per instance.
func (r *Reconciler) recordProgress(v *v1alpha1.VirtualMachineInstance, info *protocol.MigrationInfo) {
	if !r.launchers.progressDue(v.UID, progressInterval) {
		return
	}
	setProgress(v.Status.MigrationState, info)
}

func setProgress(ms *v1alpha1.VirtualMachineInstanceMigrationState, info *protocol.MigrationInfo) {
	if info.TotalBytes > 0 {
		ms.DataTotalBytes = ptr.To(info.TotalBytes)
		ms.DataProcessedBytes = ptr.To(info.TransferredBytes)
		ms.DataRemainingBytes = ptr.To(info.RemainingBytes)
	}
	if info.ParallelBytes > 0 {
		ms.DataParallelBytes = ptr.To(info.ParallelBytes)
	}
	if info.DowntimeMs > 0 {
		ms.DowntimeMilliseconds = ptr.To(info.DowntimeMs)
	}
	if info.TotalTimeMs > 0 {
		ms.TotalTimeMilliseconds = ptr.To(info.TotalTimeMs)
	}
	ms.Mode = v1alpha1.MigrationPreCopy
	if info.PostCopy {
		ms.Mode = v1alpha1.MigrationPostCopy
	}
}

// unplugPending refuses to start a migration while the guest still holds a hot-plugged disk or NIC
// that the spec no longer has: the guest has not let go of it yet, the target (which starts from
// the spec) would lack it and QEMU would refuse the migration stream with an error naming only
// a device.
func unplugPending(v *v1alpha1.VirtualMachineInstance, st *protocol.Status) error {
	for _, d := range st.Disks {
		if d.Hotplugged && !hasDisk(v, d.Name) {
			return field.Forbidden(field.NewPath("spec", "domain", "devices", "disks"),
				fmt.Sprintf("disk %q is still being unplugged from the guest; migrate once it is detached", d.Name))
		}
	}
	for _, n := range st.NICs {
		if n.Hotplugged && !hasInterface(v, n.Name) {
			return field.Forbidden(field.NewPath("spec", "domain", "devices", "interfaces"),
				fmt.Sprintf("interface %q is still being unplugged from the guest; migrate once it is detached", n.Name))
		}
	}
	return nil
}

// errPostCopyWatch requeues a migration target in post-copy: see recoveryPoll.
var errPostCopyWatch = &waitError{"the migration is in post-copy", recoveryPoll}

// recoverTarget mends, on the target's side, a migration in post-copy whose link broke: when the
// target launcher reports it paused, this node's endpoint expects the source's resumed stream and
// the launcher listens for it again; targetRecoveryReady tells the source's agent to send. Once
// the migration goes on, targetRecoveryReady is cleared for the next break.
func (r *Reconciler) recoverTarget(ctx context.Context, v *v1alpha1.VirtualMachineInstance, ms *v1alpha1.VirtualMachineInstanceMigrationState) error {
	if r.Migrations == nil {
		return nil
	}
	pod, err := r.targetPod(ctx, v, ms)
	if err != nil || pod == nil {
		return err
	}
	d := podsockets.Dir(r.PodsDir, pod.UID, v.UID)
	r.launchers.place(v.UID, d)
	c := r.launchers.client(v.UID)
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil || st.Migration == nil || st.Migration.Role != protocol.RoleTarget || st.Exit != nil {
		return nil // the source's agent and the controller see a target that is gone
	}
	paused := st.Migration.Status == string(qmp.MigrationPostcopyPaused)
	before := v.DeepCopy()
	switch {
	case paused && ms.TargetRecoveryReady:
		// Listening already: an agent restarted since must expect the stream again.
		r.Migrations.ExpectRecovery(ms.MigrationUID, d.MigrationIn(), ms.SourceNode)
		return nil
	case paused:
		r.Migrations.ExpectRecovery(ms.MigrationUID, d.MigrationIn(), ms.SourceNode)
		if _, err := c.RecoverMigration(ctx, protocol.MigrationRecover{Listen: launcher.ListenUnix}); err != nil {
			return fmt.Errorf("listen again for the post-copy migration whose link broke: %w", err)
		}
		ms.TargetRecoveryReady = true
		r.Recorder.Eventf(v, corev1.EventTypeWarning, EventMigrationRecovering,
			"The post-copy migration's link broke; target pod %s waits for node %s to resume it", pod.Name, ms.SourceNode)
	case ms.TargetRecoveryReady:
		ms.TargetRecoveryReady = false
	default:
		return nil
	}
	return r.patchStatus(ctx, before, v)
}

// resumePostCopy sends the rest of a post-copy migration whose link broke to the target, which
// listens again (recoverTarget): a new tunnel in the source pod, and the source QEMU's resume to
// it. A resume is tried at most once per resumeRetry, since the source's status lags behind it;
// one not due yet returns errResumeLater, so that the instance is looked at again then: nothing
// else may change before the guest is lost (a failed resume leaves the same paused status).
func (r *Reconciler) resumePostCopy(ctx context.Context, v *v1alpha1.VirtualMachineInstance, ms *v1alpha1.VirtualMachineInstanceMigrationState) error {
	if r.Migrations == nil {
		return nil
	}
	if !r.launchers.resumeDue(v.UID, resumeRetry) {
		return errResumeLater
	}
	hostDir := r.launchers.dir(v.UID)
	if hostDir == "" {
		return fmt.Errorf("the source launcher's socket directory is unknown")
	}
	stop, err := r.Migrations.Forward(hostDir.MigrationOut(), podlayout.LauncherUID, ms.TargetNodeAddress, ms.TargetNode, ms.MigrationUID, 1)
	if err != nil {
		return fmt.Errorf("open the migration tunnel to resume the post-copy migration: %w", err)
	}
	inPod := launcher.VMIDir(podlayout.SocketDir, v.UID)
	c := r.launchers.client(v.UID)
	defer c.Close()
	if err := c.ResumeMigration(ctx, protocol.MigrationResume{URI: "unix:" + inPod.MigrationOut()}); err != nil {
		stop()
		return fmt.Errorf("resume the post-copy migration: %w", err)
	}
	r.Recorder.Eventf(v, corev1.EventTypeNormal, EventMigrationResumed, "Resumed the post-copy migration to node %s", ms.TargetNode)
	return nil
}

// resumeRetry spaces the source's resumes of one migration.
const resumeRetry = 10 * time.Second

// errResumeLater requeues a source whose post-copy resume is not due yet: see resumePostCopy.
var errResumeLater = &waitError{"the post-copy migration's resume is not due yet", resumeRetry}
