package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/cpumanager"
)

// DefaultHeartbeatInterval is how often the node agent beats, as KubeVirt's virt-handler.
const DefaultHeartbeatInterval = 30 * time.Second

// finalPatchTimeout bounds the "schedulable=false" patch on a clean stop, made after the manager's
// context is already cancelled.
const finalPatchTimeout = 10 * time.Second

// Heartbeat keeps the node agent's word on its Node: NodeSchedulableLabel=true, NodeKVMLabel,
// NodeQEMUVersionLabel, NodePostCopyLabel (and the reason annotations when KVM or post-copy does
// not work) and a fresh
// NodeHeartbeatAnnotation, written every Interval with one merge patch and no read (so the agent
// never caches Nodes). On a clean stop it sets NodeSchedulableLabel=false, so no launcher pod is
// placed here while the agent is away.
//
// Each beat sets schedulable=true again: that is how a node the controller marked unresponsive
// comes back, and the controller itself never sets "true" (see controllers/nodehealth).
//
// It is a manager.Runnable without leader election: every node's agent beats for its own node.
type Heartbeat struct {
	client   client.Client
	node     string
	caps     Capabilities
	interval time.Duration
	now      func() time.Time
	// streams is advertised in NodeStreamsAddressAnnotation; "" removes the annotation.
	streams string
	// userfaultfdSysctl is the node's vm.unprivileged_userfaultfd, read at every beat: whether
	// launchers can take an incoming post-copy migration (NodePostCopyLabel).
	userfaultfdSysctl string
	// cpuManagerState is the kubelet's CPU manager checkpoint, read at every beat
	// (NodeCPUManagerLabel); "" leaves the label to the administrator.
	cpuManagerState string
}

// CPUManagerStateFile is the kubelet's CPU manager checkpoint.
const CPUManagerStateFile = cpumanager.StateFile

// UserfaultfdSysctl is the sysctl that gives unprivileged processes, such as launchers,
// userfaultfd. vm.* sysctls are the host's in every container.
const UserfaultfdSysctl = "/proc/sys/vm/unprivileged_userfaultfd"

// NewHeartbeat returns the heartbeat of node nodeName with the probed capabilities. interval <= 0
// means DefaultHeartbeatInterval. c only needs to patch Nodes; a manager's client does so without
// starting a Node informer.
func NewHeartbeat(c client.Client, nodeName string, caps Capabilities, interval time.Duration) *Heartbeat {
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	return &Heartbeat{client: c, node: nodeName, caps: caps, interval: interval, now: time.Now, userfaultfdSysctl: UserfaultfdSysctl}
}

// AdvertiseStreams makes every beat publish addr (host:port of the stream server) in
// NodeStreamsAddressAnnotation, where qvirt-api looks for it.
func (h *Heartbeat) AdvertiseStreams(addr string) *Heartbeat {
	h.streams = addr
	return h
}

// WithUserfaultfdSysctl reads the userfaultfd switch from path instead of UserfaultfdSysctl.
func (h *Heartbeat) WithUserfaultfdSysctl(path string) *Heartbeat {
	h.userfaultfdSysctl = path
	return h
}

// WithCPUManagerState reads the kubelet's CPU manager state from path; "" (the default) leaves
// NodeCPUManagerLabel alone.
func (h *Heartbeat) WithCPUManagerState(path string) *Heartbeat {
	h.cpuManagerState = path
	return h
}

// cpuManager reports whether the kubelet runs the static CPU manager policy, which gives a
// Guaranteed pod's containers with whole CPUs CPUs of their own, and why not; known is false when
// the state cannot be read, and the label is then left as it is (an administrator's, as KubeVirt
// allows).
func (h *Heartbeat) cpuManager() (static, known bool, why string) {
	if h.cpuManagerState == "" {
		return false, false, "the node agent reads no kubelet CPU manager state (--cpu-manager-state is empty): the label " + v1alpha1.NodeCPUManagerLabel + " is the administrator's"
	}
	st, err := cpumanager.Read(h.cpuManagerState)
	if err != nil {
		return false, false, err.Error()
	}
	if st.PolicyName != "static" {
		return false, true, fmt.Sprintf("the kubelet's CPU manager policy is %q: dedicated CPUs need its static policy", st.PolicyName)
	}
	return true, true, ""
}

