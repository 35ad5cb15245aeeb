package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// standIns plays the nodes: it registers them, and does what their kubelets and node agents would
// do to a launcher pod and its VMI, without running anything. A pod bound to a node is set Running;
// a pod being deleted is removed (the kubelet's final delete); a VMI its controller saw Scheduled
// is set Running (the node agent's status once the guest runs). It keeps no objects, only the names
// of the VMIs it set Running (about 100 bytes each, counted in the controller's heap figure).
type standIns struct {
	c       client.WithWatch
	ns      string
	running atomic.Int64
	// podsSeen, podsBound and podsRun count pod events, bound pods seen and pods set Running: the
	// progress report says where a stuck run stopped.
	podsSeen, podsBound, podsRun atomic.Int64
	ran                          sync.Map // client.ObjectKey of each VMI set Running
	work                         chan func(context.Context)
}

// workers is how many status writes the stand-ins have in flight: a hundred kubelets and node
// agents write in parallel.
const workers = 32

func (s *standIns) registerNodes(ctx context.Context, n int) error {
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("node-%03d", i),
			Labels:      map[string]string{corev1.LabelHostname: fmt.Sprintf("node-%03d", i), v1alpha1.NodeSchedulableLabel: "true"},
			Annotations: map[string]string{v1alpha1.NodeHeartbeatAnnotation: time.Now().UTC().Format(time.RFC3339)},
		}}
		if err := s.c.Create(ctx, node); err != nil {
			return fmt.Errorf("register node %s: %w", node.Name, err)
		}
		capacity := corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("1000"),
			corev1.ResourceMemory: resource.MustParse("4Ti"),
			corev1.ResourcePods:   resource.MustParse("250"),
			// The node agent's device plugin offers these.
			v1alpha1.KVMResource: resource.MustParse("1000"),
			v1alpha1.TunResource: resource.MustParse("1000"),
		}
		node.Status = corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}},
		}
		if err := s.c.Status().Update(ctx, node); err != nil {
			return fmt.Errorf("node %s status: %w", node.Name, err)
		}
		// The API server taints a new node not-ready; the node lifecycle controller (not run
		// here) lifts the taint once the node reports Ready.
		node.Spec.Taints = nil
		if err := s.c.Update(ctx, node); err != nil {
			return fmt.Errorf("node %s untaint: %w", node.Name, err)
		}
	}
	return nil
}

// start begins watching pods and VMIs; the work ends with ctx.
func (s *standIns) start(ctx context.Context) error {
	s.work = make(chan func(context.Context), 4096)
	for range workers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case f := <-s.work:
					f(ctx)
				}
			}
		}()
	}
	pods, err := s.watch(ctx, &corev1.PodList{})
	if err != nil {
		return err
	}
	vmis, err := s.watch(ctx, &v1alpha1.VirtualMachineInstanceList{})
	if err != nil {
		return err
	}
	go testutil.DrainWatch(ctx, pods, s.seePod)
	go testutil.DrainWatch(ctx, vmis, s.seeVMI)
	return nil
}

// watch opens a watch that resumes where it broke off (RetryWatcher), from now.
func (s *standIns) watch(ctx context.Context, list client.ObjectList) (watch.Interface, error) {
	if err := s.c.List(ctx, list, client.InNamespace(s.ns), client.Limit(1)); err != nil {
		return nil, err
	}
	rv := list.(metav1.ListInterface).GetResourceVersion()
	w := watcherFunc(func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		return s.c.Watch(ctx, list.DeepCopyObject().(client.ObjectList), client.InNamespace(s.ns), &client.ListOptions{Raw: &opts})
	})
	return watchtools.NewRetryWatcherWithContext(ctx, rv, w)
}

type watcherFunc func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)

func (f watcherFunc) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return f(ctx, opts)
}

func (s *standIns) do(f func(context.Context)) { s.work <- f }

func (s *standIns) seePod(ev watch.Event) {
	pod, ok := ev.Object.(*corev1.Pod)
	s.podsSeen.Add(1)
	if !ok || ev.Type == watch.Deleted || pod.Spec.NodeName == "" {
		return
	}
	s.podsBound.Add(1)
	key := client.ObjectKeyFromObject(pod)
	switch {
	case !pod.DeletionTimestamp.IsZero():
		uid := pod.UID
		s.do(func(ctx context.Context) {
			err := s.c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}},
				client.GracePeriodSeconds(0), client.Preconditions{UID: &uid})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				fmt.Printf("stand-in kubelet: delete pod %s: %v\n", key, err)
			}
		})
	case pod.Status.Phase == corev1.PodPending:
		running := pod.DeepCopy()
		s.do(func(ctx context.Context) { s.runPod(ctx, running) })
	}
}

