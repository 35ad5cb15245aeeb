package kubenode_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	vmictrl "github.com/qvirt/qvirt/controllers/vmi"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/local/install"
	"github.com/qvirt/qvirt/local/kubenode"
	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/local/supervise"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/podnet"
	"github.com/qvirt/qvirt/test/testutil"
)

// realNodes is the one cluster the tests of this package share: local mode's control plane, the
// local registry, and two real nodes (containerd, runc, kubelet) on this one host joined to it.
type realNodes struct {
	cs kubernetes.Interface
	// kubectl is the tools' kubectl; kubeconfig the cluster admin's.
	kubectlBin, kubeconfig string
	names                  []string
	// dirs are the nodes' state directories, by name.
	dirs map[string]string
	// state is the cluster's state directory, which outlives every subtest.
	state    string
	registry string
	// ready is how long the nodes took from their kubelets' start to Ready.
	ready time.Duration
}

// TestRealNode brings up the control plane and two real kubelet nodes, as `qvirtctl local up
// --runtime containerd --nodes 2` does, and runs an ordinary pod on each: two nodes coexist on
// one host (directories, ports, cgroup roots, bridges and pod ranges of their own). It needs root and the binaries
// hack/build-node.sh builds; it fails (never skips) when either is missing.
func TestRealNode(t *testing.T) {
	n := startRealNodes(t)
	t.Logf("nodes %v Ready %.1fs after their kubelets started", n.names, n.ready.Seconds())

	for _, node := range n.names {
		t.Run("a pod on "+node+" runs to completion under containerd and runc and its log reaches kubectl logs", func(t *testing.T) {
			checkPodRuns(t, n, node)
		})
	}
	t.Run("a pod reaches the API server at the kubernetes Service and finds its own node's pods at /var/lib/kubelet/pods", func(t *testing.T) {
		for _, node := range n.names {
			checkClusterView(t, n, node)
		}
	})
	var in *install.Installed
	t.Run("config/default installs qvirt on the real nodes from the images make images builds", func(t *testing.T) {
		in = installQvirt(t, n, time.Unix(0, 0))
	})
	t.Run("admission holds while the leading controller pod is deleted during 30 creates", func(t *testing.T) {
		if in == nil {
			t.Fatal("qvirt is not installed (see the test above)")
		}
		checkAdmissionFailover(t, n)
	})
	t.Run("the demo VM runs, answers, keeps kubectl delete -k from uninstalling, outlives an upgrade, migrates to the new build on the other real node, stops and leaves nothing behind", func(t *testing.T) {
		if in == nil {
			t.Fatal("qvirt is not installed (see the test above)")
		}
		checkDemoVM(t, n, in, func() *install.Installed { in = installQvirt(t, n, time.Unix(86400, 0)); return in })
	})
	t.Run("kubectl delete -k removes qvirt once no VM is left, leaving nothing on the nodes", func(t *testing.T) {
		if in == nil {
			t.Fatal("qvirt is not installed (see the test above)")
		}
		n.checkUninstall(t, in)
	})
	t.Run("a migration target's containerDisk is pinned to the source's digest, caught when its tag moved, or named as unpinned", func(t *testing.T) {
		checkImageVolumeDigests(t, n)
	})
}

