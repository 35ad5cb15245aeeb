package vmi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/internal/patch"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// Storage in the launcher pod, as KubeVirt's virt-controller renders it: a filesystem-mode claim
// is mounted at podlayout.ClaimMount(volume) (the launcher uses disk.img in it), a block-mode
// claim is the pod's device at podlayout.ClaimDevice(volume) (volumeDevices), an ephemeral
// volume's claim either of those read-only. Host disks come through hostPath volumes: each
// directory the namespace may take images from (config.HostDiskDirs, <allowed path>/<namespace>)
// is mounted whole at podlayout.HostDiskMount(dir), so a hot-plugged host disk is there too; the
// pod never mounts a directory named by the spec, so a link under the namespace's directory
// cannot make the kubelet mount another tenant's.

// PodClaimIndex indexes cached instances by the claims their volumes name and their
// backend-storage claim, so a claim that appears (or goes) wakes the instances waiting for it.
const PodClaimIndex = "vmi.qvirt.io/claims"

// Claims are the PersistentVolumeClaims an instance's volumes name, by claim name.
type Claims map[string]*corev1.PersistentVolumeClaim

// claimNames indexes an instance by its claims, its backend-storage claim included.
func claimNames(o client.Object) []string {
	vmi, ok := o.(*v1alpha1.VirtualMachineInstance)
	if !ok {
		return nil
	}
	var out []string
	if v1alpha1.NeedsBackendStorage(&vmi.Spec) {
		out = append(out, v1alpha1.BackendStorageClaim(vmi.Name))
	}
	for _, c := range v1alpha1.ClaimVolumes(&vmi.Spec) {
		if !slices.Contains(out, c.Claim) {
			out = append(out, c.Claim)
		}
	}
	return out
}

// instancesOfClaim maps a claim to the instances of its namespace that name it.
func (r *Reconciler) instancesOfClaim(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.VirtualMachineInstanceList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingFields{PodClaimIndex: o.GetName()}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}

// claims reads the instance's claims, and its backend-storage claim once it exists; missing names
// the first volume whose claim does not exist.
func (r *Reconciler) claims(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (Claims, *v1alpha1.ClaimVolume, error) {
	out := Claims{}
	for _, cv := range v1alpha1.ClaimVolumes(&vmi.Spec) {
		if _, ok := out[cv.Claim]; ok {
			continue
		}
		pvc := &corev1.PersistentVolumeClaim{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: vmi.Namespace, Name: cv.Claim}, pvc)
		if apierrors.IsNotFound(err) {
			return nil, &cv, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("get PersistentVolumeClaim %s: %w", cv.Claim, err)
		}
		out[cv.Claim] = pvc
	}
	if v1alpha1.NeedsBackendStorage(&vmi.Spec) {
		// Not missing when absent: the controller makes it (ensureBackendStorage).
		name := v1alpha1.BackendStorageClaim(vmi.Name)
		pvc := &corev1.PersistentVolumeClaim{}
		switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: vmi.Namespace, Name: name}, pvc); {
		case err == nil:
			out[name] = pvc
		case !apierrors.IsNotFound(err):
			return nil, nil, fmt.Errorf("get the backend-storage claim %s: %w", name, err)
		}
	}
	return out, nil, nil
}

// setClaimMissing records on the instance that a claim it needs is missing (missing non-nil), or
// clears that record.
func setClaimMissing(vmi *v1alpha1.VirtualMachineInstance, missing *v1alpha1.ClaimVolume) {
	var msg string
	if missing != nil {
		msg = fmt.Sprintf("%s: PersistentVolumeClaim %q does not exist in namespace %s; the launcher pod is created once it does",
			claimNameField(&vmi.Spec, missing.Volume), missing.Claim, vmi.Namespace)
	}
	setWaitingCondition(vmi, v1alpha1.PVCNotFoundReason, msg)
}

