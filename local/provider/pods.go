package provider

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/launcher/imagepull"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
)

// pods is the node's PodLifecycleHandler and PodNotifier: it keeps one podRun per pod it was asked
// to create, keyed namespace/name, until the pod is deleted and its processes are gone.
// virtual-kubelet calls it from several workers; every method is safe for concurrent use.
type pods struct {
	opts Options
	net  *network
	log  logr.Logger

	// Set by serve before the pod controller runs.
	client     kubernetes.Interface
	configMaps corev1listers.ConfigMapLister
	secrets    corev1listers.SecretLister
	recorder   record.EventRecorder
	// images pulls and keeps the images of image volumes; nil when Options.ImageCache is empty.
	images *imagepull.Store
	// cpu holds each pod in a cgroup weighted by its CPU requests; nil confines nothing.
	cpu *cpuGroups

	mu     sync.Mutex
	byKey  map[string]*podRun
	notify func(*corev1.Pod)
}

func newPods(opts Options, net *network, images *imagepull.Store, log logr.Logger) *pods {
	return &pods{opts: opts, net: net, images: images, log: log, byKey: map[string]*podRun{}, notify: func(*corev1.Pod) {}}
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// event tells the pod's users what the node is doing with it, as the kubelet's Events do.
func (p *pods) event(pod *corev1.Pod, typ, reason, msg string) {
	if p.recorder != nil {
		p.recorder.Event(pod, typ, reason, msg)
	}
}

// CreatePod starts the pod's sandbox and containers in the background; progress arrives through
// NotifyPods.
func (p *pods) CreatePod(_ context.Context, pod *corev1.Pod) error {
	key := podKey(pod.Namespace, pod.Name)
	p.mu.Lock()
	defer p.mu.Unlock()
	if old, ok := p.byKey[key]; ok {
		if old.uid() == pod.UID {
			return nil
		}
		// A pod of the same name is still terminating; virtual-kubelet retries with back-off.
		return errdefs.InvalidInputf("pod %s: a previous pod of that name is still terminating", key)
	}
	r := newPodRun(p, pod)
	p.byKey[key] = r
	go r.run()
	return nil
}

// UpdatePod takes the mutable metadata (labels, annotations) that fieldRefs read; a running
// container's spec cannot change.
func (p *pods) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	r := p.get(pod.Namespace, pod.Name)
	if r == nil {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	r.updateMeta(pod)
	return nil
}

// DeletePod stops the pod: SIGTERM now, SIGKILL after its grace period. It returns at once; once
// the processes are gone the final status is reported and the pod object deleted with grace 0.
func (p *pods) DeletePod(_ context.Context, pod *corev1.Pod) error {
	r := p.get(pod.Namespace, pod.Name)
	if r == nil || (pod.UID != "" && r.uid() != pod.UID) {
		return errdefs.NotFoundf("pod %s/%s is not on this node", pod.Namespace, pod.Name)
	}
	r.stop(gracePeriod(pod, 0), true)
	return nil
}

func (p *pods) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	r := p.get(namespace, name)
	if r == nil {
		return nil, errdefs.NotFoundf("pod %s/%s is not on this node", namespace, name)
	}
	return r.snapshot(), nil
}

func (p *pods) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

func (p *pods) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.byKey))
	for _, r := range p.byKey {
		out = append(out, r.snapshot())
	}
	return out, nil
}

// NotifyPods registers virtual-kubelet's status callback.
func (p *pods) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notify = cb
}

func (p *pods) notifyStatus(pod *corev1.Pod) {
	p.mu.Lock()
	cb := p.notify
	p.mu.Unlock()
	cb(pod)
}

func (p *pods) get(namespace, name string) *podRun {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byKey[podKey(namespace, name)]
}

// forget drops a pod whose processes and sandbox are gone.
func (p *pods) forget(r *podRun) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byKey[r.key] == r {
		delete(p.byKey, r.key)
	}
}

// shutdown stops every pod (grace capped at ShutdownGrace) and waits until their processes and
// sandboxes are gone. Pod objects are left alone.
func (p *pods) shutdown(ctx context.Context) {
	p.mu.Lock()
	runs := make([]*podRun, 0, len(p.byKey))
	for _, r := range p.byKey {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	for _, r := range runs {
		r.stop(gracePeriod(r.snapshot(), p.opts.ShutdownGrace), false)
	}
	for _, r := range runs {
		select {
		case <-r.done:
		case <-ctx.Done():
			return
		}
	}
}

// gracePeriod is the pod's deletion grace period (or its spec's, default 30 s), capped by max when
// max is positive.
func gracePeriod(pod *corev1.Pod, maxGrace time.Duration) time.Duration {
	secs := int64(corev1.DefaultTerminationGracePeriodSeconds)
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		secs = *pod.DeletionGracePeriodSeconds
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		secs = *pod.Spec.TerminationGracePeriodSeconds
	}
	d := time.Duration(secs) * time.Second
	if maxGrace > 0 && d > maxGrace {
		d = maxGrace
	}
	return d
}
