package testutil

import corev1 "k8s.io/api/core/v1"

// RunningWithImageRefs is the status a kubelet reports for container c running, with ref(m) as the
// imageRef of each volume mount m it returns one for (ImageVolumeWithDigest:
// volumeMounts[].volumeStatus.image.imageRef).
func RunningWithImageRefs(c corev1.Container, ref func(m corev1.VolumeMount) string) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{Name: c.Name, Image: c.Image, Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	for _, m := range c.VolumeMounts {
		ms := corev1.VolumeMountStatus{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly}
		if r := ref(m); r != "" {
			ms.VolumeStatus = &corev1.VolumeStatus{Image: &corev1.ImageVolumeStatus{ImageRef: r}}
		}
		cs.VolumeMounts = append(cs.VolumeMounts, ms)
	}
	return cs
}
