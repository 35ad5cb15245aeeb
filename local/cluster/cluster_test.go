package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/local/storage"
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	started := time.Now()
	opts := upOptions(t, dir, tools)
	opts.Bin = bin
	c, err := Up(ctx, opts)
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

	cl, err := scheme.NewClient(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// A virtual node has no CPU manager: its agent reads no kubelet checkpoint (not the host's) and
	// leaves the cpumanager label to the administrator, saying so.
	var node corev1.Node
	testutil.Eventually(t, time.Minute, "node "+NodeName(1)+"'s CPU manager reason", func() bool {
		_ = cl.Get(ctx, client.ObjectKey{Name: NodeName(1)}, &node)
		return node.Annotations[v1alpha1.NodeCPUManagerReasonAnnotation] != ""
	}, func() string { return fmt.Sprintf("annotations %v", node.Annotations) })
	if _, ok := node.Labels[v1alpha1.NodeCPUManagerLabel]; ok || !strings.Contains(node.Annotations[v1alpha1.NodeCPUManagerReasonAnnotation], "--cpu-manager-state is empty") {
		t.Errorf("virtual node %s: labels %v, CPU manager reason %q; want no %s label and the reason naming --cpu-manager-state", NodeName(1),
			node.Labels, node.Annotations[v1alpha1.NodeCPUManagerReasonAnnotation], v1alpha1.NodeCPUManagerLabel)
	}
	vmi := guestVMI(t, c)
	// A secondary network besides the pod network, through Multus: a bridge on the host.
	sec := createSecondaryNet(t, ctx, cl, dir, "secondary")
	addSecondary(vmi, "sec", sec)
	// Two claims of the default StorageClass, which local mode's provisioner binds: a filesystem
	// one (the guest's vda, disk.img in it) and a block one (vdb, a loop device).
	claims := []*corev1.PersistentVolumeClaim{newClaim("demo-fs", "64Mi", corev1.PersistentVolumeFilesystem),
		newClaim("demo-block", "16Mi", corev1.PersistentVolumeBlock)}
	for i, pvc := range claims {
		if err := cl.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		vol := "data" + strconv.Itoa(i)
		vmi.Spec.Domain.Devices.Disks = append(vmi.Spec.Domain.Devices.Disks, v1alpha1.Disk{Name: vol, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
		vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: vol, VolumeSource: v1alpha1.VolumeSource{
			PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}})
	}
	pvPaths := map[string]string{}
	for _, pvc := range claims {
		testutil.Eventually(t, time.Minute, "claim "+pvc.Name+" Bound by the provisioner", func() bool {
			_ = cl.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)
			return pvc.Status.Phase == corev1.ClaimBound
		}, func() string { return fmt.Sprintf("claim status %+v", pvc.Status) })
		var pv corev1.PersistentVolume
		if err := cl.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
			t.Fatal(err)
		}
		if pv.Spec.StorageClassName != storage.ClassName || pv.Spec.HostPath == nil || !strings.HasPrefix(pv.Spec.HostPath.Path, VolumesDir(dir)+"/") {
			t.Fatalf("claim %s bound to %+v: want a %s hostPath volume under %s", pvc.Name, pv.Spec, storage.ClassName, VolumesDir(dir))
		}
		pvPaths[pvc.Name] = pv.Spec.HostPath.Path
	}
	created := time.Now()
	if err := cl.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.VirtualMachineInstance
	testutil.Eventually(t, 90*time.Second, "VMI demo Running with an address", func() bool {
		_ = cl.Get(ctx, client.ObjectKeyFromObject(vmi), &got)
		return got.Status.Phase == v1alpha1.Running && len(got.Status.Interfaces) == 2 && got.Status.Interfaces[0].IP != ""
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
	// 64Mi less the 5.5% filesystem overhead is 60 MiB (122880 sectors); the block claim is its 16Mi.
	con.Run(t, `echo "SIZES-$(cat /sys/block/vda/size)-$(cat /sys/block/vdb/size)"; printf QVIRT-PVC-MARK > /dev/vda; sync; echo WROTE-$((1+1))`,
		"WROTE-2", time.Minute)
	if !strings.Contains(con.Text(), "SIZES-122880-32768") {
		t.Errorf("the guest's claim disks are not 60 MiB and 16 MiB:\n%s", testutil.Tail(con.Text(), 500))
	}
	img, err := os.ReadFile(filepath.Join(pvPaths["demo-fs"], "disk.img"))
	if err != nil || !strings.HasPrefix(string(img), "QVIRT-PVC-MARK") {
		t.Errorf("the filesystem claim's disk.img does not hold what the guest wrote: %v", err)
	}

	getGuest(t, "http://"+got.Status.Interfaces[0].IP+"/")
	// The secondary network: Multus gave the pod interface an address, which the bridge binding
	// moved to the guest's second NIC, where the host reaches it over the secondary bridge.
	secIP, err := secondaryIP(t, ctx, cl, string(got.UID), "sec", sec)
	if err != nil {
		t.Fatal(err)
	}
	con.Expect(t, 0, "QVIRT-IP eth1 "+secIP, time.Minute)
	getGuest(t, "http://"+secIP+"/")
	if ips := sec.reservedIPs(); len(ips) != 1 || ips[0] != secIP {
		t.Errorf("the secondary network's reservations = %v, want %s", ips, secIP)
	}

	if err := cl.Delete(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, time.Minute, "VMI demo gone", func() bool {
		err := cl.Get(ctx, client.ObjectKeyFromObject(vmi), &got)
		return client.IgnoreNotFound(err) == nil && err != nil
	})
	// Multus's DEL released the secondary address with the pod.
	testutil.Eventually(t, time.Minute, "the secondary address released", func() bool { return len(sec.reservedIPs()) == 0 },
		func() string { return fmt.Sprintf("reserved %v", sec.reservedIPs()) })
	if dev := loopBackedBy(pvPaths["demo-block"]); dev != "" {
		t.Errorf("%s is still attached to the block claim's file after its pod ended", dev)
	}
	for _, pvc := range claims {
		if err := cl.Delete(ctx, pvc); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, time.Minute, "the claims' volumes deleted by the provisioner", func() bool {
		entries, err := os.ReadDir(VolumesDir(dir))
		return err == nil && len(entries) == 0
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

// getGuest waits until the test guest's httpd answers at url.
func getGuest(t *testing.T, url string) {
	t.Helper()
	hc := http.Client{Timeout: 5 * time.Second}
	testutil.Eventually(t, time.Minute, "GET "+url, func() bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.TrimSpace(string(body)) == "testguest"
	})
}

// upOptions are a one-node test cluster's, as `qvirtctl local up --emulation` takes them, with
// the test guest and free ports.
func upOptions(t *testing.T, dir, tools string) Options {
	t.Helper()
	guest, err := testutil.GuestDir()
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return Options{Dir: dir, Nodes: 1, Emulation: true, Repo: "../..", Tools: tools,
		CNICache: filepath.Join(cache, "qvirt", "cni"), Progress: progress{t}, Log: testr.New(t), GuestDir: guest,
		Ports: Ports{APIServer: testutil.FreePortPair(t), Etcd: testutil.FreePortPair(t), ControllerManager: testutil.FreePortPair(t), Scheduler: testutil.FreePortPair(t),
			Webhook: testutil.FreePortPair(t), ControllerProbe: testutil.FreePortPair(t), Registry: testutil.FreePortPair(t), Streams: testutil.FreePortPair(t) - 1}}
}

// guestVMI is VMI default/demo: the test guest (test/guest/vmi.yaml), its image pulled by the
// launcher from c's registry, on the pod network with the masquerade binding.
func guestVMI(t *testing.T, c *Cluster) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	req, err := translate.LoadFile("../../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "default"}, Spec: req.Spec}
	kb := vmi.Spec.Domain.Firmware.KernelBoot.Container
	kb.Image, kb.KernelPath, kb.InitrdPath = c.Images.KernelBoot, registry.KernelPath, registry.InitrdPath
	vmi.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
	vmi.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	return vmi
}

func newClaim(name, size string, mode corev1.PersistentVolumeMode) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}}}
}

// loopBackedBy is the loop device attached to file, or "".
func loopBackedBy(file string) string {
	links, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range links {
		if b, err := os.ReadFile(l); err == nil && strings.TrimSpace(string(b)) == file {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(l)))
		}
	}
	return ""
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
