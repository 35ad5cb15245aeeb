package vmi

import (
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
)

// CacheTransform is qvirt-controller's cache transform: managed fields go from every object (never
// read here, about a fifth of a cached VMI), and a launcher pod keeps only what the controller
// reads from its cache: its metadata, node, volumes, each container's name, image and mounts
// (the images it pulled, vmi_images.go), and its status. A launcher pod's commands, environment,
// resources, security contexts, probes, tolerations and affinity are a third of the controller's
// heap per VMI at 8,000 VMIs, and the one reader of the whole spec, the migration controller
// copying the source pod into the target's, reads it from the API server.
//
// Nothing may write a cached pod back (an Update would send the trimmed spec); the controller
// only creates and deletes pods.
func CacheTransform(obj any) (any, error) {
	obj, err := cache.TransformStripManagedFields()(obj)
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
	*spec = corev1.PodSpec{
		Volumes:        spec.Volumes,
		InitContainers: trimContainers(spec.InitContainers),
		Containers:     trimContainers(spec.Containers),
		NodeName:       spec.NodeName,
	}
}

func trimContainers(cs []corev1.Container) []corev1.Container {
	if cs == nil {
		return nil
	}
	out := make([]corev1.Container, len(cs))
	for i, c := range cs {
		out[i] = corev1.Container{Name: c.Name, Image: c.Image, VolumeMounts: c.VolumeMounts}
	}
	return out
}
