package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/local/install"
	"github.com/qvirt/qvirt/local/kubenode"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestLocalClusterOnRealNodes brings a one-node local cluster up as `qvirtctl local up --runtime
// containerd --emulation` does: a real kubelet node (containerd, runc) joins the local control
// plane, and qvirt is installed on it as on any cluster, from config/default with the images local
// up builds and pushes to the local registry. Each of qvirt's components runs as a pod that
// containerd started from the pushed image; the test guest starts in a launcher pod on the node
// and its page answers at the pod's address; Down powers it off through its launcher pod, and
// leaves no process of it, no link and no kube-proxy table.
func TestLocalClusterOnRealNodes(t *testing.T) {
	// The test's own client logs nothing worth showing.
	ctrllog.SetLogger(logr.Discard())
	testutil.LockHostNetwork(t)
	tools, err := envtest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	nodeBin, err := kubenode.BuildBinaries(envtest.RepoRoot())
	if err != nil {
		t.Fatal(err)
	}
	// Short: containerd's sockets live under it.
	dir, err := os.MkdirTemp("", "qvc-")
	if err != nil {
		t.Fatal(err)
	}
	netnsBefore := testutil.HostNetNSes(t)
	t.Cleanup(func() {
		// The nodes' pod network namespaces stay under the state directory too.
		if left := slices.DeleteFunc(testutil.HostNetNSes(t), func(n string) bool { return slices.Contains(netnsBefore, n) }); len(left) > 0 {
			t.Errorf("Down left %d network namespace files in the host's %s: %q", len(left), testutil.HostNetNSDir, left)
		}
		if t.Failed() {
			return
		}
		// Down must leave nothing mounted under the state directory: a leftover mount point
		// makes its removal fail.
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove the state directory after Down: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Huge pages for the real-time guest, before the kubelet reads the node's capacity.
	testutil.ReserveHugepages(t, 128)
	started := time.Now()
	opts := upOptions(t, dir, tools)
	opts.Runtime, opts.NodeBin = RuntimeContainerd, nodeBin
	c, err := Up(ctx, opts)
	if err != nil {
		t.Fatalf("%v (logs in %s)", err, filepath.Join(dir, "logs"))
	}
	downed := false
	t.Cleanup(func() {
		if !downed {
			c.Down()
		}
	})
	t.Logf("cluster up with qvirt installed in %.1fs", time.Since(started).Seconds())

	cl, err := scheme.NewClient(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	describe := func() string {
		out, _ := exec.Command(filepath.Join(tools, "kubectl"), "--kubeconfig", c.Kubeconfig, "get", "pods", "-A", "-o", "wide").CombinedOutput()
		return string(out)
	}

	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.InNamespace(install.Namespace)); err != nil {
		t.Fatal(err)
	}
	apps := map[string]int{}
	for _, p := range pods.Items {
		apps[p.Labels["qvirt.io/app"]]++
		for _, s := range p.Status.ContainerStatuses {
			if !strings.HasPrefix(s.ContainerID, "containerd://") || !strings.HasPrefix(s.ImageID, c.Registry+"/qvirt/") || !s.Ready {
				t.Errorf("pod %s container %s: id %q image %q ready %v; want containerd running an image from %s", p.Name, s.Name, s.ContainerID, s.ImageID, s.Ready, c.Registry)
			}
		}
	}
	if apps["qvirt-controller"] == 0 || apps["qvirt-api"] == 0 || apps["qvirt-handler"] != 1 {
		t.Fatalf("qvirt's pods by component %v, want controllers, API servers and one node agent:\n%s", apps, describe())
	}

	// The guest is KubeVirt's real-time guest: it has a dedicated CPU (the node agent labels the
	// node from its kubelet's static CPU manager, the kubelet gives the Guaranteed launcher
	// container a CPU of its own, and the launcher pins the vCPU there), the guest NUMA mapping on
	// huge pages, and a real-time vCPU, which the node agent makes SCHED_FIFO.
	vmi := guestVMI(t, c)
	vmi.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 1, Threads: 1, DedicatedCPUPlacement: true,
		NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}, Realtime: &v1alpha1.Realtime{}}
	vmi.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
	// And a secondary network, which the real node's Multus (containerd's CNI) attaches.
	sec := createSecondaryNet(t, ctx, cl, dir, "secondary")
	addSecondary(vmi, "sec", sec)
	created := time.Now()
	if err := cl.Create(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.VirtualMachineInstance
	testutil.Eventually(t, 3*time.Minute, "VMI demo Running with an address", func() bool {
		_ = cl.Get(ctx, client.ObjectKeyFromObject(vmi), &got)
		return got.Status.Phase == v1alpha1.Running && len(got.Status.Interfaces) == 2 && got.Status.Interfaces[0].IP != ""
	}, func() string { return fmt.Sprintf("status %+v\n%s", got.Status, describe()) })
	t.Logf("VMI created -> Running in %.2fs on %s", time.Since(created).Seconds(), got.Status.NodeName)
	if got.Status.NodeName != NodeName(1) {
		t.Errorf("VMI runs on %q, want the real node %s", got.Status.NodeName, NodeName(1))
	}
	if body := testutil.HTTPBody(t, "http://"+got.Status.Interfaces[0].IP+"/", time.Minute); strings.TrimSpace(body) != "testguest" {
		t.Errorf("the guest's page: %q, want testguest", body)
	}
	checkDedicatedCPU(t, ctx, cl, dir, &got)
	secIP, err := secondaryIP(t, ctx, cl, string(got.UID), "sec", sec)
	if err != nil {
		t.Fatalf("%v\n%s", err, describe())
	}
	if body := testutil.HTTPBody(t, "http://"+secIP+"/", time.Minute); strings.TrimSpace(body) != "testguest" {
		t.Errorf("the guest's page on its secondary address %s: %q, want testguest", secIP, body)
	}

	// The passt binding on a real node: the launcher image's passt, run by the launcher in its
	// container (no seccomp filter, its own user namespace), binds the pod's port 80 (the pod's
	// sysctl, which the kubelet applies) for the guest, which has the pod's address.
	pvmi := guestVMI(t, c)
	pvmi.Name = "passt"
	pvmi.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default",
		Binding: &v1alpha1.PluginBinding{Name: v1alpha1.PasstBinding}, Ports: []v1alpha1.Port{{Port: 80}}}}
	// The binding is off by default: the cluster enables it, and admission lets the instance in
	// once qvirt-controller has read the change.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: config.ConfigMapName, Namespace: install.Namespace}}
	if err := cl.Patch(ctx, cm, client.RawPatch(types.MergePatchType, []byte(`{"data":{"enablePasstBinding":"true"}}`))); err != nil {
		t.Fatal(err)
	}
	var createErr error
	testutil.Eventually(t, 30*time.Second, "VMI passt admitted", func() bool {
		createErr = cl.Create(ctx, pvmi.DeepCopy())
		return createErr == nil
	}, func() string { return fmt.Sprint(createErr) })
	var pgot v1alpha1.VirtualMachineInstance
	testutil.Eventually(t, 3*time.Minute, "VMI passt Running with an address", func() bool {
		_ = cl.Get(ctx, client.ObjectKeyFromObject(pvmi), &pgot)
		return pgot.Status.Phase == v1alpha1.Running && len(pgot.Status.Interfaces) == 1 && pgot.Status.Interfaces[0].IP != ""
	}, func() string { return fmt.Sprintf("status %+v\n%s", pgot.Status, describe()) })
	if body := testutil.HTTPBody(t, "http://"+pgot.Status.Interfaces[0].IP+"/", time.Minute); strings.TrimSpace(body) != "testguest" {
		t.Errorf("the passt guest's page at the pod's address: %q, want testguest", body)
	}

	// Down with the guest running: it is powered off through its launcher pod (SIGTERM, ACPI
	// shutdown) before the node goes. A launcher that did not power the guest off would be killed
	// at the end of its pod's grace period: the pod must end well before.
	var launchers corev1.PodList
	if err := cl.List(ctx, &launchers, client.MatchingLabels{v1alpha1.VMINameLabel: vmi.Name}); err != nil || len(launchers.Items) != 1 ||
		launchers.Items[0].Spec.TerminationGracePeriodSeconds == nil {
		t.Fatalf("the VMI's launcher pods: %v %+v", err, launchers.Items)
	}
	grace := time.Duration(*launchers.Items[0].Spec.TerminationGracePeriodSeconds) * time.Second
	var down strings.Builder
	c.opts.Progress = io.MultiWriter(progress{t}, &down)
	c.Down()
	downed = true
	var n int
	var took float64
	_, report, _ := strings.Cut(down.String(), "local down: ")
	if _, err := fmt.Sscanf(report, "%d guests on the real nodes powered off (their launcher pods ended) in %fs", &n, &took); err != nil || n != 2 {
		t.Errorf("Down did not report the guest powered off (%v):\n%s", err, down.String())
	} else if time.Duration(took*float64(time.Second)) > grace/2 {
		t.Errorf("the launcher pod took %.1fs of its %s grace period to end: the guest was not powered off in time", took, grace)
	}
	if ips := sec.reservedIPs(); len(ips) != 0 {
		t.Errorf("the secondary network still reserves %v after Down: Multus's DEL did not release it", ips)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if cmdline, err := os.ReadFile(p); err == nil && (strings.Contains(string(cmdline), string(got.UID)) || strings.Contains(string(cmdline), string(pgot.UID))) {
			t.Errorf("process %s of VMI demo left after Down: %s", filepath.Base(filepath.Dir(p)), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	out, _ := exec.Command("ip", "-o", "link", "show").Output()
	for _, l := range []string{apiBridge, "qvirt-k1"} {
		if strings.Contains(string(out), l+":") || strings.Contains(string(out), l+"@") {
			t.Errorf("link %s left after Down", l)
		}
	}
	if out, err := exec.Command("nft", "list", "table", "ip", "kube-proxy").CombinedOutput(); err == nil {
		t.Errorf("kube-proxy's table left after Down:\n%s", testutil.Tail(string(out), 500))
	}
}

// checkDedicatedCPU checks vmi's dedicated CPU on the real node: the node is labelled
// cpumanager=true, the launcher pod is Guaranteed, its compute container has the CPU the kubelet's
// CPU manager recorded for it (in its checkpoint under the state directory dir), outside the
// shared pool, and QEMU's vCPU thread runs on that CPU alone, real-time, with a guest NUMA node on
// huge pages.
func checkDedicatedCPU(t *testing.T, ctx context.Context, cl client.Client, dir string, vmi *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	var node corev1.Node
	if err := cl.Get(ctx, client.ObjectKey{Name: vmi.Status.NodeName}, &node); err != nil {
		t.Fatal(err)
	}
	if node.Labels[v1alpha1.NodeCPUManagerLabel] != "true" {
		t.Errorf("node %s labels %v annotations %v, want %s=true", node.Name, node.Labels, node.Annotations, v1alpha1.NodeCPUManagerLabel)
	}
	var pods corev1.PodList
	if err := cl.List(ctx, &pods, client.MatchingLabels{v1alpha1.VMINameLabel: vmi.Name}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("the VMI's launcher pods: %v %d", err, len(pods.Items))
	}
	pod := pods.Items[0]
	if pod.Status.QOSClass != corev1.PodQOSGuaranteed {
		t.Errorf("launcher pod QoS %s, want Guaranteed", pod.Status.QOSClass)
	}
	var state string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == "cpu_manager_state" {
			state = p
			return filepath.SkipAll
		}
		return nil
	})
	data, err := os.ReadFile(state)
	if err != nil {
		t.Fatalf("the kubelet's CPU manager state: %v", err)
	}
	var cp struct {
		DefaultCPUSet string                       `json:"defaultCpuSet"`
		Entries       map[string]map[string]string `json:"entries"`
	}
	if err := json.Unmarshal(data, &cp); err != nil {
		t.Fatal(err)
	}
	exclusive := cp.Entries[string(pod.UID)]["compute"]
	if exclusive == "" || strings.Contains(exclusive, ",") || strings.Contains(exclusive, "-") {
		t.Fatalf("the CPU manager gave the compute container %q (state %s), want one CPU of its own", exclusive, data)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var vcpu string
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(cmdline), "qemu-system") || !strings.Contains(string(cmdline), string(vmi.UID)) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		threads, _ := testutil.Threads(pid)
		for _, th := range threads {
			if th.Name != "CPU 0/TCG" {
				continue
			}
			vcpu = th.CPUs
			checkRealtime(t, ctx, cl, vmi, pid, th.TID)
		}
		if cmdline := string(cmdline); !strings.Contains(cmdline, "node,nodeid=0,cpus=0-0,memdev=") || !strings.Contains(cmdline, "hugetlb=on") {
			t.Errorf("QEMU's command line has no guest NUMA node on huge pages: %q", strings.ReplaceAll(cmdline, "\x00", " "))
		}
	}
	if vcpu != exclusive {
		t.Errorf("the guest's vCPU thread runs on CPUs %q, want the container's own CPU %s (shared pool %s)", vcpu, exclusive, cp.DefaultCPUSet)
	}
	t.Logf("dedicated CPU: the vCPU runs on CPU %s, the shared pool is %s", vcpu, cp.DefaultCPUSet)
}