// setWaitingCondition sets the instance's Synchronized condition False with reason and msg, what
// its launcher pod waits for; with msg "" it removes the condition if it has that reason.
func setWaitingCondition(vmi *v1alpha1.VirtualMachineInstance, reason, msg string) {
	if msg == "" {
		if c := findCondition(vmi, v1alpha1.VirtualMachineInstanceSynchronized); c != nil && c.Reason == reason {
			meta.RemoveStatusCondition(&vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
		}
		return
	}
	patch.SetCondition(&vmi.Status.Conditions, vmi, metav1.Condition{
		Type: v1alpha1.VirtualMachineInstanceSynchronized, Status: metav1.ConditionFalse, Reason: reason, Message: msg,
	})
}

// claimNameField is the path of the claim name of volume, as the other conditions name fields:
// spec.volumes[NAME].persistentVolumeClaim.claimName, .ephemeral.persistentVolumeClaim.claimName,
// or .dataVolume.name (CDI's claim is named as the DataVolume).
func claimNameField(spec *v1alpha1.VirtualMachineInstanceSpec, volume string) string {
	p := fmt.Sprintf("spec.volumes[%s].", volume)
	for _, v := range spec.Volumes {
		switch {
		case v.Name != volume:
		case v.Ephemeral != nil:
			p += "ephemeral."
		case v.DataVolume != nil:
			return p + "dataVolume.name"
		}
	}
	return p + "persistentVolumeClaim.claimName"
}

func findCondition(vmi *v1alpha1.VirtualMachineInstance, t string) *metav1.Condition {
	for i := range vmi.Status.Conditions {
		if vmi.Status.Conditions[i].Type == t {
			return &vmi.Status.Conditions[i]
		}
	}
	return nil
}

// unsharedClaim names the first claim that keeps the instance on its node: one that is not
// ReadWriteMany (nor ReadOnlyMany for a claim only read), which a migration target on another node
// could not attach while the source still has it. KubeVirt requires shared claims the same way.
func unsharedClaim(spec *v1alpha1.VirtualMachineInstanceSpec, claims Claims) (volume, claim string, modes []corev1.PersistentVolumeAccessMode) {
	for _, cv := range v1alpha1.ClaimVolumes(spec) {
		pvc := claims[cv.Claim]
		if pvc == nil {
			continue
		}
		m := pvc.Spec.AccessModes
		if slices.Contains(m, corev1.ReadWriteMany) || cv.ReadOnly && slices.Contains(m, corev1.ReadOnlyMany) {
			continue
		}
		return cv.Volume, cv.Claim, m
	}
	return "", "", nil
}

// addClaimVolumes adds the claims of spec to the pod (see above), or fails naming the volume whose
// claim is not among claims.
func addClaimVolumes(pod *corev1.Pod, spec *v1alpha1.VirtualMachineInstanceSpec, claims Claims) error {
	c := &pod.Spec.Containers[0]
	cvs := v1alpha1.ClaimVolumes(spec)
	if len(cvs) > 0 {
		setLauncherFSGroup(pod)
	}
	for i, cv := range cvs {
		pvc := claims[cv.Claim]
		if pvc == nil {
			return fmt.Errorf("spec.volumes[%s]: PersistentVolumeClaim %q not found", cv.Volume, cv.Claim)
		}
		name := fmt.Sprintf("claim-%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: cv.Claim, ReadOnly: cv.ReadOnly}}})
		if mode := pvc.Spec.VolumeMode; mode != nil && *mode == corev1.PersistentVolumeBlock {
			c.VolumeDevices = append(c.VolumeDevices, corev1.VolumeDevice{Name: name, DevicePath: podlayout.ClaimDevice(cv.Volume)})
			continue
		}
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: podlayout.ClaimMount(cv.Volume), ReadOnly: cv.ReadOnly})
	}
	return nil
}

// setLauncherFSGroup makes the pod's claim volumes writable for the launcher's group: the launcher
// creates files in them (disk.img, the backend storage's state), as the kubelet does with fsGroup
// for the volume types that manage ownership; only when the volume's root is not so already, as a
// large claim's tree takes a while.
func setLauncherFSGroup(pod *corev1.Pod) {
	onRootMismatch := corev1.FSGroupChangeOnRootMismatch
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr.To[int64](podlayout.LauncherUID), FSGroupChangePolicy: &onRootMismatch}
}

// addHostDiskVolumes mounts the namespace's host disk directories when hostDisk is enabled for
// it, and fails naming a host disk of the spec that lies in none of them (the configuration
// changed since admission).
func addHostDiskVolumes(pod *corev1.Pod, namespace string, spec *v1alpha1.VirtualMachineInstanceSpec, cfg config.Config) error {
	for i := range spec.Volumes {
		if h := spec.Volumes[i].HostDisk; h != nil {
			if _, ok := cfg.HostDiskDir(namespace, h.Path); !ok {
				return field.Forbidden(field.NewPath("spec", "volumes").Index(i).Child("hostDisk", "path"),
					fmt.Sprintf("%s is in none of namespace %s's host disk directories (%s)", h.Path, namespace, strings.Join(cfg.HostDiskDirs(namespace), ", ")))
			}
		}
	}
	c := &pod.Spec.Containers[0]
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	for i, dir := range cfg.HostDiskDirs(namespace) {
		name := fmt.Sprintf("hostdisks-%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &dirOrCreate}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: podlayout.HostDiskMount(dir)})
	}
	return nil
}
