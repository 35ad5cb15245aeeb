package vmi

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/patch"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// Cloud-init Secrets. A cloud-init volume's secretRef and networkDataSecretRef reach the launcher
// as Secret volumes of its pod (addCloudInitSecrets): the kubelet (or a virtual node's provider)
// writes them and the launcher reads them; the node agent never does. A pod whose Secret is missing
// waits in ContainerCreating until it appears, which a user would see only in the pod's events, so
// until the instance is scheduled the reconciler looks the Secrets up (metadata only) and says in
// the Synchronized condition which volume waits for which Secret.

// ConditionSynchronized is the node agent's condition (handler/vmisync): the reconciler writes it
// only with ReasonSecretNotFound, before the instance reaches a node, and removes only that.
const ConditionSynchronized = v1alpha1.VirtualMachineInstanceSynchronized

// ReasonSecretNotFound: a cloud-init volume, or a secret volume that is not optional, names a
// Secret that does not exist.
const ReasonSecretNotFound = "SecretNotFound"

// secretRecheck is how often a missing Secret is looked up again: nothing watches Secrets.
const secretRecheck = 10 * time.Second

// cloudInitSecret is one Secret a cloud-init volume reads, and where the pod mounts it.
type cloudInitSecret struct {
	// field is the reference's path in the spec, for people.
	field, secret     string
	volume, mountPath string
}

// cloudInitSecrets are the Secret references of spec's cloud-init volumes, in spec order. Pod
// volume names are by position, as image volumes' (a VMI volume name may already be 63 bytes).
func cloudInitSecrets(spec *v1alpha1.VirtualMachineInstanceSpec) []cloudInitSecret {
	var out []cloudInitSecret
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		c, kind, ok := v.CloudInit()
		if !ok {
			continue
		}
		p := fmt.Sprintf("spec.volumes[%d].%s", i, kind)
		if r := c.UserDataSecretRef; r != nil {
			out = append(out, cloudInitSecret{field: p + ".secretRef", secret: r.Name,
				volume: fmt.Sprintf("cloudinit-%d-%s", i, podlayout.CloudInitUserData), mountPath: podlayout.CloudInitSecretMount(v.Name, podlayout.CloudInitUserData)})
		}
		if r := c.NetworkDataSecretRef; r != nil {
			out = append(out, cloudInitSecret{field: p + ".networkDataSecretRef", secret: r.Name,
				volume: fmt.Sprintf("cloudinit-%d-%s", i, podlayout.CloudInitNetworkData), mountPath: podlayout.CloudInitSecretMount(v.Name, podlayout.CloudInitNetworkData)})
		}
	}
	return out
}

// addCloudInitSecrets mounts each cloud-init Secret read-only into the compute container.
func addCloudInitSecrets(pod *corev1.Pod, spec *v1alpha1.VirtualMachineInstanceSpec) {
	c := &pod.Spec.Containers[0]
	for _, s := range cloudInitSecrets(spec) {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: s.volume, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: s.secret}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: s.volume, MountPath: s.mountPath, ReadOnly: true})
	}
}

// checkCloudInitSecrets sets or clears the Synchronized=False SecretNotFound condition of an
// instance not yet on a node, and says when to look again.
func (r *Reconciler) checkCloudInitSecrets(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) (time.Duration, error) {
	switch vmi.Status.Phase {
	case "", v1alpha1.Pending, v1alpha1.Scheduling:
	default:
		clearSecretNotFound(vmi)
		return 0, nil
	}
	missing, err := r.missingSecrets(ctx, vmi)
	if err != nil {
		return 0, err
	}
	if len(missing) == 0 {
		clearSecretNotFound(vmi)
		return 0, nil
	}
	patch.SetCondition(&vmi.Status.Conditions, vmi, metav1.Condition{
		Type: ConditionSynchronized, Status: metav1.ConditionFalse, Reason: ReasonSecretNotFound,
		Message: strings.Join(missing, "; ") + ": the launcher pod waits for it to be created",
	})
	return secretRecheck, nil
}

// missingSecrets describes each Secret reference (of a cloud-init volume, or a secret volume that
// is not optional) whose Secret does not exist.
func (r *Reconciler) missingSecrets(ctx context.Context, vmi *v1alpha1.VirtualMachineInstance) ([]string, error) {
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	var missing []string
	for _, s := range append(cloudInitSecrets(&vmi.Spec), secretVolumeRefs(&vmi.Spec)...) {
		// Metadata only, uncached: the reconciler needs to know a Secret exists, never what it holds.
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		err := reader.Get(ctx, types.NamespacedName{Namespace: vmi.Namespace, Name: s.secret}, m)
		switch {
		case apierrors.IsNotFound(err):
			missing = append(missing, fmt.Sprintf("%s: Secret %q not found", s.field, s.secret))
		case err != nil:
			return nil, fmt.Errorf("look up Secret %s of %s: %w", s.secret, s.field, client.IgnoreNotFound(err))
		}
	}
	return missing, nil
}

// clearSecretNotFound removes the reconciler's own Synchronized condition, leaving the node agent's.
func clearSecretNotFound(vmi *v1alpha1.VirtualMachineInstance) {
	if c := meta.FindStatusCondition(vmi.Status.Conditions, ConditionSynchronized); c != nil && c.Reason == ReasonSecretNotFound {
		meta.RemoveStatusCondition(&vmi.Status.Conditions, ConditionSynchronized)
	}
}
