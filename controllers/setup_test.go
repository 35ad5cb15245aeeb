package controllers_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests run the real qvirt-controller binary against a real API server, the way a cluster
// runs it. No node agent exists yet: the test plays it by binding the launcher pod, marking it
// Running and writing the VMI's Running phase, and says so where it does.

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

func eventually(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startController builds and starts qvirt-controller with leader election, returning its metrics
// and health addresses.
func startController(t *testing.T, namespace string) (metrics, health string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "qvirt-controller")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/qvirt-controller").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	metrics = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	health = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	cmd := exec.Command(bin, "--kubeconfig", cp.Kubeconfig, "--namespace", namespace, "--leader-elect",
		"--webhooks=false", "--metrics-bind-address", metrics, "--health-probe-bind-address", health)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("qvirt-controller logs:\n%s", logs.String())
		}
	})
	return metrics, health
}

// checkMetricsAuth reads the controller's /metrics as a scraper would: over HTTPS, with the
// token of a ServiceAccount bound to config/rbac's qvirt-metrics-reader. Without a token, or with
// one of a ServiceAccount holding no such binding, nothing is served.
func checkMetricsAuth(t *testing.T, addr string) {
	t.Helper()
	ctx := context.Background()
	if out, errOut, err := cp.KubectlCmd(ctx, nil, "apply", "-f", "../config/rbac/metrics_reader_role.yaml"); err != nil {
		t.Fatalf("apply the scraper role: %v: %s%s", err, out, errOut)
	}
	scraper, stranger := saToken(t, "scraper", "qvirt-metrics-reader"), saToken(t, "stranger", "")
	url := "https://" + addr + "/metrics"
	if code, body := testutil.GetWithToken(url, ""); code != http.StatusUnauthorized && code != http.StatusForbidden {
		t.Errorf("/metrics without a token answered %d, want 401 or 403: %.300s", code, body)
	}
	if code, body := testutil.GetWithToken(url, stranger); code != http.StatusForbidden {
		t.Errorf("/metrics for a ServiceAccount without the scraper role answered %d, want 403: %.300s", code, body)
	}
	var code int
	var body string
	eventually(t, 30*time.Second, "/metrics to serve the scraper", func() bool {
		code, body = testutil.GetWithToken(url, scraper)
		return code == http.StatusOK
	})
	if !strings.Contains(body, "controller_runtime_reconcile_total") {
		t.Fatalf("/metrics answered %d without reconcile metrics", code)
	}
}

