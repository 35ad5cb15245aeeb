package vmisync

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// Disk hotplug follows KubeVirt's model: the desired disks are the instance's spec (volumes and
// disks are the only spec fields that may change, see api/v1alpha1), and this reconciler plugs and
// unplugs until the launcher's disks match. The launcher resolves each volume itself, as at start.

// Event reasons and the volume status reason of hotplug.
const (
	EventVolumeAttached = "VolumeAttached"
	EventVolumeDetached = "VolumeDetached"
	EventHotplugFailed  = "HotplugFailed"
	ReasonHotplugFailed = "HotplugFailed"
)

// hotplugFailures maps a disk name to why it could not be attached or detached.
type hotplugFailures map[string]string

// syncDisks attaches the spec's disks the launcher lacks and detaches hot-plugged disks the spec no
// longer has. A failure is recorded for its disk (and an Event when it is new) and does not stop
// the others; the returned error makes the reconcile retry with backoff.
func (r *Reconciler) syncDisks(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status) (hotplugFailures, error) {
	if st.Phase != protocol.PhaseRunning || !v.DeletionTimestamp.IsZero() || openMigration(v) != nil {
		return nil, nil
	}
	attached := map[string]protocol.DiskStatus{}
	for _, d := range st.Disks {
		attached[d.Name] = d
	}
	c := r.launchers.client(v.UID)
	defer c.Close()
	failures := hotplugFailures{}
	var errs []error
	fail := func(name string, err error) {
		failures[name] = err.Error()
		errs = append(errs, err)
		if previousFailure(v, name) != err.Error() {
			r.Recorder.Event(v, corev1.EventTypeWarning, EventHotplugFailed, err.Error())
		}
	}
	for i := range v.Spec.Domain.Devices.Disks {
		d := &v.Spec.Domain.Devices.Disks[i]
		if _, ok := attached[d.Name]; ok {
			continue
		}
		vol := findVolume(v, d.Name)
		if vol == nil {
			continue // the API refuses a disk without its volume
		}
		md, err := r.hotplugDisk(ctx, v, pod, d, vol, field.NewPath("spec", "domain", "devices", "disks").Index(i))
		if err == nil {
			_, err = c.HotplugDisk(ctx, md)
		}
		if err != nil {
			fail(d.Name, fmt.Errorf("attach volume %q: %w", d.Name, err))
			continue
		}
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventVolumeAttached, "Volume %s attached to the running guest", d.Name)
	}
	for _, d := range st.Disks {
		if !d.Hotplugged || hasDisk(v, d.Name) {
			continue
		}
		if err := c.UnplugDisk(ctx, d.Name); err != nil {
			fail(d.Name, fmt.Errorf("detach volume %q: %w", d.Name, err))
			continue
		}
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventVolumeDetached, "Volume %s detached from the guest", d.Name)
	}
	return failures, errors.Join(errs...)
}

// hotplugDisk describes disk d on volume vol for a hot-plug, its host disk image made ready for
// the launcher.
func (r *Reconciler) hotplugDisk(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, d *v1alpha1.Disk, vol *v1alpha1.Volume, p *field.Path) (machine.Disk, error) {
	vols, err := r.podVolumes(ctx, v, pod)
	if err != nil {
		return machine.Disk{}, err
	}
	md, err := translate.HotplugDisk(&v.Spec.Domain, d, vol, vols, p)
	if err != nil || md.Source.HostFile == nil {
		return md, err
	}
	peer, err := r.peer(ctx, v)
	if err != nil {
		return machine.Disk{}, fmt.Errorf("find the launcher process: %w", err)
	}
	return md, prepareHostDisks(peer, []machine.Disk{md})
}

func findVolume(v *v1alpha1.VirtualMachineInstance, name string) *v1alpha1.Volume {
	for i := range v.Spec.Volumes {
		if v.Spec.Volumes[i].Name == name {
			return &v.Spec.Volumes[i]
		}
	}
	return nil
}

func hasDisk(v *v1alpha1.VirtualMachineInstance, name string) bool {
	for _, d := range v.Spec.Domain.Devices.Disks {
		if d.Name == name {
			return true
		}
	}
	return false
}

