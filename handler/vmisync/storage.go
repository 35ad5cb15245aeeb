package vmisync

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/machine"
)

// Storage, from the node agent's side. The controller renders each claim and each hostDisk
// directory into the launcher pod; the node agent reads what the launcher needs beyond the pod
// (a claim's capacity, which is known once it is bound) and, like KubeVirt's virt-handler, makes
// the pod's host disk images usable by the unprivileged launcher: it creates a DiskOrCreate image
// and hands the image to the launcher's user. It does so through the launcher's own root
// (/proc/PID/root) without following any link, so a link under a host disk directory cannot make
// it create or hand over a file elsewhere.

// podVolumes is what the launcher pod holds for v's claims and host disks.
func (r *Reconciler) podVolumes(ctx context.Context, v *v1alpha1.VirtualMachineInstance, pod *corev1.Pod) (*translate.PodVolumes, error) {
	pv := &translate.PodVolumes{HostDisks: map[string]string{}, Claims: map[string]translate.Claim{}}
	mounts, devices := map[string]string{}, map[string]bool{}
	for _, c := range pod.Spec.Containers {
		if c.Name != podlayout.ComputeContainer {
			continue
		}
		for _, m := range c.VolumeMounts {
			mounts[m.Name] = m.MountPath
		}
		for _, d := range c.VolumeDevices {
			devices[d.Name] = true
		}
	}
	for _, mount := range mounts {
		if mount == podlayout.StateDir {
			pv.StateDir = mount
		}
	}
	for _, vol := range pod.Spec.Volumes {
		mount, ok := mounts[vol.Name]
		if vol.HostPath != nil && ok && strings.HasPrefix(mount, podlayout.HostDisksDir+"/") {
			pv.HostDisks[vol.HostPath.Path] = mount
		}
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	for _, vol := range pod.Spec.Volumes {
		pvc := vol.PersistentVolumeClaim
		if pvc == nil {
			continue
		}
		if _, seen := pv.Claims[pvc.ClaimName]; seen {
			continue
		}
		var claim corev1.PersistentVolumeClaim
		if err := reader.Get(ctx, client.ObjectKey{Namespace: v.Namespace, Name: pvc.ClaimName}, &claim); err != nil {
			return nil, fmt.Errorf("claim %s of volume %s: %w", pvc.ClaimName, vol.Name, err)
		}
		c := translate.Claim{Block: devices[vol.Name]}
		if q, ok := claim.Status.Capacity[corev1.ResourceStorage]; ok {
			c.CapacityBytes = q.Value()
		} else if !c.Block {
			return nil, fmt.Errorf("claim %s of volume %s has no capacity yet (phase %s)", pvc.ClaimName, vol.Name, claim.Status.Phase)
		}
		pv.Claims[pvc.ClaimName] = c
	}
	return pv, nil
}

// prepareHostDisks readies the host disk images of disks for the launcher peer (see above).
func prepareHostDisks(peer launcher.Peer, disks []machine.Disk) error {
	for i := range disks {
		hf := disks[i].Source.HostFile
		if hf == nil || hf.Root == "" {
			continue
		}
		if err := prepareHostDisk(peer, hf); err != nil {
			return fmt.Errorf("host disk of volume %q: %w", disks[i].Name, err)
		}
	}
	return nil
}

// beneath resolves a path under a directory descriptor without links, magic links or crossing
// into another mount.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

func prepareHostDisk(peer launcher.Peer, hf *machine.HostFile) error {
	rel, err := filepath.Rel(hf.Root, hf.Path)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("%s is not under %s", hf.Path, hf.Root)
	}
	root, err := unix.Open("/proc/"+strconv.Itoa(peer.PID)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the launcher's root: %w", err)
	}
	defer unix.Close(root)
	dir, err := unix.Openat2(root, hf.Root, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return fmt.Errorf("the launcher pod's %s: %w", hf.Root, err)
	}
	create := hf.CreateBytes > 0
	parts := strings.Split(rel, "/")
	for _, name := range parts[:len(parts)-1] {
		if create {
			if err := unix.Mkdirat(dir, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(dir)
				return fmt.Errorf("create directory %s in %s: %w", name, hf.Root, err)
			}
		}
		next, err := unix.Openat2(dir, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: beneath})
		unix.Close(dir)
		if err != nil {
			return fmt.Errorf("%s: directory %s: %w", hf.Path, name, err)
		}
		dir = next
	}
	defer unix.Close(dir)
	name := parts[len(parts)-1]
	created := false
	fd := -1
	if create {
		fd, err = unix.Openat2(dir, name, &unix.OpenHow{Flags: unix.O_RDWR | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC, Mode: 0o660, Resolve: beneath})
		created = err == nil
	}
	if !created {
		fd, err = unix.Openat2(dir, name, &unix.OpenHow{Flags: unix.O_RDWR | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: beneath})
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", hf.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return fmt.Errorf("%s is not a regular file with one link", hf.Path)
	}
	if created {
		if err := unix.Ftruncate(fd, hf.CreateBytes); err != nil {
			return fmt.Errorf("size %s: %w", hf.Path, err)
		}
	}
	if err := unix.Fchown(fd, int(peer.UID), int(peer.GID)); err != nil {
		return fmt.Errorf("give %s to the launcher's user: %w", hf.Path, err)
	}
	return nil
}