// saToken creates ServiceAccount default/name, binds it to clusterRole unless that is "", and
// returns a token for it.
func saToken(t *testing.T, name, clusterRole string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	token, err := testutil.ServiceAccountToken(context.Background(), cs, "default", name, clusterRole)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func TestControllerBinaryRunsAVMAndDeletesItInOrder(t *testing.T) {
	ctx := context.Background()
	c := cp.Client
	for _, ns := range []string{"qvirt-system", "demo"} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "qvirt-config", Namespace: "qvirt-system"},
		Data: map[string]string{"useEmulation": "true", "launcherImage": "example.test/launcher:v1"}}); err != nil {
		t.Fatal(err)
	}
	metrics, health := startController(t, "qvirt-system")

	eventually(t, 30*time.Second, "/readyz", func() bool { code, _ := testutil.GetWithToken("http://"+health+"/readyz", ""); return code == 200 })
	if code, _ := testutil.GetWithToken("http://"+health+"/healthz", ""); code != 200 {
		t.Fatalf("/healthz answered %d", code)
	}

	rs := v1alpha1.RunStrategyAlways
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "demo"},
		Spec: v1alpha1.VirtualMachineSpec{RunStrategy: &rs, Template: v1alpha1.VirtualMachineInstanceTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
			Spec: v1alpha1.VirtualMachineInstanceSpec{Domain: v1alpha1.DomainSpec{
				Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("128Mi"))},
			}},
		}},
	}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}

	var pod corev1.Pod
	eventually(t, 30*time.Second, "the launcher pod", func() bool {
		var pods corev1.PodList
		_ = c.List(ctx, &pods, client.InNamespace("demo"), client.MatchingLabels{v1alpha1.VMINameLabel: "web"})
		if len(pods.Items) != 1 {
			return false
		}
		pod = pods.Items[0]
		return true
	})
	if img := pod.Spec.Containers[0].Image; img != "example.test/launcher:v1" {
		t.Fatalf("launcher image %q: the ConfigMap's launcherImage was not applied", img)
	}
	if pod.Labels["app"] != "web" || pod.Labels[v1alpha1.VMNameLabel] != "web" {
		t.Fatalf("pod labels %v lack the VM's labels", pod.Labels)
	}
	if _, kvm := pod.Spec.Containers[0].Resources.Limits[v1alpha1.KVMResource]; kvm {
		t.Fatal("useEmulation is on, yet the pod asks for /dev/kvm")
	}

	// Playing the scheduler and kubelet: bind the pod and mark it running.
	if err := c.SubResource("binding").Create(ctx, &pod, &corev1.Binding{Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the pod to be marked Running", func() bool {
		if err := c.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
			return false
		}
		pod.Status.Phase = corev1.PodRunning
		return c.Status().Update(ctx, &pod) == nil
	})
	vmiKey := client.ObjectKey{Namespace: "demo", Name: "web"}
	eventually(t, 30*time.Second, "the VMI to be Scheduled on node-1", func() bool {
		var vmi v1alpha1.VirtualMachineInstance
		return c.Get(ctx, vmiKey, &vmi) == nil && vmi.Status.Phase == v1alpha1.Scheduled && vmi.Status.NodeName == "node-1"
	})
	// Playing the node agent: the guest runs.
	eventually(t, 10*time.Second, "the node agent's Running status to stick", func() bool {
		var vmi v1alpha1.VirtualMachineInstance
		if err := c.Get(ctx, vmiKey, &vmi); err != nil {
			return false
		}
		vmi.Status.Phase = v1alpha1.Running
		meta.SetStatusCondition(&vmi.Status.Conditions, metav1.Condition{Type: v1alpha1.VirtualMachineInstanceReady, Status: metav1.ConditionTrue, Reason: "GuestRunning"})
		return c.Status().Update(ctx, &vmi) == nil
	})
	eventually(t, 30*time.Second, "the VM to show Running and ready", func() bool {
		var got v1alpha1.VirtualMachine
		return c.Get(ctx, client.ObjectKeyFromObject(vm), &got) == nil &&
			got.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && got.Status.Ready && got.Status.Created
	})

	checkMetricsAuth(t, metrics)
	checkImagePullStatus(t)

	// Deleting the VM removes the pod first, then the VMI, then the VM.
	if err := c.Delete(ctx, vm); err != nil {
		t.Fatal(err)
	}
	var podGone, vmiGone, vmGone time.Time
	eventually(t, 60*time.Second, "the VM, its VMI and its pod to go", func() bool {
		now := time.Now()
		// Playing the kubelet: once the launcher pod is terminating, its process has exited.
		var p corev1.Pod
		if c.Get(ctx, client.ObjectKeyFromObject(&pod), &p) == nil && p.DeletionTimestamp != nil {
			_ = c.Delete(ctx, &p, client.GracePeriodSeconds(0))
		}
		if podGone.IsZero() && apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(&pod), &corev1.Pod{})) {
			podGone = now
		}
		if vmiGone.IsZero() && apierrors.IsNotFound(c.Get(ctx, vmiKey, &v1alpha1.VirtualMachineInstance{})) {
			vmiGone = now
		}
		if vmGone.IsZero() && apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(vm), &v1alpha1.VirtualMachine{})) {
			vmGone = now
		}
		return !podGone.IsZero() && !vmiGone.IsZero() && !vmGone.IsZero()
	})
	if vmiGone.Before(podGone) || vmGone.Before(vmiGone) {
		t.Fatalf("deletion out of order: pod %s, VMI %s, VM %s", podGone.Format(time.StampMilli), vmiGone.Format(time.StampMilli), vmGone.Format(time.StampMilli))
	}
}

