package vmisync

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/patch"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// Condition types and reasons the node agent sets on an instance. Ready and Paused are KubeVirt's;
// Synchronized says whether the node agent could bring the launcher to the spec.
const (
	ConditionSynchronized = v1alpha1.VirtualMachineInstanceSynchronized

	ReasonGuestRunning        = "GuestRunning"
	ReasonGuestNotRunning     = "GuestNotRunning"
	ReasonGuestPaused         = "GuestPaused"
	ReasonPausedByUser        = "PausedByUser"
	ReasonPausedIOError       = "PausedIOError"
	ReasonPausedStartStrategy = "PausedStartStrategy"
	ReasonSynchronized        = "Synchronized"
	ReasonLauncherUnreachable = "LauncherUnreachable"
	ReasonSyncFailed          = "SyncFailed"
	ReasonNetworkSetupFailed  = "NetworkSetupFailed"
	// ReasonProtocolMismatch: the launcher does not speak this node agent's protocol version.
	ReasonProtocolMismatch = "LauncherProtocolMismatch"
	// ReasonForeignLauncher: the process serving the launcher socket is not of the VMI's pod.
	ReasonForeignLauncher = "ForeignLauncher"
	// ReasonLauncherTimeout: the launcher accepted a call and did not answer it in time.
	ReasonLauncherTimeout = "LauncherTimeout"
	// ReasonLauncherReplyTooLarge: the launcher answered with more than the node agent reads.
	ReasonLauncherReplyTooLarge = "LauncherReplyTooLarge"
	// ReasonAgentConnected is the reason of the AgentConnected condition.
	ReasonAgentConnected = "GuestAgentConnected"
	// ReasonLivenessProbeFailed: the guest was stopped because the kubelet stopped the launcher
	// pod's compute container, whose liveness probe (spec.livenessProbe) failed; the instance
	// fails, and its VirtualMachine's run strategy decides whether it starts again.
	ReasonLivenessProbeFailed = "LivenessProbeFailed"
	// ReasonLauncherTerminated: the guest was stopped because the launcher was told to stop
	// (SIGTERM) while its pod stays, and the pod has no liveness probe to blame.
	ReasonLauncherTerminated = "LauncherTerminated"
	// ReasonReadinessProbeFailed: the guest runs, but the launcher pod is not Ready because the
	// kubelet's run of spec.readinessProbe has not passed (yet, or any more).
	ReasonReadinessProbeFailed = "ReadinessProbeFailed"
)

// Reasons on a final instance: how the guest ended, from the launcher's exit reason.
var exitReasons = map[protocol.ExitReason]string{
	protocol.ExitGuestShutdown: "GuestShutdown",
	protocol.ExitGuestPanicked: "GuestPanicked",
	protocol.ExitQuit:          "Stopped",
	protocol.ExitMigrated:      "Migrated",
	protocol.ExitKilled:        "Killed",
	protocol.ExitCrashed:       "QEMUCrashed",
	protocol.ExitFailedToStart: "FailedToStart",
}

// exitReason is the instance's status.reason for an exit.
func exitReason(e *protocol.Exit) string {
	if r, ok := exitReasons[e.Reason]; ok {
		return r
	}
	return "GuestEnded"
}

// guestOutcome is the phase the launcher's status puts the instance in ("" when it leaves the
// phase alone: QEMU is still starting) and, for a final phase, the reason and the Event message.
func guestOutcome(st *protocol.Status) (phase v1alpha1.VirtualMachineInstancePhase, reason, message string) {
	switch st.Phase {
	case protocol.PhaseRunning:
		return v1alpha1.Running, "", ""
	case protocol.PhaseSucceeded, protocol.PhaseFailed:
		phase = v1alpha1.Failed
		if st.Phase == protocol.PhaseSucceeded {
			phase = v1alpha1.Succeeded
		}
		exit := st.Exit
		if exit == nil {
			exit = &protocol.Exit{Reason: protocol.ExitFailedToStart, Detail: st.StartError}
		}
		return phase, exitReason(exit), GuestEndedMessage(exit.String())
	}
	return "", "", ""
}

