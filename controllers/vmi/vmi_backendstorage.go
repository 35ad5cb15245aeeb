package vmi

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// The backend-storage claim (v1alpha1.BackendStorageClaim), as KubeVirt's virt-controller makes it
// (pkg/storage/backend-storage): ReadWriteMany, 10Mi, filesystem, of the configured
// vmStateStorageClass or the cluster's default, controlled by the instance's VirtualMachine (so
// it outlives the instance and goes with the VM) or by the instance when no VM owns it.

// stateVolume is the launcher pod's volume of the backend-storage claim.
const stateVolume = "vm-state"

// ensureBackendStorage creates the instance's backend-storage claim when its spec needs one and
// the claim does not exist yet; an existing claim of that name is used as it is.
func (r *Reconciler) ensureBackendStorage(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	if !v1alpha1.NeedsBackendStorage(&vmi.Spec) {
		return nil
	}
	name := v1alpha1.BackendStorageClaim(vmi.Name)
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: vmi.Namespace, Name: name}, &corev1.PersistentVolumeClaim{})
	if err == nil || !apierrors.IsNotFound(err) {
		return err
	}
	pvc := backendStorageClaim(vmi, r.Config.Get().VMStateStorageClass)
	if err := r.Client.Create(ctx, pvc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the backend-storage claim %s: %w", name, err)
	}
	ctrl.LoggerFrom(ctx).Info("created the backend-storage claim", "claim", name)
	return nil
}

// backendStorageClaim is the claim ensureBackendStorage creates for vmi.
func backendStorageClaim(vmi *v1alpha1.VirtualMachineInstance, storageClass string) *corev1.PersistentVolumeClaim {
	owner := metav1.GetControllerOf(vmi)
	if owner == nil {
		owner = metav1.NewControllerRef(vmi, v1alpha1.GroupVersion.WithKind("VirtualMachineInstance"))
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: vmi.Namespace, Name: v1alpha1.BackendStorageClaim(vmi.Name),
			OwnerReferences: []metav1.OwnerReference{*owner}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			VolumeMode:  ptr.To(corev1.PersistentVolumeFilesystem),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(v1alpha1.BackendStorageSize)}},
		},
	}
	if storageClass != "" {
		pvc.Spec.StorageClassName = ptr.To(storageClass)
	}
	return pvc
}

// addBackendStorage mounts the instance's backend-storage claim at podlayout.StateDir, writable
// for the launcher's group (as addClaimVolumes does for disk claims), when its spec needs one.
func addBackendStorage(pod *corev1.Pod, vmi *v1alpha1.VirtualMachineInstance) {
	if !v1alpha1.NeedsBackendStorage(&vmi.Spec) {
		return
	}
	setLauncherFSGroup(pod)
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: stateVolume, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: v1alpha1.BackendStorageClaim(vmi.Name)}}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: stateVolume, MountPath: podlayout.StateDir})
}
