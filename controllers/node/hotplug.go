package node

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

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
// so the guest finds every device where it was. Disks the source has not attached (yet) come out
// too: started cold they would take a root port ahead of the spare ones, shift those and break
// the migration; the target's agent hot-plugs them once the guest has arrived.
func splitHotplugged(v *v1alpha1.VirtualMachineInstance) (v1alpha1.VirtualMachineInstanceSpec, []launcher.PlacedVolume) {
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
	spec := *v.Spec.DeepCopy()
	var placed []launcher.PlacedVolume
	var disks []v1alpha1.Disk
	for _, d := range spec.Domain.Devices.Disks {
		if cold[d.Name] {
			disks = append(disks, d)
			continue
		}
		port, hot := ports[d.Name]
		if vol := findVolume(v, d.Name); hot && vol != nil {
			placed = append(placed, launcher.PlacedVolume{VolumeHotplug: launcher.VolumeHotplug{Disk: d, Volume: *vol}, Port: port})
		}
	}
	var volumes []v1alpha1.Volume
	for _, vol := range spec.Volumes {
		if cold[vol.Name] {
			volumes = append(volumes, vol)
		}
	}
	spec.Domain.Devices.Disks, spec.Volumes = disks, volumes
	return spec, placed
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
func (r *Reconciler) syncNICs(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod, st *launcher.Status) error {
	if st.Phase != launcher.PhaseRunning || !v.DeletionTimestamp.IsZero() || openMigration(v) != nil {
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
	peer, err := launcher.PeerOf(ctx, launcher.VMIDir(r.SocketDir, v.UID).Command())
	if err != nil {
		return fmt.Errorf("find the launcher process: %w", err)
	}
	setups, err := setupNetwork(v, pod, peer)
	if err != nil {
		return err
	}
	if len(setups) != 1 || setups[0].Name != in.Name {
		return fmt.Errorf("network setup made %d interfaces, want %s alone", len(setups), in.Name)
	}
	s := setups[0]
	c := r.launchers.client(v.UID)
	defer c.Close()
	return c.HotplugNIC(ctx, launcher.NICHotplug{Name: s.Name, Tap: s.Tap, MAC: s.MAC, Model: in.Model, DHCP: s.DHCP})
}

func (r *Reconciler) unplugNIC(ctx context.Context, v *v1alpha1.VirtualMachineInstance, name string) error {
	c := r.launchers.client(v.UID)
	defer c.Close()
	if err := c.UnplugNIC(ctx, name); err != nil {
		return err
	}
	peer, err := launcher.PeerOf(ctx, launcher.VMIDir(r.SocketDir, v.UID).Command())
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
	for _, in := range v.Spec.Domain.Devices.Interfaces {
		if in.Name == name {
			return true
		}
	}
	return false
}

// splitHotpluggedNICs is the network half of a migration target's start, as splitHotplugged is for
// disks. spec (the target's copy) keeps the interfaces the guest booted with. Those hot-plugged on
// the source (hotplugged in the status, with the root port) come out of it, with their networks,
// and are placed on the same ports, each with the host side setupNetwork made in the target pod
// (setups). Those the source has not attached yet (no status) come out too: the target's agent
// hot-plugs them once the guest has arrived, as the source's would have. It returns the setups of
// the interfaces left in spec.
func splitHotpluggedNICs(v *v1alpha1.VirtualMachineInstance, spec *v1alpha1.VirtualMachineInstanceSpec, setups []launcher.InterfaceSetup) ([]launcher.InterfaceSetup, []launcher.PlacedNIC, error) {
	attached := map[string]v1alpha1.VirtualMachineInstanceNetworkInterface{}
	for _, in := range v.Status.Interfaces {
		attached[in.Name] = in
	}
	var keep []v1alpha1.Interface
	var placed []launcher.PlacedNIC
	for i, in := range spec.Domain.Devices.Interfaces {
		st, ok := attached[in.Name]
		if ok && !st.Hotplugged {
			keep = append(keep, in)
			continue
		}
		if !ok {
			continue // still to be hot-plugged
		}
		p := field.NewPath("status", "interfaces").Key(in.Name).Child("rootPort")
		if st.RootPort == "" {
			return nil, nil, field.Required(p, fmt.Sprintf("interface %q was hot-plugged on the source but its root port is unknown", in.Name))
		}
		s := findSetup(setups, in.Name)
		if s == nil {
			return nil, nil, field.InternalError(field.NewPath("spec", "domain", "devices", "interfaces").Index(i),
				fmt.Errorf("no host side was set up for hot-plugged interface %q", in.Name))
		}
		placed = append(placed, launcher.PlacedNIC{Port: st.RootPort,
			NICHotplug: launcher.NICHotplug{Name: s.Name, Tap: s.Tap, MAC: s.MAC, Model: in.Model, DHCP: s.DHCP}})
	}
	if len(keep) == len(spec.Domain.Devices.Interfaces) {
		return setups, nil, nil
	}
	kept := map[string]bool{}
	for _, in := range keep {
		kept[in.Name] = true
	}
	var nets []v1alpha1.Network
	for _, n := range spec.Networks {
		if kept[n.Name] {
			nets = append(nets, n)
		}
	}
	var keptSetups []launcher.InterfaceSetup
	for _, s := range setups {
		if kept[s.Name] {
			keptSetups = append(keptSetups, s)
		}
	}
	spec.Domain.Devices.Interfaces, spec.Networks = keep, nets
	return keptSetups, placed, nil
}

func findSetup(setups []launcher.InterfaceSetup, name string) *launcher.InterfaceSetup {
	for i := range setups {
		if setups[i].Name == name {
			return &setups[i]
		}
	}
	return nil
}