// GuestEndedMessage is the Event message of a guest that ended how (protocol.Exit's String).
func GuestEndedMessage(how string) string { return "The guest ended: " + how }

// terminatedInPlace says whether the launcher stopped the guest because it was told to stop
// (SIGTERM) while neither the instance nor the launcher pod is being deleted: the kubelet stopped
// the compute container, as it does when a liveness probe fails (or someone in the pod signalled
// the launcher). The guest powered off cleanly, but it did not end by itself.
func terminatedInPlace(v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status) bool {
	return st.Terminated && v.DeletionTimestamp.IsZero() && pod != nil && pod.DeletionTimestamp.IsZero()
}

// TerminatedOutcome is the instance's end when terminatedInPlace: Failed, since the guest did not
// end by itself (so that runStrategy RerunOnFailure restarts it, as a liveness failure should),
// with a reason naming the liveness probe when the compute container has one. The VMI reconciler
// uses it too, for a launcher that exited before the node agent read its status.
func TerminatedOutcome(pod *corev1.Pod, ended string) (v1alpha1.VirtualMachineInstancePhase, string, string) {
	if c := computeContainer(pod); c != nil && c.LivenessProbe != nil {
		return v1alpha1.Failed, ReasonLivenessProbeFailed,
			"The kubelet stopped the launcher pod's compute container: spec.livenessProbe failed. " + ended
	}
	return v1alpha1.Failed, ReasonLauncherTerminated,
		"The launcher was told to stop (SIGTERM) while its pod stays. " + ended
}

// applyLauncherStatus writes what the launcher reports into the instance's status: phase, QEMU and
// launcher versions, the CPU topology, the memory under hotplug, Ready and Paused conditions, interfaces (reached at the pod's addresses, the
// masquerade binding's and, for the bridge binding, the guest's own) and volumes. It returns the
// Event message when the guest ended ("" otherwise). It is pure: now is the transition time.
func applyLauncherStatus(v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status, failures hotplugFailures, now metav1.Time) (ended string) {
	status := &v.Status
	ended = applyOutcome(v, pod, st, now)
	if st.QEMUVersion != "" {
		status.QEMUVersion = st.QEMUVersion
	}
	if c := v.Spec.Domain.CPU; st.Sockets != 0 {
		if c == nil {
			c = &v1alpha1.CPU{}
		}
		// What the launcher says, within what the spec allows (the launcher is the tenant's).
		sockets := min(st.Sockets, max(c.MaxSockets, c.Sockets, 1))
		status.CurrentCPUTopology = &v1alpha1.CPUTopology{Sockets: sockets, Cores: max(c.Cores, 1), Threads: max(c.Threads, 1)}
	}
	if m := memoryStatus(v, st); m != nil {
		status.Memory = m
	}
	if c := computeContainer(pod); c != nil {
		status.LauncherContainerImageVersion = c.Image
	}
	startPaused := v.Spec.StartStrategy != nil && *v.Spec.StartStrategy == v1alpha1.StartStrategyPaused
	setGuestConditions(v, pod, st, startPaused, now)
	setAgentStatus(v, st, now)
	status.Interfaces = interfaces(v, pod, st)
	status.VolumeStatus = volumes(v, st, failures)
	return ended
}

// applyOutcome sets the instance's phase (and reason) from the launcher's status, and returns the
// Event message when the guest ended ("" otherwise). pod is nil when the launcher pod is gone.
func applyOutcome(v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status, now metav1.Time) (ended string) {
	phase, reason, msg := guestOutcome(st)
	if phase.Final() && terminatedInPlace(v, pod, st) {
		phase, reason, msg = TerminatedOutcome(pod, msg)
	}
	if phase == "" || v.Status.Phase == phase {
		return ""
	}
	v.Status.SetPhase(phase, now)
	if reason == "" {
		return ""
	}
	v.Status.Reason = reason
	return msg
}

func computeContainer(pod *corev1.Pod) *corev1.Container {
	if pod == nil {
		return nil
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == podlayout.ComputeContainer {
			return &pod.Spec.Containers[i]
		}
	}
	return nil
}

