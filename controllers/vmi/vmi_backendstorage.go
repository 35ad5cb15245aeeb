package vmi

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// The backend-storage claim (v1alpha1.BackendStorageClaim), as KubeVirt's virt-controller makes it
// (pkg/storage/backend-storage): 10Mi, filesystem, of the configured vmStateStorageClass or the
// cluster's default, controlled by the instance's VirtualMachine (so it outlives the instance
// and goes with the VM) or by the instance when no VM owns it. As KubeVirt's getAccessMode, it
// is ReadWriteMany when the operator named the class and ReadWriteOnce on the cluster's default,
// which may well offer nothing else (KubeVirt then consults CDI's StorageProfile; qvirt has none).

// stateVolume is the launcher pod's volume of the backend-storage claim.
const stateVolume = "vm-state"

// ensureBackendStorage makes sure the instance's backend-storage claim exists and can hold its
// state, when its spec needs one: it creates the claim, or checks the one of that name (the VM's,
// from its last instance), which claims holds when it exists. ready is false while the claim
// cannot be used; the instance then carries a Synchronized=False condition saying why, and the
// claim watch brings it back.
func (r *Reconciler) ensureBackendStorage(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, claims Claims) (ready bool, err error) {
	if !v1alpha1.NeedsBackendStorage(&vmi.Spec) {
		return true, nil
	}
	name := v1alpha1.BackendStorageClaim(vmi.Name)
	pvc := claims[name]
	if pvc == nil {
		err := r.createBackendStorage(ctx, vmi)
		if apierrors.IsAlreadyExists(err) {
			// Made since the cache was read: checked on the next pass, which its event brings.
			return false, nil
		}
		return err == nil, err
	}
	problem := backendStorageProblem(pvc, backendStorageOwner(vmi))
	setBackendStorageCondition(vmi, name, problem)
	return problem == "", nil
}

// createBackendStorage creates the instance's backend-storage claim.
func (r *Reconciler) createBackendStorage(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) error {
	pvc := backendStorageClaim(vmi, r.Config.Get().VMStateStorageClass)
	if err := r.Client.Create(ctx, pvc); err != nil {
		return fmt.Errorf("create the backend-storage claim %s: %w", pvc.Name, err)
	}
	ctrl.LoggerFrom(ctx).Info("created the backend-storage claim", "claim", pvc.Name, "accessMode", pvc.Spec.AccessModes[0])
	setBackendStorageCondition(vmi, pvc.Name, "")
	return nil
}

// backendStorageProblem says why an existing claim cannot hold the state of an instance whose
// claim owner should be owner, or "" when it can. A claim nobody controls (one the user made, or
// a VM's left by an orphaning delete) is taken as it is.
func backendStorageProblem(pvc *corev1.PersistentVolumeClaim, owner *metav1.OwnerReference) string {
	if !pvc.DeletionTimestamp.IsZero() {
		return "is being deleted; a new one is made once it is gone"
	}
	if c := metav1.GetControllerOf(pvc); c != nil && c.UID != owner.UID {
		return fmt.Sprintf("is controlled by %s %s (uid %s), not by this instance's %s %s (uid %s); delete it, or rename the VM",
			c.Kind, c.Name, c.UID, owner.Kind, owner.Name, owner.UID)
	}
	if ptr.Deref(pvc.Spec.VolumeMode, corev1.PersistentVolumeFilesystem) != corev1.PersistentVolumeFilesystem {
		return fmt.Sprintf("has volumeMode %s; the launcher keeps the state in files, so it must be Filesystem", *pvc.Spec.VolumeMode)
	}
	return ""
}

// setBackendStorageCondition records problem with the claim called name on the instance, or
// clears that record when problem is "".
func setBackendStorageCondition(vmi *v1alpha1.VirtualMachineInstance, name, problem string) {
	var msg string
	if problem != "" {
		msg = fmt.Sprintf("the backend-storage claim %s (for the persistent TPM or EFI variables) %s; the launcher pod is created once it can be used",
			name, problem)
	}
	setWaitingCondition(vmi, v1alpha1.BackendStorageReason, msg)
}

// backendStorageOwner is the controller of the instance's backend-storage claim: the
// VirtualMachine that controls the instance, or else the instance.
func backendStorageOwner(vmi *v1alpha1.VirtualMachineInstance) *metav1.OwnerReference {
	if c := metav1.GetControllerOf(vmi); c != nil && c.Kind == "VirtualMachine" && c.APIVersion == v1alpha1.GroupVersion.String() {
		return c
	}
	return metav1.NewControllerRef(vmi, v1alpha1.GroupVersion.WithKind("VirtualMachineInstance"))
}

// backendStorageClaim is the claim ensureBackendStorage creates for vmi.
func backendStorageClaim(vmi *v1alpha1.VirtualMachineInstance, storageClass string) *corev1.PersistentVolumeClaim {
	access := corev1.ReadWriteOnce
	if storageClass != "" {
		access = corev1.ReadWriteMany
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: vmi.Namespace, Name: v1alpha1.BackendStorageClaim(vmi.Name),
			OwnerReferences: []metav1.OwnerReference{*backendStorageOwner(vmi)}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{access},
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

// unsharedState says why the instance's persistent TPM or EFI variables keep it on its node, or ""
// when they do not: the migration target's pod mounts the backend-storage claim while the
// source's still has it, so the claim must be ReadWriteMany. claims holds it once it exists.
func unsharedState(vmi *v1alpha1.VirtualMachineInstance, claims Claims) string {
	var field string
	switch {
	case v1alpha1.PersistentTPM(&vmi.Spec):
		field = "devices.tpm.persistent"
	case v1alpha1.PersistentEFI(&vmi.Spec):
		field = "firmware.bootloader.efi.persistent"
	default:
		return ""
	}
	name := v1alpha1.BackendStorageClaim(vmi.Name)
	pvc := claims[name]
	if pvc == nil {
		return fmt.Sprintf("%s: the backend-storage claim %s does not exist yet", field, name)
	}
	if m := pvc.Spec.AccessModes; !slices.Contains(m, corev1.ReadWriteMany) {
		return fmt.Sprintf("%s: the backend-storage claim %s has access modes %v; a migration needs "+
			"ReadWriteMany, which vmStateStorageClass in qvirt-config gives when it names a class that offers it", field, name, m)
	}
	return ""
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