func startRealNodes(t *testing.T) *realNodes {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("real kubelet nodes need root (containerd, runc, cgroups, mounts)")
	}
	tools, err := envtest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	bin, err := kubenode.BuildBinaries(envtest.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubelet and containerd ready in %s (%.1fs; cold builds take minutes)", bin, time.Since(started).Seconds())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	cniBin, err := provider.BuildCNIPlugins(ctx, filepath.Join(cache, "qvirt", "cni"))
	if err != nil {
		t.Fatal(err)
	}

	subnet := randByte(t) &^ 1
	pods := podnet.NewNetwork(t)
	addr := net.IP(pods.Gateway.AsSlice())
	// Short: containerd's sockets live under it.
	dir, err := os.MkdirTemp("", "qvkn-")
	if err != nil {
		t.Fatal(err)
	}
	sup, err := supervise.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := cluster.StartControlPlane(ctx, sup, cluster.ControlPlaneOptions{Dir: dir, Tools: tools, Address: addr,
		APIServerPort: testutil.FreePortPair(t), EtcdPort: testutil.FreePortPair(t), ControllerManagerPort: testutil.FreePortPair(t), SchedulerPort: testutil.FreePortPair(t)})
	if err != nil {
		sup.Stop(10 * time.Second)
		t.Fatal(err)
	}
	regCtx, stopRegistry := context.WithCancel(context.Background())
	srv, err := registry.Listen(registry.Options{Addr: net.JoinHostPort(addr.String(), "0")})
	if err != nil {
		t.Fatal(err)
	}
	regDone := make(chan error, 1)
	go func() { regDone <- srv.Start(regCtx) }()
	pause, err := registry.PushPause(ctx, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	proxyPort := testutil.FreePortPair(t)
	proxy, err := kubenode.NewProxy(kubenode.ProxyOptions{Dir: filepath.Join(dir, "kube-proxy"), Bin: bin, PKIDir: filepath.Join(dir, "pki"),
		Server: cp.Server, NodeName: "qvirt-real-1", NodeIP: addr, ClusterCIDR: fmt.Sprintf("10.246.%d.0/23", subnet),
		HealthzPort: proxyPort, MetricsPort: proxyPort + 1})
	if err != nil {
		t.Fatal(err)
	}

	var nodes []kubenode.Options
	for i := range 2 {
		nodes = append(nodes, kubenode.Options{Name: fmt.Sprintf("qvirt-real-%d", i+1), Dir: filepath.Join(dir, fmt.Sprint("n", i+1)),
			Bin: bin, CNIBin: cniBin, PKIDir: filepath.Join(dir, "pki"), Server: cp.Server, NodeIP: addr, KubeletPort: testutil.FreePortPair(t),
			PodCIDR: fmt.Sprintf("10.246.%d.0/24", subnet+i), Bridge: "qvkn" + podnet.RandHex(t, 3), Registry: srv.Addr(), SandboxImage: pause})
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	netnsBefore := testutil.HostNetNSes(t)
	n := &realNodes{cs: cs, registry: srv.Addr(), kubectlBin: filepath.Join(tools, "kubectl"), kubeconfig: cp.Kubeconfig, dirs: map[string]string{}, state: dir}
	t.Cleanup(func() {
		// qvirt's VMs (a failed test leaves them running, and they would recreate their pods),
		// then the pods, while the kubelet can still stop them; then the processes; then what
		// they left on the host.
		_, _ = n.kubectl("delete", "vms,vmis", "--all", "-n", "default", "--ignore-not-found", "--wait=false")
		_ = cs.CoreV1().Pods("default").DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
		waitNoPods(t, cs)
		sup.Stop(30 * time.Second)
		stopRegistry()
		<-regDone
		for _, opts := range nodes {
			if err := kubenode.Cleanup(opts); err != nil {
				t.Errorf("clean up node %s: %v", opts.Name, err)
			}
		}
		if err := kubenode.CleanupProxy(); err != nil {
			t.Errorf("clean up kube-proxy: %v", err)
		}
		if left := slices.DeleteFunc(testutil.HostNetNSes(t), func(n string) bool { return slices.Contains(netnsBefore, n) }); len(left) > 0 {
			t.Errorf("the nodes left %d network namespace files in the host's %s: %q", len(left), testutil.HostNetNSDir, left)
		}
		if t.Failed() {
			t.Logf("state and logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	kubeletStart := time.Now()
	for _, opts := range nodes {
		node, err := kubenode.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range node.Components() {
			if err := sup.Start(ctx, c); err != nil {
				t.Fatalf("%v (logs in %s)", err, filepath.Join(dir, "logs"))
			}
		}
		n.names = append(n.names, opts.Name)
		n.dirs[opts.Name] = opts.Dir
	}
	// After the kubelets: kube-proxy waits for its Node to be registered.
	if err := sup.Start(ctx, proxy); err != nil {
		t.Fatalf("%v (logs in %s)", err, filepath.Join(dir, "logs"))
	}
	for _, name := range n.names {
		if err := waitNodeReady(ctx, cs, name); err != nil {
			t.Fatalf("%v (logs in %s)", err, filepath.Join(dir, "logs"))
		}
	}
	n.ready = time.Since(kubeletStart)
	return n
}

func waitNodeReady(ctx context.Context, cs kubernetes.Interface, name string) error {
	last := "not registered"
	for ctx.Err() == nil {
		node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			last = "no Ready condition"
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return nil
					}
					last = fmt.Sprintf("Ready=%s: %s: %s", c.Status, c.Reason, c.Message)
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("node %s did not become Ready: %s", name, last)
}

func waitNoPods(t *testing.T, cs kubernetes.Interface) {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		list, err := cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{})
		if err == nil && len(list.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("pods of the test still exist a minute after their deletion")
}

// checkPodRuns pushes a busybox image to the local registry and runs it as a plain pod: the
// scheduler places it on the real node, containerd pulls it, runc runs it, and its line is
// what `kubectl logs` returns through the API server from the kubelet.
func checkPodRuns(t *testing.T, n *realNodes, node string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	line := "hello from " + node
	image := n.registry + "/qvirt/echo:" + node
	if err := registry.PushBusybox(ctx, image, []string{registry.BusyboxPath, "echo", line}); err != nil {
		t.Fatal(err)
	}
	got, out := runToCompletion(ctx, t, n, restrictedPod("echo-"+node, node, image, 65534))
	cs := got.Status.ContainerStatuses
	if len(cs) != 1 || !strings.HasPrefix(cs[0].ContainerID, "containerd://") || cs[0].ImageID == "" {
		t.Errorf("container status %+v: want one container run by containerd, with its image's digest", cs)
	}
	if strings.TrimSpace(out) != line {
		t.Errorf("pod log %q, want %q", out, line)
	}
}

// checkClusterView runs a pod on node that does what in-cluster components (qvirt-controller,
// qvirt-handler) need of a real node: reach the API server at the `kubernetes` Service's cluster
// IP (kube-proxy), and find the node's own kubelet pods directory at /var/lib/kubelet/pods (a
// hostPath), with the pod's own directory in it and not the other node's pods.
func checkClusterView(t *testing.T, n *realNodes, node string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	image := n.registry + "/qvirt/sh:v1"
	// An HTTP request to the API server's TLS port: Go's TLS server answers it in plain text.
	script := `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "$KUBERNETES_SERVICE_HOST" "$KUBERNETES_SERVICE_PORT"; echo; ls /var/lib/kubelet/pods`
	if err := registry.PushBusybox(ctx, image, []string{registry.BusyboxPath, "sh", "-c", script}); err != nil {
		t.Fatal(err)
	}
	pod := restrictedPod("view-"+node, node, image, 0)
	pod.Spec.SecurityContext.RunAsNonRoot = nil
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "pods", MountPath: "/var/lib/kubelet/pods", ReadOnly: true}}
	pod.Spec.Volumes = []corev1.Volume{{Name: "pods", VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/kubelet/pods", Type: ptr.To(corev1.HostPathDirectory)}}}}
	got, out := runToCompletion(ctx, t, n, pod)
	if !strings.Contains(out, "Client sent an HTTP request to an HTTPS server") {
		t.Errorf("pod on %s got no answer from the API server at the kubernetes Service; its output:\n%s", node, out)
	}
	if !strings.Contains(out, string(got.UID)) {
		t.Errorf("pod on %s did not find its own directory %s in /var/lib/kubelet/pods; its output:\n%s", node, got.UID, out)
	}
	others, err := n.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range others.Items {
		if p.Spec.NodeName != node && strings.Contains(out, string(p.UID)) {
			t.Errorf("pod on %s sees pod %s of node %s in /var/lib/kubelet/pods", node, p.Name, p.Spec.NodeName)
		}
	}
}

// restrictedPod runs image on node as user uid, as the restricted Pod Security level asks:
// seccomp's RuntimeDefault (runc loads containerd's default profile), no root, no privilege
// escalation, no capabilities. The scheduler places it (no nodeName): the selector only says which
// real node.
func restrictedPod(name, node, image string, uid int64) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector: map[string]string{"kubernetes.io/hostname": node},
			SecurityContext: &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(uid)},
			Containers: []corev1.Container{{Name: "echo", Image: image, SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}}}}
}

// runToCompletion creates pod, waits until it Succeeded on the node it asked for, and returns its
// last status and its log as `kubectl logs` reads it.
func runToCompletion(ctx context.Context, t *testing.T, n *realNodes, pod *corev1.Pod) (*corev1.Pod, string) {
	t.Helper()
	// The default ServiceAccount appears once kube-controller-manager has made it.
	var err error
	for {
		if _, err = n.cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err == nil || ctx.Err() != nil {
			break
		}
		if !apierrors.IsForbidden(err) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	var got *corev1.Pod
	for ctx.Err() == nil {
		if got, err = n.cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase == corev1.PodSucceeded || got.Status.Phase == corev1.PodFailed {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s phase %q, want Succeeded; status: %+v", pod.Name, got.Status.Phase, got.Status)
	}
	t.Logf("pod %s Succeeded %.1fs after its creation", pod.Name, time.Since(created).Seconds())
	if node := pod.Spec.NodeSelector["kubernetes.io/hostname"]; got.Spec.NodeName != node {
		t.Errorf("pod %s ran on %q, want the real node %q", pod.Name, got.Spec.NodeName, node)
	}
	logs, err := n.cs.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{}).Stream(ctx)
	if err != nil {
		t.Fatalf("kubectl logs %s: %v", pod.Name, err)
	}
	defer logs.Close()
	out, err := io.ReadAll(logs)
	if err != nil {
		t.Fatal(err)
	}
	return got, string(out)
}

// checkImageVolumeDigests runs, as qvirt's pod renderer lays them out, a launcher pod's
// containerDisk image volume on the first real node and a migration target's on the second, with
// the disk's tag moved in between. What the kubelet reports it pulled (ImageVolumeWithDigest) is
// recorded as the VMI reconciler does (vmi.RecordImages), the target is pinned as the migration
// reconciler does (vmi.PinImageVolumes), and the reconciler's check (vmi.ImageMismatches) must
// catch a target that got other bytes. When the kubelet reports nothing, as 1.37.2 does, the
// target stays on the tag and the migration warns that it is not pinned.
func checkImageVolumeDigests(t *testing.T, n *realNodes) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const disk, file = "root", "/disk/marker.img"
	tag := n.registry + "/qvirt/pinned-disk:v1"
	push := func(content string) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "marker.img")
		if err := os.WriteFile(f, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := registry.PushContainerDisk(ctx, tag, f, file); err != nil {
			t.Fatal(err)
		}
	}
	cat := n.registry + "/qvirt/cat:v1"
	mounted := podlayout.ContainerDiskMount(disk) + file
	if err := registry.PushBusybox(ctx, cat, []string{registry.BusyboxPath, "cat", mounted}); err != nil {
		t.Fatal(err)
	}
	launcher := func(name, node string) *corev1.Pod {
		// The disk's files belong to uid 107 (qemu), as the launcher runs.
		pod := restrictedPod(name, node, cat, 107)
		c := &pod.Spec.Containers[0]
		c.Name = podlayout.ComputeContainer
		c.VolumeMounts = []corev1.VolumeMount{{Name: "containerdisk-0", MountPath: podlayout.ContainerDiskMount(disk), ReadOnly: true}}
		pod.Spec.Volumes = []corev1.Volume{{Name: "containerdisk-0", VolumeSource: corev1.VolumeSource{
			Image: &corev1.ImageVolumeSource{Reference: tag, PullPolicy: corev1.PullIfNotPresent}}}}
		return pod
	}

	push("first")
	source, out := runToCompletion(ctx, t, n, launcher("source", n.names[0]))
	if out != "first" {
		t.Fatalf("source pod read %q from its containerDisk, want %q", out, "first")
	}
	var st v1alpha1.VirtualMachineInstanceStatus
	vmictrl.RecordImages(&st, source)
	recorded := ""
	if len(st.ContainerDiskStatus) == 1 {
		recorded = st.ContainerDiskStatus[0].ImageRef
	}

	push("moved")
	target := launcher("target", n.names[1])
	unpinned := vmictrl.PinImageVolumes(target, &st)
	target, out = runToCompletion(ctx, t, n, target)
	mismatches := vmictrl.ImageMismatches(target, &st)
	t.Logf("the kubelet reported %q for the source's disk; the target pulled %s and read %q; unpinned %q, mismatches %q",
		recorded, target.Spec.Volumes[0].Image.Reference, out, unpinned, mismatches)
	switch {
	case recorded == "":
		// Kubernetes 1.37.2 under containerd 2 reports nothing, even with the feature on: the
		// kubelet matches the runtime's mounts to volumes by a name the CRI does not carry. qvirt
		// cannot pin then: the target keeps the tag (the migration's ImagesNotPinned warning), and
		// it gets the moved tag's bytes.
		if fmt.Sprint(unpinned) != "[containerDisk root]" || len(mismatches) > 0 {
			t.Errorf("with no digest recorded: unpinned %q, mismatches %q; want the containerDisk unpinned and nothing to compare", unpinned, mismatches)
		}
		if out != "moved" {
			t.Errorf("target pulled the tag after it moved and read %q, want %q", out, "moved")
		}
	case len(unpinned) == 0:
		if out != "first" {
			t.Errorf("target pinned to %s read %q, want the source's %q", target.Spec.Volumes[0].Image.Reference, out, "first")
		}
	case len(mismatches) != 1:
		// An image ID (what containerd will report) cannot be pinned; the check must catch the move.
		t.Errorf("target pulled the moved tag and read %q; mismatches %q, want the containerDisk named", out, mismatches)
	}
}

// randByte is a random byte, for a pod range no local cluster uses (they use 10.244 and 10.245).
func randByte(t *testing.T) int {
	var b int
	fmt.Sscanf(podnet.RandHex(t, 1), "%x", &b)
	return b
}