// launcherEmulation says whether the launcher pod runs its guest under emulation (TCG): the
// --emulation flag the pod renderer (controllers/vmi) gave its compute container, from the
// configuration at the time. The instance is translated for the accelerator the pod was made for,
// not for today's configuration.
func launcherEmulation(pod *corev1.Pod) bool {
	c := computeContainer(pod)
	if c == nil {
		return false
	}
	flag := "--" + podlayout.FlagEmulation
	return slices.Contains(c.Command, flag) || slices.Contains(c.Args, flag)
}

// setGuestConditions sets Ready (the guest runs, is not paused and, with a readiness probe, its
// launcher pod is Ready) and Paused (present only while paused, as in KubeVirt).
func setGuestConditions(v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status, startPaused bool, now metav1.Time) {
	status := &v.Status
	running := st.Phase == protocol.PhaseRunning
	ready := metav1.Condition{Type: v1alpha1.VirtualMachineInstanceReady, Status: metav1.ConditionFalse,
		Reason: ReasonGuestNotRunning, Message: fmt.Sprintf("The launcher reports %s", st.Phase), LastTransitionTime: now}
	switch {
	case running && !st.Paused:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, ReasonGuestRunning, ""
		if msg, ok := probeReady(v, pod); !ok {
			ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonReadinessProbeFailed, msg
		}
	case running:
		ready.Reason, ready.Message = ReasonGuestPaused, "The guest's vCPUs are paused"
	}
	patch.SetCondition(&status.Conditions, v, ready)
	if !running || !st.Paused {
		meta.RemoveStatusCondition(&status.Conditions, v1alpha1.VirtualMachineInstancePaused)
		return
	}
	patch.SetCondition(&status.Conditions, v, metav1.Condition{
		Type: v1alpha1.VirtualMachineInstancePaused, Status: metav1.ConditionTrue,
		Reason: pausedReason(st.RunState, startPaused), Message: "QEMU run state: " + st.RunState, LastTransitionTime: now})
}

// probeReady says whether the instance's readiness probe lets it be Ready, and if not, why. The
// kubelet runs the probe (it is on the launcher pod's compute container) and reports it as the
// pod's Ready condition, which Services' endpoints follow too; the instance's Ready follows the
// pod's as KubeVirt's virt-controller has it (syncReadyConditionFromPod). Without a probe the pod's
// readiness adds nothing: the guest running is what Ready means.
func probeReady(v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) (string, bool) {
	pr := v.Spec.ReadinessProbe
	if pr == nil {
		return "", true
	}
	what := "spec.readinessProbe (" + probeAction(pr) + ")"
	if pod == nil {
		return "no launcher pod to run " + what, false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		if c.Status == corev1.ConditionTrue {
			return "", true
		}
		msg := fmt.Sprintf("launcher pod %s is not ready: %s has not passed", pod.Name, what)
		if c.Message != "" {
			msg += " (" + c.Message + ")"
		}
		return msg, false
	}
	return fmt.Sprintf("launcher pod %s has not reported readiness yet: %s has not passed", pod.Name, what), false
}

// probeAction describes a probe's action for a message: "tcpSocket port 80", "httpGet port 80 /healthz".
func probeAction(pr *v1alpha1.Probe) string {
	switch {
	case pr.TCPSocket != nil:
		return "tcpSocket port " + pr.TCPSocket.Port.String()
	case pr.HTTPGet != nil:
		return "httpGet port " + pr.HTTPGet.Port.String() + " " + pr.HTTPGet.Path
	case pr.Exec != nil:
		return "exec"
	case pr.GuestAgentPing != nil:
		return "guestAgentPing"
	}
	return "no action"
}

// pausedReason tells a pause asked for (QEMU's "paused" run state, or "prelaunch" for a guest
// started with spec.startStrategy Paused and not unpaused yet) from one QEMU imposed. QEMU is in
// prelaunch too after a reset of a stopped guest (an operator's system_reset): that is not the
// start strategy.
func pausedReason(runState string, startPaused bool) string {
	switch {
	case runState == "paused":
		return ReasonPausedByUser
	case runState == "io-error":
		return ReasonPausedIOError
	case runState == "prelaunch" && startPaused:
		return ReasonPausedStartStrategy
	}
	return "Paused" + camel(runState)
}

