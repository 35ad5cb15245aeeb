package provider

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Claims on a virtual node, as a kubelet's volume plugins give them to a pod. Until the claim is
// Bound the pod waits in ContainerCreating with FailedMount Events, as for a Secret (secrets.go).
// Its PersistentVolume's source must be a host path (local mode's provisioner makes such volumes, local/storage): a filesystem-mode
// volume's directory is bound into the container at its mountPath like any other volume, a
// block-mode volume's file is attached to a loop device (loop.go) whose node the container gets at
// its volumeDevices' devicePath.

// claimVolume resolves a pod's claim to the host path of its volume.
func (r *podRun) claimVolume(name string, src *corev1.PersistentVolumeClaimVolumeSource) (volume, error) {
	return r.waitVolume(name, func() (volume, error) { return r.attachClaim(src) })
}

// attachClaim gives the claim's volume to the pod; an error wrapping errVolumeNotReady (the claim
// missing, or not Bound yet) is worth retrying, as a kubelet retries: the scheduler places a pod
// once its claim names a volume, a moment before the claim's status says Bound.
func (r *podRun) attachClaim(src *corev1.PersistentVolumeClaimVolumeSource) (volume, error) {
	ctx := context.Background()
	ns := r.pod.Namespace
	pvc, err := r.p.client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, src.ClaimName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return volume{}, fmt.Errorf("persistentvolumeclaim %q not found: %w", src.ClaimName, errVolumeNotReady)
	}
	if err != nil {
		return volume{}, fmt.Errorf("claim %s: %w", src.ClaimName, err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		return volume{}, fmt.Errorf("claim %s is %s, not Bound: %w", src.ClaimName, pvc.Status.Phase, errVolumeNotReady)
	}
	pv, err := r.p.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return volume{}, fmt.Errorf("claim %s: volume %s: %w", src.ClaimName, pvc.Spec.VolumeName, err)
	}
	var path string
	switch s := pv.Spec.PersistentVolumeSource; {
	case s.HostPath != nil:
		path = s.HostPath.Path
	case s.Local != nil:
		path = s.Local.Path
	default:
		return volume{}, fmt.Errorf("claim %s: volume %s is neither hostPath nor local, which this node cannot attach", src.ClaimName, pv.Name)
	}
	if mode := pv.Spec.VolumeMode; mode == nil || *mode != corev1.PersistentVolumeBlock {
		fi, err := os.Stat(path)
		if err != nil || !fi.IsDir() {
			return volume{}, fmt.Errorf("claim %s: volume %s: %s is not a directory (%v)", src.ClaimName, pv.Name, path, err)
		}
		if err := applyFSGroup(r.pod, path, src.ReadOnly); err != nil {
			return volume{}, fmt.Errorf("claim %s: %w", src.ClaimName, err)
		}
		return volume{path: path, readOnly: src.ReadOnly}, nil
	}
	dev, rdev, err := attachLoop(path, src.ReadOnly)
	if err != nil {
		return volume{}, fmt.Errorf("claim %s: volume %s: %w", src.ClaimName, pv.Name, err)
	}
	if err := recordLoop(r.dir, dev, path); err != nil {
		_ = detachLoop(dev, path)
		return volume{}, fmt.Errorf("claim %s: record the loop device: %w", src.ClaimName, err)
	}
	return volume{path: dev, rdev: rdev, readOnly: src.ReadOnly}, nil
}

// blockDeviceMounts give container c its volumeDevices: a node of the loop device behind each,
// owned by the container's user as a runtime gives it, bound at the devicePath.
func (r *podRun) blockDeviceMounts(c *corev1.Container, vols map[string]volume) ([]bindMount, error) {
	var out []bindMount
	cred := credential(r.pod, c)
	for _, d := range c.VolumeDevices {
		v, ok := vols[d.Name]
		if !ok || v.rdev == 0 {
			return nil, fmt.Errorf("volumeDevices %s: volume %s is not a block-mode claim", d.DevicePath, d.Name)
		}
		node := filepath.Join(r.dir, "dev", c.Name, "block-"+d.Name)
		if err := os.MkdirAll(filepath.Dir(node), 0o755); err != nil {
			return nil, err
		}
		_ = os.Remove(node)
		mode := uint32(0o660)
		if v.readOnly {
			mode = 0o440
		}
		if err := unix.Mknod(node, unix.S_IFBLK|mode, int(v.rdev)); err != nil {
			return nil, fmt.Errorf("volumeDevices %s: %w", d.DevicePath, err)
		}
		if cred != nil {
			if err := os.Chown(node, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
		out = append(out, bindMount{source: node, target: d.DevicePath, file: true})
	}
	return out, nil
}

// applyFSGroup gives the root of a writable claim's directory to the pod's fsGroup, group-writable
// and set-group-ID, as the kubelet does for volumes that manage ownership (with
// fsGroupChangePolicy OnRootMismatch: only the root, and only when it differs).
func applyFSGroup(pod *corev1.Pod, dir string, readOnly bool) error {
	sc := pod.Spec.SecurityContext
	if readOnly || sc == nil || sc.FSGroup == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	const want = unix.S_ISGID | 0o070
	if int64(st.Gid) == *sc.FSGroup && st.Mode&want == want {
		return nil
	}
	if err := os.Lchown(dir, -1, int(*sc.FSGroup)); err != nil {
		return fmt.Errorf("fsGroup %d on %s: %w", *sc.FSGroup, dir, err)
	}
	return unix.Chmod(dir, (st.Mode&0o7777)|want)
}
