package provider

import (
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// StatusOnlyPods is the pod client the virtual node gives virtual-kubelet, for its test.
func StatusOnlyPods(pods corev1client.PodsGetter, lister corev1listers.PodLister) corev1client.PodsGetter {
	return statusOnlyPods{PodsGetter: pods, pods: lister}
}

// CheckSysctls is the virtual node's check of a pod's sysctls, for its test.
var CheckSysctls = checkSysctls
