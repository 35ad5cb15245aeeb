package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// buildBinaries builds qvirt-controller, qvirt-handler, qvirt-launcher, qvirt-pull and qvirt-api into a directory.
func buildBinaries(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	for _, c := range []string{"qvirt-controller", "qvirt-handler", "qvirt-launcher", "qvirt-pull", "qvirt-pod-init", "qvirt-api"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(bin, c), "../../cmd/"+c).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c, err, out)
		}
	}
	return bin
}

type progress struct{ t *testing.T }

func (p progress) Write(b []byte) (int, error) {
	p.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestLocalCluster brings a one-node local cluster up as `qvirtctl local up --emulation` does, runs
// the test guest on it through the real qvirt-controller, virtual node and qvirt-handler, reaches
// its httpd at the pod's address, and takes it all down again without leftovers.
func TestLocalCluster(t *testing.T) {
	testutil.LockHostNetwork(t)
	tools, err := envtest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	bin := buildBinaries(t)
	dir, err := os.MkdirTemp("", "qvl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	guest, err := testutil.GuestDir()
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	started := time.Now()
	c, err := Up(ctx, Options{Dir: dir, Nodes: 1, Emulation: true, Repo: "../..", Tools: tools, Bin: bin,
		CNICache: filepath.Join(cache, "qvirt", "cni"), Progress: progress{t}, Log: testr.New(t), GuestDir: guest,
		Ports: Ports{APIServer: freePort(t), Etcd: freePort(t), ControllerManager: freePort(t), Scheduler: freePort(t),
			Webhook: freePort(t), ControllerProbe: freePort(t), Registry: freePort(t), Streams: freePort(t) - 1}})
	if err != nil {
		t.Fatal(err)
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			c.Down()
		}
	})
	t.Logf("cluster up in %.1fs", time.Since(started).Seconds())

	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(cfg, client.Options{Scheme: sch})
	if err != nil {
		t.Fatal(err)
	}
	req, err := translate.LoadFile("../../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}, Spec: req.Spec}
	// The demo guest image, pulled by the launcher from the local registry.
	kb := vmi.Spec.Domain.Firmware.KernelBoot.Container
	kb.Image, kb.KernelPath, kb.InitrdPath = c.Images.KernelBoot, registry.KernelPath, registry.InitrdPath
	vmi.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
	vmi.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	created := time.Now()
	if err := cl.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.VirtualMachineInstance
	testutil.Eventually(t, 90*time.Second, "VMI demo Running with an address", func() bool {
		_ = cl.Get(ctx, client.ObjectKeyFromObject(vmi), &got)
		return got.Status.Phase == v1alpha1.Running && len(got.Status.Interfaces) == 1 && got.Status.Interfaces[0].IP != ""
	}, func() string {
		var pods corev1.PodList
		_ = cl.List(ctx, &pods, client.InNamespace("default"))
		msg := fmt.Sprintf("status %+v\n", got.Status)
		for _, p := range pods.Items {
			msg += fmt.Sprintf("pod %s node %q phase %s containers %+v\n", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
		}
		for _, f := range []string{"qvirt-handler-" + NodeName(1), "qvirt-controller"} {
			data, _ := os.ReadFile(filepath.Join(dir, "logs", f+".log"))
			msg += f + ":\n" + testutil.Tail(string(data), 3000) + "\n"
		}
		logs, _ := filepath.Glob(filepath.Join(dir, "nodes", "*", "logs", "*"))
		for _, f := range logs {
			data, _ := os.ReadFile(f)
			msg += f + ":\n" + testutil.Tail(string(data), 2000) + "\n"
		}
		return msg
	})
	t.Logf("VMI created -> Running in %.2fs on %s", time.Since(created).Seconds(), got.Status.NodeName)
	if cached, _ := os.ReadDir(nodeImageCache(dir, 1)); len(cached) == 0 {
		t.Errorf("node %s's image cache %s is empty: the demo image was not pulled there", NodeName(1), nodeImageCache(dir, 1))
	}
	ref := kernelImageRef(t, ctx, cl, got.UID)
	if !strings.Contains(ref, "@sha256:") {
		t.Errorf("launcher pod status: kernelBoot image volume's imageRef = %q, want the image by digest", ref)
	}
	// The digest is pinned in the instance's status, where a migration target takes it from.
	testutil.Eventually(t, 30*time.Second, "VMI status.kernelBootStatus.imageRef "+ref, func() bool {
		_ = cl.Get(ctx, client.ObjectKeyFromObject(vmi), &got)
		return got.Status.KernelBootStatus != nil && got.Status.KernelBootStatus.ImageRef == ref
	}, func() string { return fmt.Sprintf("kernelBootStatus %+v", got.Status.KernelBootStatus) })
	ld, err := LauncherDir(dir, 1, &got)
	if err != nil {
		t.Fatal(err)
	}
	con := testutil.AttachConsole(t, ld.Serial())
	con.Run(t, "echo HELLO-$((6*7))", "HELLO-42", 2*time.Minute)

	hc := http.Client{Timeout: 5 * time.Second}
	url := "http://" + got.Status.Interfaces[0].IP + "/"
	testutil.Eventually(t, time.Minute, "GET "+url, func() bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.TrimSpace(string(body)) == "testguest"
	})

	if err := cl.Delete(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "VMI demo gone", func() bool {
		err := cl.Get(ctx, client.ObjectKeyFromObject(vmi), &got)
		return client.IgnoreNotFound(err) == nil && err != nil
	})
	c.Down()
	downed = true
	out, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, l := range []string{apiBridge, "qvirt-n1"} {
		if strings.Contains(string(out), l+":") || strings.Contains(string(out), l+"@") {
			t.Errorf("link %s left after Down", l)
		}
	}
}

// kernelImageRef is the digest the node reported for the kernelBoot image volume of the instance's
// launcher pod.
func kernelImageRef(t *testing.T, ctx context.Context, cl client.Client, uid types.UID) string {
	t.Helper()
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.MatchingLabels{v1alpha1.VMIUIDLabel: string(uid)}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			for _, m := range cs.VolumeMounts {
				if m.MountPath == podlayout.KernelBootDir && m.VolumeStatus != nil && m.VolumeStatus.Image != nil {
					return m.VolumeStatus.Image.ImageRef
				}
			}
		}
	}
	return ""
}