// checkRealtime checks the real-time vCPU's thread tid of QEMU pid on the real node. Where the
// kernel schedules real-time threads by cgroup (CONFIG_RT_GROUP_SCHED: cgroup v1's
// cpu.rt_runtime_us, as on this machine), the kubelet gives the pod's cgroup no real-time budget,
// so no thread of it can be made real-time: the node agent says so in an Event naming the
// pod's cgroup, and the thread stays as it was. Elsewhere the thread runs SCHED_FIFO (policy 1)
// at priority 1 (fields 41 and 40 of its stat).
func checkRealtime(t *testing.T, ctx context.Context, cl client.Client, vmi *v1alpha1.VirtualMachineInstance, pid int, tid string) {
	t.Helper()
	policy := func() string {
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, tid))
		_, after, _ := strings.Cut(string(stat), ") ")
		if f := strings.Fields(after); len(f) >= 39 {
			return "policy " + f[38] + " priority " + f[37]
		}
		return "no stat"
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.rt_runtime_us"); err != nil {
		testutil.Eventually(t, time.Minute, "the real-time vCPU's thread SCHED_FIFO", func() bool { return policy() == "policy 1 priority 1" },
			func() string { return policy() })
		return
	}
	var msg string
	testutil.Eventually(t, time.Minute, "Event RealtimeFailed saying the pod's cgroup has no real-time budget", func() bool {
		var events corev1.EventList
		_ = cl.List(ctx, &events, client.InNamespace(vmi.Namespace))
		for _, e := range events.Items {
			if e.InvolvedObject.UID == vmi.UID && e.Reason == vmisync.EventRealtimeFailed {
				msg = e.Message
				return strings.Contains(msg, "CONFIG_RT_GROUP_SCHED") && strings.Contains(msg, "cpu.rt_runtime_us") && strings.Contains(msg, "operation not permitted")
			}
		}
		return false
	}, func() string { return msg })
	if got := policy(); got != "policy 0 priority 0" {
		t.Errorf("the vCPU's thread: %s, want it left SCHED_OTHER", got)
	}
	t.Logf("real-time vCPU on this kernel: %s", msg)
}
