package provider_test

import (
	"context"
	"testing"
	"time"

	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/test/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// The status a virtual node reports must not erase what others annotated the pod with since the
// provider took its copy: Multus writes network-status during the pod's CNI ADD, just before the
// node reports the pod Running from a copy without it.
func TestStatusUpdateKeepsNewerAnnotations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := kubernetes.NewForConfigOrDie(cp.Config)
	ns, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "status-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{}) }()
	factory := informers.NewSharedInformerFactoryWithOptions(client, time.Minute, informers.WithNamespace(ns.Name))
	lister := factory.Core().V1().Pods().Lister()
	stop := make(chan struct{})
	factory.Start(stop)
	defer factory.Shutdown()
	defer close(stop)

	const status = "k8s.v1.cni.cncf.io/network-status"
	// The plain client shows the defect the virtual node's client mends.
	for _, tc := range []struct {
		name string
		pods corev1client.PodsGetter
		kept bool
	}{
		{name: "plain", pods: client.CoreV1(), kept: false},
		{name: "virtual-node", pods: provider.StatusOnlyPods(client.CoreV1(), lister), kept: true},
	} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns.Name, Annotations: map[string]string{"k8s.v1.cni.cncf.io/networks": "sec"}},
			Spec:       corev1.PodSpec{NodeName: "nowhere", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		if pod, err = client.CoreV1().Pods(ns.Name).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		providerCopy := pod.DeepCopy()
		patch := `{"metadata":{"annotations":{"` + status + `":"[{\"name\":\"default/sec\"}]"}}}`
		annotated, err := client.CoreV1().Pods(ns.Name).Patch(ctx, pod.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 30*time.Second, "the informer sees the annotation", func() bool {
			p, err := lister.Pods(ns.Name).Get(pod.Name)
			return err == nil && p.ResourceVersion == annotated.ResourceVersion
		})
		// What virtual-kubelet sends: the provider's copy with the informer's resourceVersion.
		providerCopy.ResourceVersion = annotated.ResourceVersion
		providerCopy.Status.Phase = corev1.PodRunning
		if _, err := tc.pods.Pods(ns.Name).UpdateStatus(ctx, providerCopy, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("%s: update status: %v", tc.name, err)
		}
		got, err := client.CoreV1().Pods(ns.Name).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != corev1.PodRunning {
			t.Errorf("%s: phase = %s, want Running", tc.name, got.Status.Phase)
		}
		if _, kept := got.Annotations[status]; kept != tc.kept {
			t.Errorf("%s: annotation %s kept = %v, want %v (annotations %v)", tc.name, status, kept, tc.kept, got.Annotations)
		}
	}
}
