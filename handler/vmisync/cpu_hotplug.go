package vmisync

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/protocol"
)

// EventVCPUsAttached is the Event reason of a CPU hotplug.
const EventVCPUsAttached = "VCPUsAttached"

// syncCPUs plugs the vCPUs of the sockets the spec has and the guest lacks (CPU hotplug: a user
// raised spec.domain.cpu.sockets, up to maxSockets, which admission checked). Never during a
// migration: a target starts with the source guest's sockets (status.currentCPUTopology) and, once
// it runs the guest, its own agent plugs the rest here. Failures are recorded as Events and
// retried.
func (r *Reconciler) syncCPUs(ctx context.Context, v *v1alpha1.VirtualMachineInstance, st *protocol.Status) error {
	c := v.Spec.Domain.CPU
	if c == nil || c.MaxSockets == 0 || st.Phase != protocol.PhaseRunning || st.Sockets == 0 ||
		!v.DeletionTimestamp.IsZero() || openMigration(v) != nil || max(c.Sockets, 1) <= st.Sockets {
		return nil
	}
	lc := r.launchers.client(v.UID)
	defer lc.Close()
	if err := lc.SetSockets(ctx, c.Sockets); err != nil {
		return r.hotplugFailed(v, fmt.Errorf("plug vCPUs up to %d sockets: %s%w", c.Sockets, specFieldOf(v, err), err))
	}
	r.Recorder.Eventf(v, corev1.EventTypeNormal, EventVCPUsAttached, "The guest has %d sockets of %d vCPUs now (it had %d)",
		c.Sockets, max(c.Cores, 1)*max(c.Threads, 1), st.Sockets)
	return nil
}