// runPod sets a bound pod Running with every container started, as its kubelet would.
func (s *standIns) runPod(ctx context.Context, pod *corev1.Pod) {
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.HostIP = "10.0.0.1"
	pod.Status.PodIP = "10.128.0.1"
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptrTrue(),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	// A merge patch, not an update: the controller may have changed the pod since this event, and
	// a conflict would leave it Pending with no further event to retry on.
	patch, err := json.Marshal(map[string]any{"status": pod.Status})
	if err != nil {
		fmt.Printf("stand-in kubelet: pod %s status: %v\n", pod.Name, err)
		return
	}
	err = s.c.Status().Patch(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace}}, client.RawPatch(types.MergePatchType, patch))
	if err != nil && !apierrors.IsNotFound(err) {
		fmt.Printf("stand-in kubelet: pod %s status: %v\n", pod.Name, err)
		return
	}
	s.podsRun.Add(1)
}

func ptrTrue() *bool { t := true; return &t }

func (s *standIns) seeVMI(ev watch.Event) {
	vmi, ok := ev.Object.(*v1alpha1.VirtualMachineInstance)
	if !ok || ev.Type == watch.Deleted || !vmi.DeletionTimestamp.IsZero() {
		return
	}
	if vmi.Status.Phase == v1alpha1.Scheduled {
		key := client.ObjectKeyFromObject(vmi)
		s.do(func(ctx context.Context) { s.runVMI(ctx, key) })
	}
}

// runVMI sets a Scheduled VMI Running, as its node agent does once the guest runs.
func (s *standIns) runVMI(ctx context.Context, key client.ObjectKey) {
	if _, done := s.ran.Load(key); done {
		return
	}
	patch := []byte(`{"status":{"phase":"Running"}}`)
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
	err := s.c.Status().Patch(ctx, vmi, client.RawPatch(types.MergePatchType, patch))
	if err != nil {
		if !apierrors.IsNotFound(err) {
			fmt.Printf("stand-in node agent: VMI %s status: %v\n", key, err)
		}
		return
	}
	if _, had := s.ran.LoadOrStore(key, true); !had {
		s.running.Add(1)
	}
}

// waitRunning waits until n VMIs have been seen Running.
func (s *standIns) waitRunning(b *testing.B, n int, d time.Duration) {
	b.Helper()
	deadline := time.Now().Add(d)
	next := time.Now().Add(30 * time.Second)
	for s.running.Load() < int64(n) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d VMIs Running after %s", s.running.Load(), n, d)
		}
		if time.Now().After(next) {
			b.Logf("%d of %d VMIs Running (pod events %d, bound %d, set running %d)", s.running.Load(), n, s.podsSeen.Load(), s.podsBound.Load(), s.podsRun.Load())
			next = next.Add(30 * time.Second)
			s.logUnscheduled(b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// logUnscheduled logs why the scheduler left a pod unbound, if one is.
func (s *standIns) logUnscheduled(b *testing.B) {
	var pods corev1.PodList
	if err := s.c.List(context.Background(), &pods, client.InNamespace(s.ns), client.Limit(50)); err != nil {
		return
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != "" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				b.Logf("pod %s not scheduled: %s: %s", p.Name, c.Reason, c.Message)
				return
			}
		}
	}
}

// requestCounter counts the requests of one client by kind: reads of one object, lists, watches
// and writes.
type requestCounter struct {
	mu     sync.Mutex
	counts requestCounts
}

type requestCounts struct{ get, list, watch, write int }

func (r *requestCounter) count(req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case req.Method != http.MethodGet:
		r.counts.write++
	case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
		r.counts.watch++
	case namesObject(req.URL.Path):
		r.counts.get++
	default:
		r.counts.list++
	}
}

// namesObject is true for the path of one object (…/namespaces/NS/RESOURCE/NAME, or
// RESOURCE/NAME for a cluster-scoped one) rather than a collection.
func namesObject(path string) bool {
	rest, ok := strings.CutPrefix(path, "/api/v1/")
	if !ok {
		rest, ok = strings.CutPrefix(path, "/apis/")
		if !ok {
			return false
		}
		parts := strings.SplitN(rest, "/", 3) // group, version, rest
		if len(parts) < 3 {
			return false
		}
		rest = parts[2]
	}
	parts := strings.Split(strings.Trim(rest, "/"), "/")
	if parts[0] == "namespaces" && len(parts) >= 3 {
		parts = parts[2:]
	}
	return len(parts) >= 2
}

func (r *requestCounter) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts = requestCounts{}
}

func (r *requestCounter) snapshot() requestCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts
}

// apiserverRequests is the API server's apiserver_request_total, summed over every label: the
// requests it served from every client.
func apiserverRequests(ctx context.Context, b *testing.B, cfg *rest.Config) float64 {
	b.Helper()
	counts, err := testutil.APIRequests(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	return testutil.Sum(counts)
}