// checkImagePullStatus: a VM whose containerDisk image cannot be pulled shows ErrImagePull, then
// ImagePullBackOff, as its STATUS, from the launcher pod's container status as a kubelet writes it
// (for an image volume's failed pull too); its VMI's Synchronized condition names the volume. Once
// the kubelet pulls the image, the VM is Starting again and the condition is gone.
func checkImagePullStatus(t *testing.T) {
	ctx := context.Background()
	c := cp.Client
	const image = "registry.example/qvirt/missing:1"
	rs := v1alpha1.RunStrategyAlways
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: "demo"},
		Spec: v1alpha1.VirtualMachineSpec{RunStrategy: &rs, Template: v1alpha1.VirtualMachineInstanceTemplateSpec{
			Spec: v1alpha1.VirtualMachineInstanceSpec{
				Domain: v1alpha1.DomainSpec{
					Memory:  &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("128Mi"))},
					Devices: v1alpha1.Devices{Disks: []v1alpha1.Disk{{Name: "rootdisk", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}},
				},
				Volumes: []v1alpha1.Volume{{Name: "rootdisk", VolumeSource: v1alpha1.VolumeSource{
					ContainerDisk: &v1alpha1.ContainerDiskSource{Image: image}}}},
			},
		}},
	}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	eventually(t, 30*time.Second, "the broken VM's launcher pod", func() bool {
		var pods corev1.PodList
		_ = c.List(ctx, &pods, client.InNamespace("demo"), client.MatchingLabels{v1alpha1.VMINameLabel: "broken"})
		if len(pods.Items) != 1 {
			return false
		}
		pod = pods.Items[0]
		return true
	})
	if err := c.SubResource("binding").Create(ctx, &pod, &corev1.Binding{Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}); err != nil {
		t.Fatal(err)
	}
	// Playing the kubelet: the compute container waits for the image volume's image.
	kubelet := func(phase corev1.PodPhase, state corev1.ContainerState) {
		t.Helper()
		eventually(t, 10*time.Second, "the pod status to be written", func() bool {
			if err := c.Get(ctx, client.ObjectKeyFromObject(&pod), &pod); err != nil {
				return false
			}
			pod.Status.Phase = phase
			pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "compute", Image: pod.Spec.Containers[0].Image, State: state}}
			return c.Status().Update(ctx, &pod) == nil
		})
	}
	waiting := func(reason, msg string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	}
	vmStatus := func(want v1alpha1.PrintableStatus, cond func(*metav1.Condition) bool) {
		t.Helper()
		var got v1alpha1.VirtualMachine
		var vmi v1alpha1.VirtualMachineInstance
		eventually(t, 30*time.Second, "the VM to show "+string(want), func() bool {
			if c.Get(ctx, client.ObjectKeyFromObject(vm), &got) != nil || c.Get(ctx, client.ObjectKeyFromObject(vm), &vmi) != nil {
				return false
			}
			return got.Status.PrintableStatus == want && cond(meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized))
		})
	}
	names := func(reason, text string) func(*metav1.Condition) bool {
		return func(s *metav1.Condition) bool {
			return s != nil && s.Status == metav1.ConditionFalse && s.Reason == reason &&
				strings.Contains(s.Message, "spec.volumes[rootdisk].containerDisk.image") && strings.Contains(s.Message, text)
		}
	}
	kubelet(corev1.PodPending, waiting("ErrImagePull", `failed to pull and unpack image "`+image+`": not found`))
	vmStatus(v1alpha1.PrintableStatusErrImagePull, names(v1alpha1.ReasonErrImagePull, "not found"))
	kubelet(corev1.PodPending, waiting("ImagePullBackOff", `Back-off pulling image "`+image+`": ErrImagePull: not found`))
	vmStatus(v1alpha1.PrintableStatusImagePullBackOff, names(v1alpha1.ReasonImagePullBackOff, "Back-off pulling image"))
	kubelet(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}})
	vmStatus(v1alpha1.PrintableStatusStarting, func(s *metav1.Condition) bool { return s == nil })
}
