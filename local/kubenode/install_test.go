package kubenode_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/local/install"
	"github.com/qvirt/qvirt/local/registry"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// installQvirt installs qvirt with local/install (make images, make push, kubectl apply -k of an
// overlay that sets only what README's install section tells an administrator to: the images'
// digests, and qvirt-config's launcherImage and useEmulation, as there is no KVM here) and waits
// for the rollout. epoch is the images' time stamps: another epoch is another build (other
// digests) of the same sources, which is what an upgrade applies. The overlay stays in the
// cluster's state directory: later subtests uninstall with it.
func installQvirt(t *testing.T, n *realNodes, epoch time.Time) *install.Installed {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	started := time.Now()
	in, err := install.Apply(ctx, install.Options{Repo: envtest.RepoRoot(), Registry: n.registry, Kubectl: n.kubectlBin, Kubeconfig: n.kubeconfig,
		Dir: filepath.Join(n.state, fmt.Sprint("install-", epoch.Unix())), Epoch: epoch, Config: map[string]string{"useEmulation": "true"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, n.describe(install.Namespace))
	}
	t.Logf("images built, pushed and rolled out in %.1fs", time.Since(started).Seconds())
	return in
}

// describe is what an administrator looks at when pods do not come up: the namespace's pods, their
// descriptions (events included) and their containers' last log lines.
func (n *realNodes) describe(ns string) string {
	var b strings.Builder
	for _, args := range [][]string{{"get", "pods", "-o", "wide"}, {"describe", "pods"}, {"logs", "--all-containers", "--prefix", "--tail=30", "-l", "qvirt.io/app"}} {
		out, _ := n.kubectl(append([]string{"-n", ns}, args...)...)
		fmt.Fprintf(&b, "$ kubectl -n %s %s\n%s\n", ns, strings.Join(args, " "), out)
	}
	return b.String()
}

// kubectl runs the tools' kubectl as the cluster admin.
func (n *realNodes) kubectl(args ...string) (string, error) {
	return n.kubectlWith(nil, args...)
}

// kubectlWith runs kubectl with stdin (none when nil).
func (n *realNodes) kubectlWith(stdin []byte, args ...string) (string, error) {
	cmd := exec.Command(n.kubectlBin, append([]string{"--kubeconfig", n.kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (n *realNodes) kubectlOK(t *testing.T, args ...string) string {
	t.Helper()
	return n.kubectlInOK(t, nil, args...)
}

// kubectlInOK runs kubectl with stdin and fails the test when it fails.
func (n *realNodes) kubectlInOK(t *testing.T, stdin []byte, args ...string) string {
	t.Helper()
	out, err := n.kubectlWith(stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// demoVM runs config/samples/vm-demo.yaml on the installed qvirt, the way a user does, with only
// its image pointed at this run's registry, and follows it through what a user does with it.
type demoVM struct {
	t        *testing.T
	n        *realNodes
	cl       client.Client
	qvirtctl string
}

func newDemoVM(t *testing.T, n *realNodes) *demoVM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	guestDir, err := testutil.GuestDir()
	if err != nil {
		t.Fatal(err)
	}
	seeded, err := registry.Seed(ctx, n.registry, guestDir)
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/qvirtctl")
	build.Dir = envtest.RepoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/qvirtctl: %v\n%s", err, out)
	}
	cl := n.client(t)
	manifest, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "config", "samples", "vm-demo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const sampleImage = "10.243.0.1:5000/qvirt/demo-guest:latest"
	if !bytes.Contains(manifest, []byte(sampleImage)) {
		t.Fatalf("config/samples/vm-demo.yaml no longer names %s", sampleImage)
	}
	manifest = bytes.ReplaceAll(manifest, []byte(sampleImage), []byte(seeded.KernelBoot))
	n.kubectlInOK(t, manifest, "apply", "-f", "-")
	return &demoVM{t: t, n: n, cl: cl, qvirtctl: filepath.Join(bin, "qvirtctl")}
}

// client is a controller-runtime client of the cluster, as its admin, that knows qvirt's kinds.
func (n *realNodes) client(t *testing.T) client.Client {
	t.Helper()
	ctrllog.SetLogger(logr.Discard())
	cl, err := scheme.NewClient(n.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// vmi waits until the demo VMI satisfies ok and returns it.
func (d *demoVM) vmi(what string, timeout time.Duration, ok func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	d.t.Helper()
	var v v1alpha1.VirtualMachineInstance
	details := func() string { return fmt.Sprintf("status %+v\n%s", v.Status, d.n.describe("default")) }
	testutil.Eventually(d.t, timeout, "VMI demo "+what, func() bool {
		err := d.cl.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "demo"}, &v)
		return err == nil && (ok(&v) || v.Status.Phase == v1alpha1.Failed)
	}, details)
	if v.Status.Phase == v1alpha1.Failed {
		d.t.Fatalf("VMI demo Failed while waiting for it to be %s: %s", what, details())
	}
	return &v
}

// launcherPod is the VMI's active launcher pod on node.
func (d *demoVM) launcherPod(v *v1alpha1.VirtualMachineInstance, node string) *corev1.Pod {
	d.t.Helper()
	var pods corev1.PodList
	if err := d.cl.List(context.Background(), &pods, client.InNamespace("default")); err != nil {
		d.t.Fatal(err)
	}
	for i, p := range pods.Items {
		if v.Status.ActivePods[p.UID] == node && p.Spec.NodeName == node {
			return &pods.Items[i]
		}
	}
	d.t.Fatalf("no active launcher pod of VMI demo on %s (active pods %v)", node, v.Status.ActivePods)
	return nil
}

// console attaches `qvirtctl console` through a pseudo-terminal, types cmd until the console shows
// want (the first keys may reach a guest still booting), and detaches with Ctrl+], after which
// qvirtctl must exit cleanly.
func (d *demoVM) console(cmd, want string) {
	t := d.t
	t.Helper()
	con := exec.Command(d.qvirtctl, "console", "demo", "-n", "default", "--timeout", "3m")
	con.Env = append(os.Environ(), "KUBECONFIG="+d.n.kubeconfig)
	term := testutil.StartOnPTY(t, con)
	var typed time.Time
	testutil.Eventually(t, 2*time.Minute, "the console showing "+want, func() bool {
		if strings.Contains(term.Screen.String(), want) {
			return true
		}
		if time.Since(typed) > 10*time.Second {
			term.Type(t, cmd+"\r")
			typed = time.Now()
		}
		return false
	}, func() string { return testutil.Tail(term.Screen.String(), 2000) })
	if err := term.Detach(10 * time.Second); err != nil {
		t.Errorf("qvirtctl console after Ctrl+]: %v\n%s", err, testutil.Tail(term.Screen.String(), 2000))
	}
}

// page gets the guest's web page at the launcher pod's address (the masquerade binding forwards
// the pod's port 80 to the guest).
func (d *demoVM) page(pod *corev1.Pod) string {
	d.t.Helper()
	return testutil.HTTPBody(d.t, "http://"+pod.Status.PodIP+"/", 2*time.Minute)
}

// checkDemoVM: the demo VM starts in a launcher pod that containerd ran from the launcher image
// on a real node, its console answers through qvirtctl and qvirt-api, its page answers at its pod
// address; `kubectl delete -k` cannot uninstall qvirt under it. Then qvirt is upgraded (upgrade applies another build): every component rolls, and
// the guest's QEMU keeps running, with the same PID, in its launcher pod of the old build. Asked
// to (`qvirtctl migrate`), it live-migrates to the other real node, into a launcher of the new
// build, with its guest's memory (a file in its tmpfs) intact; it stops with `qvirtctl stop`;
// and `kubectl delete` leaves nothing of it on either node.
func checkDemoVM(t *testing.T, n *realNodes, in *install.Installed, upgrade func() *install.Installed) {
	d := newDemoVM(t, n)
	v := d.vmi("Running", 5*time.Minute, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running
	})
	source := v.Status.NodeName
	pod := d.launcherPod(v, source)
	var launcherStatus *corev1.ContainerStatus
	for i, c := range pod.Status.ContainerStatuses {
		if c.Name == podlayout.ComputeContainer {
			launcherStatus = &pod.Status.ContainerStatuses[i]
		}
	}
	if launcherStatus == nil || !strings.HasPrefix(launcherStatus.ContainerID, "containerd://") ||
		!strings.HasSuffix(in.Images["qvirt-launcher"], launcherStatus.ImageID[strings.LastIndex(launcherStatus.ImageID, "@")+1:]) {
		t.Errorf("launcher pod %s: compute container %+v, want one containerd ran from %s", pod.Name, launcherStatus, in.Images["qvirt-launcher"])
	}
	t.Logf("VMI demo Running on %s in pod %s at %s", source, pod.Name, pod.Status.PodIP)

	d.console("echo kept-in-memory > /tmp/marker; echo qvirt-$((6*7))-$(cat /tmp/marker)", "qvirt-42-kept-in-memory")
	if got := d.page(pod); got != "demo" {
		t.Errorf("the guest's page at %s: %q, want %q", pod.Status.PodIP, got, "demo")
	}
	qemu := qemuPID(t, v)
	n.checkUninstallRefused(t, in)

	next := upgrade()
	if next.Images["qvirt-launcher"] == in.Images["qvirt-launcher"] || next.Images["qvirt-handler"] == in.Images["qvirt-handler"] {
		t.Fatalf("the upgrade's images %v are the installed ones", next.Images)
	}
	for _, name := range []string{"qvirt-controller", "qvirt-api", "qvirt-handler"} {
		n.checkRunsImage(t, name, next.Images[name])
	}
	if pid := qemuPID(t, v); pid != qemu {
		t.Fatalf("the guest's QEMU was PID %d before the upgrade and is %d after it", qemu, pid)
	}
	var still corev1.Pod
	if err := d.cl.Get(context.Background(), client.ObjectKeyFromObject(pod), &still); err != nil || still.UID != pod.UID {
		t.Fatalf("the launcher pod %s did not survive the upgrade: %v", pod.Name, err)
	}
	d.console("echo upgraded-$((40+1))-$(cat /tmp/marker)", "upgraded-41-kept-in-memory")
	t.Logf("upgrade applied: every component rolled, the guest's QEMU (PID %d) kept running in pod %s", qemu, pod.Name)

	out, err := exec.Command(d.qvirtctl, "--kubeconfig", n.kubeconfig, "migrate", "demo", "-n", "default", "--wait", "--timeout", "5m").CombinedOutput()
	if err != nil {
		t.Fatalf("qvirtctl migrate: %v\n%s\n%s", err, out, n.describe("default"))
	}
	v = d.vmi("Running on the other node", time.Minute, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && v.Status.NodeName != source && v.Status.NodeName != ""
	})
	target := d.launcherPod(v, v.Status.NodeName)
	if img := target.Spec.Containers[0].Image; img != next.Images["qvirt-launcher"] {
		t.Errorf("after the migration the launcher pod runs %s, want the upgrade's %s", img, next.Images["qvirt-launcher"])
	}
	migrated := time.Now()
	d.vmi("reporting the upgrade's launcher image", 2*time.Minute, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.LauncherContainerImageVersion == next.Images["qvirt-launcher"]
	})
	t.Logf("status.launcherContainerImageVersion names the upgrade's launcher %.1fs after the migration", time.Since(migrated).Seconds())
	t.Logf("VMI demo migrated from %s to %s (pod %s at %s)", source, v.Status.NodeName, target.Name, target.Status.PodIP)
	d.console("echo after-$((40+3)): $(cat /tmp/marker)", "after-43: kept-in-memory")
	if got := d.page(target); got != "demo" {
		t.Errorf("the guest's page at %s after the migration: %q, want %q", target.Status.PodIP, got, "demo")
	}

	if out, err := exec.Command(d.qvirtctl, "--kubeconfig", n.kubeconfig, "stop", "demo", "-n", "default").CombinedOutput(); err != nil {
		t.Fatalf("qvirtctl stop: %v\n%s", err, out)
	}
	stopped := v
	testutil.Eventually(t, 2*time.Minute, "VMI demo gone after qvirtctl stop", func() bool {
		err := d.cl.Get(context.Background(), client.ObjectKeyFromObject(v), &v1alpha1.VirtualMachineInstance{})
		return apierrors.IsNotFound(err)
	})
	n.kubectlOK(t, "delete", "vm", "demo", "-n", "default", "--wait", "--timeout=3m")
	d.checkNothingLeft(stopped, []types.UID{pod.UID, target.UID})
}

// qemuPID is the PID of VMI v's QEMU on this host (its command line names the VMI's socket
// directory, by UID).
func qemuPID(t *testing.T, v *v1alpha1.VirtualMachineInstance) int {
	t.Helper()
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		exe, _ := os.Readlink(filepath.Join(p, "exe"))
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		if filepath.Base(exe) == "qemu-system-x86_64" && bytes.Contains(cmdline, []byte(v.UID)) {
			pid, _ := strconv.Atoi(filepath.Base(p))
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		t.Fatalf("QEMU processes of VMI %s: %v, want one", v.UID, pids)
	}
	return pids[0]
}

// checkRunsImage checks that every pod of qvirt component app (bar those being deleted) runs
// image; that they are ready is what the rollout status before it waited for.
func (n *realNodes) checkRunsImage(t *testing.T, app, image string) {
	t.Helper()
	pods, err := n.cs.CoreV1().Pods("qvirt-system").List(context.Background(), metav1.ListOptions{LabelSelector: "qvirt.io/app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Spec.Containers[0].Image != image {
			t.Errorf("pod %s runs %s, want %s", p.Name, p.Spec.Containers[0].Image, image)
		}
	}
	if len(pods.Items) == 0 {
		t.Errorf("no pod of %s", app)
	}
}

// checkNothingLeft waits until nothing of VMI v and its launcher pods is left on the nodes: no
// VMI, no process naming the VMI (QEMU, the launcher), and nothing of the pods (podLeftovers).
func (d *demoVM) checkNothingLeft(v *v1alpha1.VirtualMachineInstance, pods []types.UID) {
	t := d.t
	t.Helper()
	left := func() []string {
		var out []string
		var got v1alpha1.VirtualMachineInstance
		if err := d.cl.Get(context.Background(), client.ObjectKeyFromObject(v), &got); !apierrors.IsNotFound(err) {
			out = append(out, fmt.Sprintf("VMI demo still there (%v)", err))
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if cmdline, err := os.ReadFile(p); err == nil && bytes.Contains(cmdline, []byte(v.UID)) {
				out = append(out, fmt.Sprintf("process %s: %s", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(cmdline, []byte{0}, []byte(" "))))
			}
		}
		return append(out, d.n.podLeftovers(pods)...)
	}
	testutil.Eventually(t, 2*time.Minute, "nothing of VMI demo left on the nodes", func() bool { return len(left()) == 0 },
		func() string { return strings.Join(left(), "\n") })
}