// postCopy reports whether launchers here can take an incoming post-copy migration, and why not.
func (h *Heartbeat) postCopy() (bool, string) {
	data, err := os.ReadFile(h.userfaultfdSysctl)
	switch {
	case err != nil:
		return false, fmt.Sprintf("read %s: %v", h.userfaultfdSysctl, err)
	case strings.TrimSpace(string(data)) == "1":
		return true, ""
	}
	return false, fmt.Sprintf("%s is %s: the unprivileged launchers cannot open the userfaultfd an incoming post-copy needs (set it to 1 to allow it)",
		h.userfaultfdSysctl, strings.TrimSpace(string(data)))
}

// NeedLeaderElection is false: the agent of each node runs its own heartbeat.
func (h *Heartbeat) NeedLeaderElection() bool { return false }

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;patch

// Start beats at once, then every interval until ctx ends, then marks the node unschedulable. A
// failed beat is logged and retried at the next tick: a missed beat or two is what the controller's
// timeout allows for. It returns the final patch's error, if any.
func (h *Heartbeat) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithValues("node", h.node)
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		if err := h.Beat(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "heartbeat")
		}
		select {
		case <-ctx.Done():
			return h.stop(context.WithoutCancel(ctx))
		case <-t.C:
		}
	}
}

// Beat writes the labels and a fresh heartbeat once.
func (h *Heartbeat) Beat(ctx context.Context) error {
	postCopy, why := h.postCopy()
	labels := map[string]string{
		v1alpha1.NodeSchedulableLabel: "true",
		v1alpha1.NodeKVMLabel:         fmt.Sprint(h.caps.KVM),
		v1alpha1.NodeQEMUVersionLabel: h.caps.QEMUVersion,
		v1alpha1.NodePostCopyLabel:    fmt.Sprint(postCopy),
	}
	static, known, cpuWhy := h.cpuManager()
	if known {
		labels[v1alpha1.NodeCPUManagerLabel] = fmt.Sprint(static)
	}
	return h.patch(ctx, map[string]any{
		"labels": labels,
		"annotations": map[string]any{
			v1alpha1.NodeHeartbeatAnnotation:        h.now().UTC().Format(time.RFC3339),
			v1alpha1.NodeKVMReasonAnnotation:        reasonUnless(h.caps.KVM, h.caps.KVMReason),
			v1alpha1.NodeStreamsAddressAnnotation:   nullIfEmpty(h.streams),
			v1alpha1.NodePostCopyReasonAnnotation:   reasonUnless(postCopy, why),
			v1alpha1.NodeCPUManagerReasonAnnotation: nullIfEmpty(cpuWhy),
		},
	})
}

// reasonUnless is why a capability is missing, or JSON null (removing the annotation) once it
// works.
func reasonUnless(works bool, why string) *string {
	if works {
		return nil
	}
	return nullIfEmpty(why)
}

// nullIfEmpty is s, or JSON null (which a merge patch reads as "remove") when s is empty.
func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (h *Heartbeat) stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, finalPatchTimeout)
	defer cancel()
	err := h.patch(ctx, map[string]any{"labels": map[string]string{v1alpha1.NodeSchedulableLabel: "false"}})
	if err != nil {
		return fmt.Errorf("mark node %s unschedulable on stop: %w", h.node, err)
	}
	logf.FromContext(ctx).Info("node marked unschedulable: node agent stopping", "node", h.node)
	return nil
}

// patch merge-patches the Node's metadata. The merge patch carries no resourceVersion: the agent
// owns these keys, so a concurrent change elsewhere on the Node is no conflict.
func (h *Heartbeat) patch(ctx context.Context, metadata map[string]any) error {
	body, err := json.Marshal(map[string]any{"metadata": metadata})
	if err != nil {
		return fmt.Errorf("node %s patch: %w", h.node, err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.node}}
	if err := h.client.Patch(ctx, node, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("patch node %s: %w", h.node, err)
	}
	return nil
}
