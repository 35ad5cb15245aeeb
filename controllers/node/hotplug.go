package node

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
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
func (r *Reconciler) syncDisks(ctx context.Context, v *v1alpha1.VirtualMachineInstance, st *launcher.Status) (hotplugFailures, error) {
	if st.Phase != launcher.PhaseRunning || !v.DeletionTimestamp.IsZero() || openMigration(v) != nil {
		return nil, nil
	}
	attached := map[string]launcher.DiskStatus{}
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
		if _, err := c.HotplugVolume(ctx, launcher.VolumeHotplug{Disk: *d, Volume: *vol}); err != nil {
			fail(d.Name, fmt.Errorf("attach volume %q: %w", d.Name, err))
			continue
		}
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventVolumeAttached, "Volume %s attached to the running guest", d.Name)
	}
	for _, d := range st.Disks {
		if !d.Hotplugged || hasDisk(v, d.Name) {
			continue
		}
		if err := c.UnplugVolume(ctx, d.Name); err != nil {
			fail(d.Name, fmt.Errorf("detach volume %q: %w", d.Name, err))
			continue
		}
		r.Recorder.Eventf(v, corev1.EventTypeNormal, EventVolumeDetached, "Volume %s detached from the guest", d.Name)
	}
	return failures, errors.Join(errs...)
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

// splitHotplugged is the spec a migration target starts from: the disks hot-plugged on the source
// (those whose volume status names a root port) come out of the spec and go on the same ports,
// so the guest finds every device where it was.
func splitHotplugged(v *v1alpha1.VirtualMachineInstance) (v1alpha1.VirtualMachineInstanceSpec, []launcher.PlacedVolume) {
	ports := map[string]string{}
	for _, vs := range v.Status.VolumeStatus {
		if vs.Hotplugged && vs.Phase == v1alpha1.VolumeReady && vs.Target != "" {
			ports[vs.Name] = vs.Target
		}
	}
	spec := *v.Spec.DeepCopy()
	if len(ports) == 0 {
		return spec, nil
	}
	var placed []launcher.PlacedVolume
	var disks []v1alpha1.Disk
	for _, d := range spec.Domain.Devices.Disks {
		port, hot := ports[d.Name]
		vol := findVolume(v, d.Name)
		if !hot || vol == nil {
			disks = append(disks, d)
			continue
		}
		placed = append(placed, launcher.PlacedVolume{VolumeHotplug: launcher.VolumeHotplug{Disk: d, Volume: *vol}, Port: port})
	}
	var volumes []v1alpha1.Volume
	for _, vol := range spec.Volumes {
		if _, hot := ports[vol.Name]; !hot {
			volumes = append(volumes, vol)
		}
	}
	spec.Domain.Devices.Disks, spec.Volumes = disks, volumes
	return spec, placed
}