// previousFailure is the message of the volume's last recorded failure, "" when none.
func previousFailure(v *v1alpha1.VirtualMachineInstance, name string) string {
	for _, vs := range v.Status.VolumeStatus {
		if vs.Name == name && vs.Phase == v1alpha1.VolumeFailed {
			return vs.Message
		}
	}
	return ""
}

// Event reasons of NIC hotplug.
const (
	EventInterfaceAttached = "InterfaceAttached"
	EventInterfaceDetached = "InterfaceDetached"
)

// syncNICs attaches a spec interface the launcher lacks (the pod network's: an instance has at
// most one, so it can only be hot-plugged into an instance that had none) after setting up its
// host side in the pod, and detaches a hot-plugged NIC the spec no longer has, then tears its host
// side down so the pod network is whole again. Failures are recorded as Events and retried.
func (r *Reconciler) syncNICs(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *protocol.Status) error {
	if st.Phase != protocol.PhaseRunning || !v.DeletionTimestamp.IsZero() || openMigration(v) != nil {
		return nil
	}
	attached := map[string]bool{}
	for _, n := range st.NICs {
		attached[n.Name] = true
	}
	var errs []error
	for _, in := range v.Spec.Domain.Devices.Interfaces {
		if attached[in.Name] {
			continue
		}
		if err := r.plugNIC(ctx, v, pod, in); err != nil {
			errs = append(errs, r.hotplugFailed(v, fmt.Errorf("attach interface %q: %w", in.Name, err)))
			continue
		}
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventInterfaceAttached, "Interface %s attached to the running guest", in.Name)
	}
	for _, n := range st.NICs {
		if !n.Hotplugged || hasInterface(v, n.Name) {
			continue
		}
		if err := r.unplugNIC(ctx, v, n.Name); err != nil {
			errs = append(errs, r.hotplugFailed(v, fmt.Errorf("detach interface %q: %w", n.Name, err)))
			continue
		}
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventInterfaceDetached, "Interface %s detached from the guest", n.Name)
	}
	return errors.Join(errs...)
}

func (r *Reconciler) plugNIC(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, in v1alpha1.Interface) error {
	peer, err := r.peer(ctx, v)
	if err != nil {
		return fmt.Errorf("find the launcher process: %w", err)
	}
	hosts, err := setupNetwork(v, pod, peer)
	if err != nil {
		return err
	}
	if _, ok := hosts[in.Name]; !ok {
		return fmt.Errorf("network setup made no interface %s", in.Name)
	}
	n, errs := translate.NIC(&in, hosts, field.NewPath("spec", "domain", "devices", "interfaces").Key(in.Name))
	if len(errs) > 0 {
		return errs.ToAggregate()
	}
	c := r.launchers.client(v.UID)
	defer c.Close()
	return c.HotplugNIC(ctx, n)
}

func (r *Reconciler) unplugNIC(ctx context.Context, v *v1alpha1.VirtualMachineInstance, name string) error {
	c := r.launchers.client(v.UID)
	defer c.Close()
	if err := c.UnplugNIC(ctx, name); err != nil {
		return err
	}
	peer, err := r.peer(ctx, v)
	if err != nil {
		return fmt.Errorf("find the launcher process: %w", err)
	}
	return teardownNetwork(peer)
}

// hotplugFailed records a NIC hotplug failure as an Event, once per distinct failure, and returns
// it. The status is left alone: rewriting it would bring the instance straight back, bypassing the
// retry back-off.
func (r *Reconciler) hotplugFailed(v *v1alpha1.VirtualMachineInstance, err error) error {
	if r.launchers.newFailure(v.UID, err.Error()) {
		r.Recorder.Event(v, corev1.EventTypeWarning, EventHotplugFailed, err.Error())
	}
	return err
}

func hasInterface(v *v1alpha1.VirtualMachineInstance, name string) bool {
	return v.Spec.Interface(name) != nil
}

// targetMachine makes m, translated from the whole spec, the machine a migration target starts
// with: the guest must find the source's devices where and as they were.
func targetMachine(v *v1alpha1.VirtualMachineInstance, m *machine.Machine) error {
	if err := sourceSockets(v, m); err != nil {
		return err
	}
	if err := sourceMemory(v, m); err != nil {
		return err
	}
	for i := range m.Disks {
		if err := sourceBlockSize(v, &m.Disks[i]); err != nil {
			return err
		}
	}
	return placeHotplugged(v, m)
}

