package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Volume hotplug takes the VMI spec's disk and volume, as the node agent finds them in the spec
// (KubeVirt's model: the user edits spec.volumes and spec.domain.devices.disks, the node agent
// attaches the difference). The volume is resolved by the launcher's Resolver exactly as at start,
// by resolving a spec that holds only this disk and volume: Resolvers must accept being called
// again for such a one-volume request while the VM runs, and create nothing but that volume's
// image. The attach itself is HotplugDisk's.

var (
	hotDiskPath   = field.NewPath("disk")
	hotVolumePath = field.NewPath("volume")
)

// HotplugVolume checks req, resolves its volume and attaches it as a virtio disk. It returns the
// disk as attached (image, format and the root port it took).
func (l *Launcher) HotplugVolume(ctx context.Context, req *VolumeHotplug) (DiskHotplug, error) {
	if errs := validateVolumeHotplug(req); len(errs) > 0 {
		return DiskHotplug{}, errs.ToAggregate()
	}
	l.volumes.Lock()
	defer l.volumes.Unlock()
	p, err := l.process()
	if err != nil {
		return DiskHotplug{}, err
	}
	// Refuse a taken name before resolving: resolving an emptyDisk of a cold-plugged disk's name
	// would find (and the cleanup below remove) that disk's image.
	l.mu.Lock()
	_, hot := l.hotplug[req.Disk.Name]
	syncReq := l.req
	l.mu.Unlock()
	if hot || p.Machine().hasDisk(req.Disk.Name) {
		return DiskHotplug{}, field.Duplicate(hotDiskPath.Child("name"), req.Disk.Name)
	}
	img, err := l.resolveVolume(syncReq, req)
	if err != nil {
		return DiskHotplug{}, err
	}
	d := diskHotplug(req, img, "")
	if err := l.HotplugDisk(ctx, &d); err != nil {
		removeEphemeral(d)
		return DiskHotplug{}, err
	}
	return d, nil
}

// UnplugVolume detaches a hot-plugged disk once the guest has let it go, and deletes the image
// the launcher created for it (an emptyDisk).
func (l *Launcher) UnplugVolume(ctx context.Context, name string) error {
	l.volumes.Lock()
	defer l.volumes.Unlock()
	l.mu.Lock()
	d := l.hotplug[name]
	l.mu.Unlock()
	if err := l.UnplugDisk(ctx, name); err != nil {
		return err
	}
	removeEphemeral(d)
	return nil
}

// removeEphemeral deletes an image created for a hot-plugged emptyDisk. Only files named as the
// resolver names emptyDisk images are touched.
func removeEphemeral(d DiskHotplug) {
	if !d.Ephemeral || !strings.HasSuffix(d.Path, "/"+emptyDiskFile(d.Name)) {
		return
	}
	_ = os.Remove(d.Path)
}

func validateVolumeHotplug(req *VolumeHotplug) field.ErrorList {
	errs := v1alpha1.ValidateHotplugDisk(&req.Disk, hotDiskPath)
	errs = append(errs, v1alpha1.ValidateHotplugVolume(&req.Volume, hotVolumePath)...)
	if req.Disk.Name != req.Volume.Name {
		errs = append(errs, field.Invalid(hotVolumePath.Child("name"), req.Volume.Name, fmt.Sprintf("must be the disk's name %q", req.Disk.Name)))
	}
	return errs
}

// resolveVolume resolves req's volume with the launcher's Resolver, as part of a spec holding only
// req's disk and volume; field paths in errors are rewritten to name req's fields.
func (l *Launcher) resolveVolume(base *SyncRequest, req *VolumeHotplug) (DiskImage, error) {
	one := &SyncRequest{Name: base.Name, Namespace: base.Namespace, UID: base.UID, Emulation: base.Emulation}
	one.Spec.Domain.Devices.Disks = []v1alpha1.Disk{req.Disk}
	one.Spec.Volumes = []v1alpha1.Volume{req.Volume}
	m, err := l.resolver.Resolve(one, l.runDir)
	if err != nil {
		return DiskImage{}, requestPaths(err)
	}
	img, ok := m.Disks[req.Volume.Name]
	if !ok || img.Path == "" {
		return DiskImage{}, field.InternalError(hotVolumePath, errors.New("the resolver returned no image for the volume"))
	}
	if img.Backing != nil {
		return DiskImage{}, field.Forbidden(hotVolumePath, "a volume with a backing image cannot be hot-plugged")
	}
	return img, nil
}

// requestPaths renames the one-volume spec's paths (spec.volumes[0]..., spec.domain.devices.disks[0]...)
// to the request's (volume..., disk...).
func requestPaths(err error) error {
	rename := func(fe *field.Error) *field.Error {
		out := *fe
		for from, to := range map[string]string{"spec.volumes[0]": "volume", "spec.domain.devices.disks[0]": "disk"} {
			if rest, ok := strings.CutPrefix(out.Field, from); ok {
				out.Field = to + rest
			}
		}
		return &out
	}
	var fe *field.Error
	var agg interface{ Errors() []error }
	switch {
	case errors.As(err, &agg):
		var errs field.ErrorList
		for _, e := range agg.Errors() {
			if errors.As(e, &fe) {
				errs = append(errs, rename(fe))
			} else {
				return err
			}
		}
		return errs.ToAggregate()
	case errors.As(err, &fe):
		return rename(fe)
	}
	return err
}

// placeVolumes resolves a migration target's hot-plugged spec disks (req.HotplugVolumes) into
// req.Hotplugged, on the root ports they have on the source.
func (l *Launcher) placeVolumes(req *SyncRequest) error {
	for i := range req.HotplugVolumes {
		pv := &req.HotplugVolumes[i]
		p := field.NewPath("hotplugVolumes").Index(i)
		if errs := validateVolumeHotplug(&pv.VolumeHotplug); len(errs) > 0 {
			return fmt.Errorf("%s: %w", p, errs.ToAggregate())
		}
		if pv.Port == "" {
			return field.Required(p.Child("port"), "the root port the disk has on the source")
		}
		img, err := l.resolveVolume(req, &pv.VolumeHotplug)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		req.Hotplugged = append(req.Hotplugged, diskHotplug(&pv.VolumeHotplug, img, pv.Port))
	}
	return nil
}

// diskHotplug is the attachment of a resolved spec disk, on port ("" for the first free one).
func diskHotplug(req *VolumeHotplug, img DiskImage, port string) DiskHotplug {
	return DiskHotplug{Name: req.Disk.Name, Path: img.Path, Format: img.Format, Serial: req.Disk.Serial,
		ReadOnly:  img.ReadOnly || (req.Disk.Disk != nil && req.Disk.Disk.ReadOnly),
		Ephemeral: req.Volume.EmptyDisk != nil, Port: port}
}
