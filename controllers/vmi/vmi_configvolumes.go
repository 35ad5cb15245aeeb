package vmi

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// Config volumes (secret, configMap, serviceAccount, downwardAPI). As KubeVirt's virt-controller,
// the launcher pod holds the Kubernetes volume behind each one and the launcher writes its files
// into the disk's ISO 9660 image when the VM starts: the kubelet (or a virtual node's provider)
// fetches the object with the pod's own rights, and neither the reconciler nor the node agent
// reads it.

// Token lifetime and root CA ConfigMap of a serviceAccount volume's projection: those of the
// projected volume kube-apiserver's ServiceAccount admission gives a pod that automounts its token
// (the kubelet rotates the token; the guest sees the one written when the VM started).
const (
	serviceAccountTokenSeconds = 3607
	rootCAConfigMap            = "kube-root-ca.crt"
)

// addConfigVolumes mounts each config volume's Kubernetes volume read-only at
// podlayout.ConfigVolumeMount, named by position as image volumes are. A serviceAccount volume
// makes the pod run as that service account and projects its token, the cluster's CA certificate
// and the namespace: the files a pod finds in /var/run/secrets/kubernetes.io/serviceaccount, which
// KubeVirt's launcher pod automounts. qvirt projects them explicitly into the launcher's own
// directory instead, so the launcher pod keeps automountServiceAccountToken false.
func addConfigVolumes(pod *corev1.Pod, spec *v1alpha1.VirtualMachineInstanceSpec) {
	c := &pod.Spec.Containers[0]
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		var src corev1.VolumeSource
		switch {
		case v.Secret != nil:
			src.Secret = &corev1.SecretVolumeSource{SecretName: v.Secret.SecretName, Optional: v.Secret.Optional}
		case v.ConfigMap != nil:
			src.ConfigMap = &corev1.ConfigMapVolumeSource{LocalObjectReference: v.ConfigMap.LocalObjectReference, Optional: v.ConfigMap.Optional}
		case v.DownwardAPI != nil:
			src.DownwardAPI = &corev1.DownwardAPIVolumeSource{}
			for j := range v.DownwardAPI.Fields {
				src.DownwardAPI.Items = append(src.DownwardAPI.Items, *v.DownwardAPI.Fields[j].DeepCopy())
			}
		case v.ServiceAccount != nil:
			pod.Spec.ServiceAccountName = v.ServiceAccount.ServiceAccountName
			src.Projected = serviceAccountProjection()
		default:
			continue
		}
		name := fmt.Sprintf("config-%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: src})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: podlayout.ConfigVolumeMount(v.Name), ReadOnly: true})
	}
}

// serviceAccountProjection is the projected volume kube-apiserver's ServiceAccount admission adds
// for an automounted token: token, ca.crt and namespace.
func serviceAccountProjection() *corev1.ProjectedVolumeSource {
	return &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To(corev1.ProjectedVolumeSourceDefaultMode),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](serviceAccountTokenSeconds)}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: rootCAConfigMap},
				Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace",
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}
}

// secretVolumeRefs are the Secrets that secret volumes need (those not optional), for the
// SecretNotFound condition (missingSecrets): without it a missing Secret would show only in the
// launcher pod's FailedMount events.
func secretVolumeRefs(spec *v1alpha1.VirtualMachineInstanceSpec) []cloudInitSecret {
	var out []cloudInitSecret
	for i := range spec.Volumes {
		if s := spec.Volumes[i].Secret; s != nil && !ptr.Deref(s.Optional, false) {
			out = append(out, cloudInitSecret{field: fmt.Sprintf("spec.volumes[%d].secret.secretName", i), secret: s.SecretName})
		}
	}
	return out
}
