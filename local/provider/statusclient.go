package provider

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// statusOnlyPods is the pod client virtual-kubelet writes pod status with. virtual-kubelet sends
// the provider's copy of the pod to pods/status, with the informer's resourceVersion; the API
// server takes a status update's labels and annotations too, so an annotation written since the
// provider's copy was taken (Multus's network-status, written during the pod's CNI ADD) would be
// erased. UpdateStatus here writes the status into the informer's copy of the pod instead, so
// metadata and resourceVersion agree: a stale informer copy conflicts and virtual-kubelet retries.
// A kubelet patches only the status, to the same effect.
type statusOnlyPods struct {
	corev1client.PodsGetter
	pods corev1listers.PodLister
}

func (c statusOnlyPods) Pods(namespace string) corev1client.PodInterface {
	return statusOnlyPodInterface{PodInterface: c.PodsGetter.Pods(namespace), pods: c.pods.Pods(namespace)}
}

type statusOnlyPodInterface struct {
	corev1client.PodInterface
	pods corev1listers.PodNamespaceLister
}

func (c statusOnlyPodInterface) UpdateStatus(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error) {
	current, err := c.current(ctx, pod)
	if err != nil {
		return nil, err
	}
	if current.UID != pod.UID && pod.UID != "" {
		return nil, apierrors.NewConflict(corev1.Resource("pods"), pod.Name, fmt.Errorf("pod %s/%s is now UID %s, not %s", pod.Namespace, pod.Name, current.UID, pod.UID))
	}
	out := current.DeepCopy()
	out.Status = pod.Status
	return c.PodInterface.UpdateStatus(ctx, out, opts)
}

// current is the pod as last seen: the informer's copy, or the API server's when the caller asked
// for an unconditional write (no resourceVersion) or the informer has not seen the pod.
func (c statusOnlyPodInterface) current(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	if pod.ResourceVersion != "" {
		if cached, err := c.pods.Get(pod.Name); err == nil {
			return cached, nil
		}
	}
	return c.PodInterface.Get(ctx, pod.Name, metav1.GetOptions{})
}
