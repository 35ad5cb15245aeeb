package vmi

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

var stripManagedFields = cache.TransformStripManagedFields()

// CacheTransform is qvirt-controller's cache transform: managed fields go from every object (never
// read here, about a fifth of a cached VMI), and a launcher pod keeps only what the controller
// reads from its cache: its metadata, node and status, and of its spec the image volumes and each
// container's name, image and mounts of those volumes (the images it pulled, podImages), and
// whether it has a liveness probe (a launcher the kubelet stopped for it, terminatedPodOutcome:
// the probe itself is left out, an empty one stands for it). The rest
// of a launcher pod's spec (commands, environment, resources, security contexts, probes,
// tolerations, the other volumes) was a fifth of the controller's heap per VMI at 8,000 VMIs, and
// its one reader, the migration controller copying the source pod into the target's, reads the
// source pod from the API server.
//
// Nothing may write a cached pod back (an Update would send the trimmed spec); the controller
// only creates and deletes pods.
func CacheTransform(obj any) (any, error) {
	obj, err := stripManagedFields(obj)
	if err != nil {
		return obj, err
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		trimPodSpec(&pod.Spec)
	}
	return obj, nil
}

// trimPodSpec keeps of spec what CacheTransform says.
func trimPodSpec(spec *corev1.PodSpec) {
	var vols []corev1.Volume
	for _, v := range spec.Volumes {
		if v.Image != nil {
			vols = append(vols, corev1.Volume{Name: v.Name, VolumeSource: corev1.VolumeSource{Image: v.Image}})
		}
	}
	// A pod has a few image volumes: scanning them beats building a set for every pod event.
	isImage := func(name string) bool {
		return slices.ContainsFunc(vols, func(v corev1.Volume) bool { return v.Name == name })
	}
	cs := make([]corev1.Container, len(spec.Containers))
	for i, c := range spec.Containers {
		cs[i] = corev1.Container{Name: c.Name, Image: c.Image}
		if c.LivenessProbe != nil {
			cs[i].LivenessProbe = &corev1.Probe{}
		}
		for _, m := range c.VolumeMounts {
			if isImage(m.Name) {
				cs[i].VolumeMounts = append(cs[i].VolumeMounts, m)
			}
		}
	}
	*spec = corev1.PodSpec{Volumes: vols, Containers: cs, NodeName: spec.NodeName}
}