// sourceSockets gives a migration target with CPU hotplug room the sockets the source's guest has
// (status.currentCPUTopology), not the spec's: a spec raised while the migration was made was not
// plugged on the source, and a target that started with more vCPUs would give the guest vCPUs it
// was never told of. The target's node agent plugs the rest once the guest has arrived.
func sourceSockets(v *v1alpha1.VirtualMachineInstance, m *machine.Machine) error {
	if m.CPU.MaxSockets == 0 {
		return nil
	}
	cur := v.Status.CurrentCPUTopology
	if cur == nil || cur.Sockets == 0 || cur.Sockets > m.CPU.MaxSockets {
		return fmt.Errorf("status.currentCPUTopology %+v: the source's sockets are unknown or beyond maxSockets %d; "+
			"a target with CPU hotplug room must start with the source's vCPUs", cur, m.CPU.MaxSockets)
	}
	m.CPU.Sockets = cur.Sockets
	m.CPU.VCPUs = cur.Sockets * m.CPU.Cores * m.CPU.Threads
	return nil
}

// placeHotplugged makes m, translated from the whole spec, the machine a migration target starts
// with: exactly the source's device set, each hot-plugged device on the root port it has there, so
// the guest finds every device where it was. Disks and interfaces the source has not attached
// (yet) come out: started cold they would take a root port ahead of the spare ones, shift those and
// break the migration; the target's agent hot-plugs them once the guest has arrived.
func placeHotplugged(v *v1alpha1.VirtualMachineInstance, m *machine.Machine) error {
	ports := map[string]string{}
	cold := map[string]bool{}
	for _, vs := range v.Status.VolumeStatus {
		switch {
		case !vs.Hotplugged && vs.Phase == v1alpha1.VolumeReady:
			cold[vs.Name] = true
		case vs.Hotplugged && vs.Phase == v1alpha1.VolumeReady && vs.Target != "":
			ports[vs.Name] = vs.Target
		}
	}
	var disks []machine.Disk
	for _, d := range m.Disks {
		if port, hot := ports[d.Name]; hot {
			d.Port = port
		} else if !cold[d.Name] {
			continue
		}
		disks = append(disks, d)
	}
	m.Disks = disks
	attached := map[string]v1alpha1.VirtualMachineInstanceNetworkInterface{}
	for _, in := range v.Status.Interfaces {
		attached[in.Name] = in
	}
	var nics []machine.NIC
	for _, n := range m.NICs {
		st, ok := attached[n.Name]
		if !ok {
			continue // still to be hot-plugged
		}
		if st.Hotplugged {
			if st.RootPort == "" {
				return field.Required(field.NewPath("status", "interfaces").Key(n.Name).Child("rootPort"),
					fmt.Sprintf("interface %q was hot-plugged on the source but its root port is unknown", n.Name))
			}
			n.Port = st.RootPort
		}
		nics = append(nics, n)
	}
	m.NICs = nics
	return nil
}

// sourceBlockSize gives a migration target's disk d that takes its block sizes from its volume
// the sizes the source read from its own (status.volumeStatus[].blockSize): the target's storage
// may differ (a block migration copies the disk to the target's), and the guest's disk must not
// change under it. A disk the source has not attached yet reads its own when it is hot-plugged.
func sourceBlockSize(v *v1alpha1.VirtualMachineInstance, d *machine.Disk) error {
	if !d.MatchVolumeBlockSize {
		return nil
	}
	for i, vs := range v.Status.VolumeStatus {
		if vs.Name != d.Name || vs.Phase != v1alpha1.VolumeReady {
			continue
		}
		if vs.BlockSize == nil {
			return field.Required(field.NewPath("status", "volumeStatus").Index(i).Child("blockSize"),
				fmt.Sprintf("disk %q takes its block sizes from its volume, and the source has not reported the ones its guest sees", d.Name))
		}
		d.BlockSize = translate.BlockSize(vs.BlockSize)
	}
	return nil
}