// camel turns QEMU's "postmigrate" or "guest-panicked" into "Postmigrate", "GuestPanicked".
func camel(s string) string {
	var b strings.Builder
	for _, part := range strings.FieldsFunc(s, func(r rune) bool { return r == '-' || r == '_' }) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

// setAgentStatus sets AgentConnected (present only while the guest agent answers, as in KubeVirt)
// and status.guestOSInfo, which stays as last reported when the agent goes away.
func setAgentStatus(v *v1alpha1.VirtualMachineInstance, st *protocol.Status, now metav1.Time) {
	status := &v.Status
	ga := st.GuestAgent
	if ga == nil || !ga.Connected || st.Phase != protocol.PhaseRunning {
		meta.RemoveStatusCondition(&status.Conditions, v1alpha1.VirtualMachineInstanceAgentConnected)
	} else {
		patch.SetCondition(&status.Conditions, v, metav1.Condition{Type: v1alpha1.VirtualMachineInstanceAgentConnected,
			Status: metav1.ConditionTrue, Reason: ReasonAgentConnected, Message: "qemu-ga " + ga.Version, LastTransitionTime: now})
	}
	if ga != nil && ga.OS != nil {
		o := ga.OS
		status.GuestOSInfo = v1alpha1.VirtualMachineInstanceGuestOSInfo{Name: o.Name, KernelRelease: o.KernelRelease,
			Version: o.Version, PrettyName: o.PrettyName, VersionID: o.VersionID, KernelVersion: o.KernelVersion,
			Machine: o.Machine, ID: o.ID}
	}
}

// Where a status.interfaces entry came from, KubeVirt's infoSource values.
var (
	sourceDomain     = v1alpha1.InfoSourceDomain
	sourceBoth       = v1alpha1.InfoSourceDomain + ", " + v1alpha1.InfoSourceGuestAgent
	sourceGuestAgent = v1alpha1.InfoSourceGuestAgent
)

// interfaces are the guest NICs with the addresses they are reached at and, for a hot-plugged one,
// the root port it sits on, which a migration target recreates. The guest agent's interfaces are
// matched to the NICs by MAC, as KubeVirt does: a match adds the guest's name for it and its
// addresses, except behind masquerade, where the guest's own address is private and the pod's is
// where it is reached. On the pod network the pod's address stays the primary one (ipAddress):
// the guest may report only a link-local address before its DHCP lease. Guest interfaces that
// match no NIC (a bridge or tunnel inside the guest; not loopback) are listed after them.
func interfaces(v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status) []v1alpha1.VirtualMachineInstanceNetworkInterface {
	var out []v1alpha1.VirtualMachineInstanceNetworkInterface
	var guest []protocol.GuestInterface
	if st.GuestAgent != nil {
		guest = st.GuestAgent.Interfaces
	}
	matched := make([]bool, len(guest))
	for _, nic := range st.NICs {
		in := v1alpha1.VirtualMachineInstanceNetworkInterface{Name: nic.Name, MAC: nic.MAC, Hotplugged: nic.Hotplugged,
			RootPort: nic.Port, InfoSource: sourceDomain}
		if pod != nil && isPodNetwork(v, nic.Name) {
			in.IP = pod.Status.PodIP
			for _, ip := range pod.Status.PodIPs {
				in.IPs = append(in.IPs, ip.IP)
			}
		}
		if i := slices.IndexFunc(guest, func(g protocol.GuestInterface) bool { return strings.EqualFold(g.MAC, nic.MAC) }); i >= 0 {
			matched[i] = true
			in.InterfaceName, in.InfoSource = guest[i].Name, sourceBoth
			switch {
			case in.IP == "" && len(guest[i].IPs) > 0: // not on the pod network: the guest's own
				in.IP, in.IPs = guest[i].IPs[0], slices.Clone(guest[i].IPs)
			case in.IP != "" && !isMasquerade(v, nic.Name): // bridge: the pod's address is the guest's
				for _, ip := range guest[i].IPs {
					if !slices.Contains(in.IPs, ip) {
						in.IPs = append(in.IPs, ip)
					}
				}
			}
		}
		out = append(out, in)
	}
	for i, g := range guest {
		if matched[i] {
			continue
		}
		in := v1alpha1.VirtualMachineInstanceNetworkInterface{InterfaceName: g.Name, MAC: g.MAC,
			IPs: slices.Clone(g.IPs), InfoSource: sourceGuestAgent}
		if len(g.IPs) > 0 {
			in.IP = g.IPs[0]
		}
		out = append(out, in)
	}
	return out
}

func isMasquerade(v *v1alpha1.VirtualMachineInstance, name string) bool {
	in := v.Spec.Interface(name)
	return in != nil && in.IsMasquerade()
}

func isPodNetwork(v *v1alpha1.VirtualMachineInstance, name string) bool {
	n := v.Spec.Network(name)
	return n != nil && !n.IsSecondary()
}

// volumes are the spec's disks and the attached ones: Ready once the launcher reports a disk (QEMU
// has it), Failed with the reason when hotplug failed, Pending while a spec disk waits to be
// attached, Detaching while a hot-plugged disk no longer in the spec is still attached. Hot-plugged
// disks carry the pcie-root-port they sit on as their target, which a migration target recreates.
func volumes(v *v1alpha1.VirtualMachineInstance, st *protocol.Status, failures hotplugFailures) []v1alpha1.VolumeStatus {
	attached := map[string]protocol.DiskStatus{}
	for _, d := range st.Disks {
		attached[d.Name] = d
	}
	var out []v1alpha1.VolumeStatus
	for _, d := range v.Spec.Domain.Devices.Disks {
		// A disk the running guest lacks can only be a hotplug: cold disks come with QEMU.
		vs := v1alpha1.VolumeStatus{Name: d.Name, Phase: v1alpha1.VolumePending, Hotplugged: st.Phase == protocol.PhaseRunning}
		if a, ok := attached[d.Name]; ok {
			vs.Phase, vs.Hotplugged = v1alpha1.VolumeReady, a.Hotplugged
			vs.Target = hotplugPort(st, d.Name)
			vs.BlockSize = apiBlockSize(a.BlockSize)
		}
		if msg, ok := failures[d.Name]; ok {
			vs.Phase, vs.Reason, vs.Message, vs.Hotplugged = v1alpha1.VolumeFailed, ReasonHotplugFailed, msg, true
		}
		out = append(out, vs)
	}
	for _, d := range st.Disks {
		if hasDisk(v, d.Name) {
			continue
		}
		vs := v1alpha1.VolumeStatus{Name: d.Name, Phase: v1alpha1.VolumeDetached, Hotplugged: d.Hotplugged}
		if msg, ok := failures[d.Name]; ok {
			vs.Phase, vs.Reason, vs.Message = v1alpha1.VolumeFailed, ReasonHotplugFailed, msg
		}
		out = append(out, vs)
	}
	return out
}

// hotplugPort is the root port of a hot-plugged disk, "" for others.
func hotplugPort(st *protocol.Status, name string) string {
	for _, h := range st.Hotplugged {
		if h.Name == name {
			return h.Port
		}
	}
	return ""
}

// setSynchronized records whether the node agent could bring the launcher to the spec of v's
// generation.
func setSynchronized(v *v1alpha1.VirtualMachineInstance, err error, reason string, now metav1.Time) {
	c := metav1.Condition{Type: ConditionSynchronized, Status: metav1.ConditionTrue, Reason: ReasonSynchronized, LastTransitionTime: now}
	if err != nil {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, reason, err.Error()
	}
	patch.SetCondition(&v.Status.Conditions, v, c)
}

// apiBlockSize is the API's form of block sizes a launcher reported; nil for nil.
func apiBlockSize(bs *machine.BlockSize) *v1alpha1.CustomBlockSize {
	if bs == nil {
		return nil
	}
	out := &v1alpha1.CustomBlockSize{Logical: bs.Logical, Physical: bs.Physical}
	if bs.DiscardGranularity != 0 {
		out.DiscardGranularity = ptr.To(bs.DiscardGranularity)
	}
	return out
}
