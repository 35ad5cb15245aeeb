package handler_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/controllers"
	"github.com/qvirt/qvirt/handler"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/podnet"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests run the node agent's manager against a real kube-apiserver, with qvirt-controller's
// reconcilers creating the launcher pods and real `qvirt-launcher serve` processes booting the test
// guest under TCG. No kubelet can run here, so the test plays its part (kubelet below): it binds
// each launcher pod to the node, runs its process in a pod-like network namespace, reports the
// pod Running with the namespace's address, sends SIGTERM when the pod is deleted and removes the
// pod once the process is gone.

var (
	cp          *envtest.ControlPlane
	guestDir    string
	launcherBin string
)

const (
	nodeName    = "node-a"
	namespace   = "default"
	bootTimeout = 3 * time.Minute
)

func TestMain(m *testing.M) {
	var err error
	if guestDir, err = testutil.GuestDir(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// bin/ is the build output directory (ignored by git); the test's launcher is rebuilt each run.
	launcherBin, err = filepath.Abs("../bin/test/qvirt-launcher")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if out, err := exec.Command("go", "build", "-o", launcherBin, "../cmd/qvirt-launcher").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build qvirt-launcher: %v\n%s", err, out)
		os.Exit(1)
	}
	ctrl.SetLogger(logr.Discard())
	envtest.Main(m, &cp)
}

// env is one test's world: its namespace, a pod network, qvirt-controller's reconcilers and one
// node (more with addNode), each with its node agent (restartable) and kubelet stand-in.
type env struct {
	t   *testing.T
	c   client.Client
	ns  string
	net *podnet.Network
	*nodeAgent

	// limits are the node agents' limits on launcher calls; the production ones when zero.
	limits launcher.ClientOptions
	// pki is the CA of the handlers' certificates (qvirt-controller's CA, in a cluster).
	pki *testPKI
}

// The node agents beat every agentBeat, and qvirt-controller marks a node unschedulable after
// heartbeatTimeout without a beat.
const (
	agentBeat        = 500 * time.Millisecond
	heartbeatTimeout = 4 * time.Second
)

// nodeAgent is a node: its kubelet pods directory, its qvirt-handler and its kubelet stand-in.
type nodeAgent struct {
	t       *testing.T
	limits  launcher.ClientOptions
	pki     *testPKI
	node    string
	podsDir string
	kubelet *kubelet
	// cpuState is where the agent reads its kubelet's CPU manager checkpoint, which a test writes.
	cpuState string

	// registry holds the node agent's per-instance metrics.
	registry *prometheus.Registry

	stopHandler context.CancelFunc
	handlerDone chan error
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWithLimits(t, launcher.ClientOptions{})
}

// newEnvWithLimits is newEnv with node agents that bound launcher calls by limits.
func newEnvWithLimits(t *testing.T, limits launcher.ClientOptions) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{t: t, c: cp.Client, ns: "h-" + rand.String(5), net: podnet.NewNetwork(t), limits: limits, pki: newTestPKI(t)}
	for _, ns := range []string{e.ns, "qvirt-system"} {
		if err := client.IgnoreAlreadyExists(e.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})); err != nil {
			t.Fatal(err)
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "qvirt-config", Namespace: "qvirt-system"},
		Data: map[string]string{"useEmulation": "true", "launcherImage": "qvirt-launcher:test"}}
	if err := client.IgnoreAlreadyExists(e.c.Create(ctx, cm)); err != nil {
		t.Fatal(err)
	}
	e.startController()
	e.nodeAgent = e.addNode()
	return e
}

// addNode starts another node's agent and kubelet stand-in.
func (e *env) addNode() *nodeAgent {
	t := e.t
	podsDir := t.TempDir()
	n := &nodeAgent{t: t, limits: e.limits, pki: e.pki, node: "node-" + rand.String(5), podsDir: podsDir,
		cpuState: filepath.Join(t.TempDir(), "cpu_manager_state")}
	// The Node the agent beats on, as its kubelet would have registered it.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.node}}
	if err := e.c.Create(context.Background(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), node) })
	n.kubelet = &kubelet{t: t, c: e.c, node: n.node, podsDir: podsDir, net: e.net, dirs: map[types.UID]string{}}
	n.startHandler()
	return n
}

// startController runs qvirt-controller's reconcilers until the test ends.
func (e *env) startController() {
	t := e.t
	opts := cp.ManagerOptions()
	opts.Cache = controllers.CacheOptions("qvirt-system")
	mgr, err := ctrl.NewManager(cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	// A short heartbeat timeout (the agents beat every agentBeat), so a test can stop an agent for
	// longer than it.
	if _, err := controllers.Setup(ctx, mgr, controllers.Options{Namespace: "qvirt-system", NodeHeartbeatTimeout: heartbeatTimeout}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller manager: %v", err)
		}
	})
}

// startHandler starts the node agent; killHandler stops it (the launchers keep running).
func (n *nodeAgent) startHandler() {
	t := n.t
	opts := cp.ManagerOptions()
	opts.Cache = handler.CacheOptions(n.node, "qvirt-system")
	opts.Logger = testr.NewWithOptions(t, testr.Options{Verbosity: 0}).WithName(n.node)
	mgr, err := ctrl.NewManager(cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	n.registry = prometheus.NewRegistry()
	opts2 := handler.Options{NodeName: n.node, PodsDir: n.podsDir, HeartbeatInterval: agentBeat, Namespace: "qvirt-system", Registry: n.registry, LauncherLimits: n.limits,
		Migration: handler.MigrationOptions{Addr: "127.0.0.1:0"}, Certs: certs.Fixed(n.pki.material(t, certs.HandlerNodeSpec(n.node))),
		CPUManagerState: n.cpuState}
	if err := handler.Setup(context.Background(), mgr, opts2); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.stopHandler, n.handlerDone = cancel, make(chan error, 1)
	go func() { n.handlerDone <- mgr.Start(ctx) }()
	t.Cleanup(n.killHandler)
}

func (n *nodeAgent) killHandler() {
	if n.stopHandler == nil {
		return
	}
	n.stopHandler()
	if err := <-n.handlerDone; err != nil {
		n.t.Errorf("handler manager of %s: %v", n.node, err)
	}
	n.stopHandler = nil
}

// guestVMI is the test guest with a masquerade interface on the pod network, counting ticks from
// boot so a reboot would show.
func (e *env) guestVMI(name string) *v1alpha1.VirtualMachineInstance {
	e.t.Helper()
	req, err := translate.LoadFile("../test/guest/vmi.yaml")
	if err != nil {
		e.t.Fatal(err)
	}
	spec := req.Spec
	kb := spec.Domain.Firmware.KernelBoot
	kb.Container.Image = "file://" + guestDir
	kb.KernelArgs = strings.Replace(kb.KernelArgs, "qvirt.hostname=testguest", "qvirt.hostname="+name, 1) + " qvirt.tick=0"
	spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
	spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	return &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns}, Spec: spec}
}

func (e *env) create(v *v1alpha1.VirtualMachineInstance) {
	e.t.Helper()
	if err := e.c.Create(context.Background(), v); err != nil {
		e.t.Fatalf("create VMI %s: %v", v.Name, err)
	}
}

func (e *env) get(name string) *v1alpha1.VirtualMachineInstance {
	e.t.Helper()
	var v v1alpha1.VirtualMachineInstance
	if err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: name}, &v); err != nil {
		e.t.Fatalf("get VMI %s: %v", name, err)
	}
	return &v
}

// waitVMI waits until ok holds for the VMI and returns it.
func (e *env) waitVMI(name string, d time.Duration, what string, ok func(*v1alpha1.VirtualMachineInstance) bool) *v1alpha1.VirtualMachineInstance {
	e.t.Helper()
	var v *v1alpha1.VirtualMachineInstance
	testutil.Eventually(e.t, d, "VMI "+name+" "+what, func() bool {
		v = e.get(name)
		return ok(v)
	}, func() string { return fmt.Sprintf("status: %+v", v.Status) })
	return v
}

func condition(v *v1alpha1.VirtualMachineInstance, t string) *metav1.Condition {
	return meta.FindStatusCondition(v.Status.Conditions, t)
}

func isTrue(v *v1alpha1.VirtualMachineInstance, t string) bool {
	c := condition(v, t)
	return c != nil && c.Status == metav1.ConditionTrue
}

// waitNotSynchronized waits for the VMI's Synchronized condition to turn False and returns it.
func (e *env) waitNotSynchronized(name string) *metav1.Condition {
	e.t.Helper()
	v := e.waitVMI(name, 30*time.Second, "Synchronized=False", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := condition(v, vmisync.ConditionSynchronized)
		return c != nil && c.Status == metav1.ConditionFalse
	})
	return condition(v, vmisync.ConditionSynchronized)
}

// events are the messages of the VMI's Events with reason.
func (e *env) events(name, reason string) []string {
	e.t.Helper()
	var list corev1.EventList
	if err := e.c.List(context.Background(), &list, client.InNamespace(e.ns)); err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == "VirtualMachineInstance" && ev.InvolvedObject.Name == name && ev.Reason == reason {
			out = append(out, ev.Message)
		}
	}
	return out
}

func (e *env) waitEvent(name, reason, contains string, d time.Duration) {
	e.t.Helper()
	testutil.Eventually(e.t, d, fmt.Sprintf("Event %s on VMI %s containing %q", reason, name, contains), func() bool {
		for _, m := range e.events(name, reason) {
			if strings.Contains(m, contains) {
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("have %q", e.events(name, reason)) })
}

// kubelet stands in for the node's kubelet: see the comment at the top.
type kubelet struct {
	t       *testing.T
	c       client.Client
	node    string
	podsDir string
	net     *podnet.Network

	mu sync.Mutex
	// dirs are the socket volumes (their real, short directories) of the pods run here, by VMI.
	dirs map[types.UID]string
}

// dir is the socket directory of the VMI's launcher in the pod last run here for it.
func (k *kubelet) dir(uid types.UID) launcher.Dir {
	k.mu.Lock()
	defer k.mu.Unlock()
	return launcher.VMIDir(k.dirs[uid], uid)
}

// pod is one launcher pod's process.
type pod struct {
	name, ns string
	// sockets is the real directory of the pod's sockets volume.
	sockets string
	net     *podnet.NS
	cmd     *exec.Cmd
	out     testutil.SyncBuffer
	exited  chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
}

// run waits for the VMI's launcher pod, binds it to the node and runs it (its process too when
// withProcess).
func (k *kubelet) run(v *v1alpha1.VirtualMachineInstance, withProcess bool) *pod {
	k.t.Helper()
	return k.runPod(v, "", withProcess)
}

// runTarget is run for the target pod of migration migrationUID.
func (k *kubelet) runTarget(v *v1alpha1.VirtualMachineInstance, migrationUID string) *pod {
	k.t.Helper()
	return k.runPod(v, migrationUID, true)
}

func (k *kubelet) runPod(v *v1alpha1.VirtualMachineInstance, migrationUID string, withProcess bool) *pod {
	t := k.t
	t.Helper()
	ctx := context.Background()
	var po corev1.Pod
	testutil.Eventually(t, 30*time.Second, "launcher pod of "+v.Name, func() bool {
		var list corev1.PodList
		_ = k.c.List(ctx, &list, client.InNamespace(v.Namespace), client.MatchingLabels{v1alpha1.VMINameLabel: v.Name})
		for _, p := range list.Items {
			if p.Labels[v1alpha1.MigrationUIDLabel] == migrationUID && p.Spec.NodeName == "" {
				po = p
				return true
			}
		}
		return false
	})
	binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: po.Name, Namespace: po.Namespace},
		Target: corev1.ObjectReference{Kind: "Node", Name: k.node}}
	if err := k.c.SubResource("binding").Create(ctx, &po, binding); err != nil {
		t.Fatalf("bind pod %s: %v", po.Name, err)
	}
	p := &pod{name: po.Name, ns: po.Namespace, net: k.net.NewNS(t), exited: make(chan struct{}), stop: make(chan struct{}),
		sockets: testutil.PodSocketDir(t, k.podsDir, po.UID)}
	k.mu.Lock()
	k.dirs[v.UID] = p.sockets
	k.mu.Unlock()
	if withProcess {
		k.start(p, string(v.UID))
	}
	if err := k.c.Get(ctx, client.ObjectKeyFromObject(&po), &po); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	po.Status.Phase = corev1.PodRunning
	po.Status.PodIP = p.net.PodIP.String()
	po.Status.PodIPs = []corev1.PodIP{{IP: p.net.PodIP.String()}}
	po.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "compute", Ready: true, Image: po.Spec.Containers[0].Image,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if err := k.c.Status().Update(ctx, &po); err != nil {
		t.Fatalf("report pod %s running: %v", po.Name, err)
	}
	return p
}

// start runs `qvirt-launcher serve` inside the pod's network namespace and a mount namespace of
// its own where the pod's sockets volume is at podlayout.SocketDir, as a container sees it, and
// follows the pod.
func (k *kubelet) start(p *pod, uid string) {
	t := k.t
	termLog := filepath.Join(t.TempDir(), "termination-log")
	if err := os.MkdirAll(podlayout.SocketDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command("unshare", "--mount", "--propagation", "slave", "--", "sh", "-c", `mount --bind "$0" "$1" && shift && exec "$@"`,
		p.sockets, podlayout.SocketDir, "ip", "netns", "exec", p.net.Name, launcherBin, "serve",
		"--socket-dir", podlayout.SocketDir, "--vmi-uid", uid, "--emulation", "--scratch-dir", t.TempDir(),
		"--"+podlayout.FlagAllowFileImagesForTests, // guestVMI boots a file:// image
		"--termination-log", termLog, "--linger", "2s", "--"+podlayout.FlagCPUProfile)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start the launcher: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	p.wg.Add(1)
	go k.follow(p)
	t.Cleanup(func() {
		close(p.stop)
		p.wg.Wait()
		select {
		case <-p.exited:
		default:
			// The launcher's QEMU dies with it (its parent-death signal).
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.exited
		}
		if t.Failed() {
			t.Logf("launcher output of pod %s:\n%s", p.name, testutil.Tail(p.out.String(), 4000))
		}
	})
}

// follow acts as the kubelet on the pod: SIGTERM when it is deleted, and when the process is gone
// the final phase, or the pod's removal if it was being deleted. It runs in its own goroutine and
// never fails the test itself.
func (k *kubelet) follow(p *pod) {
	defer p.wg.Done()
	ctx := context.Background()
	key := client.ObjectKey{Namespace: p.ns, Name: p.name}
	termSent := false
	for {
		select {
		case <-p.stop:
			return
		case <-p.exited:
			var po corev1.Pod
			if err := k.c.Get(ctx, key, &po); err != nil {
				return
			}
			if !po.DeletionTimestamp.IsZero() {
				_ = k.c.Delete(ctx, &po, client.GracePeriodSeconds(0))
				return
			}
			po.Status.Phase = corev1.PodSucceeded
			if p.cmd.ProcessState.ExitCode() != 0 {
				po.Status.Phase = corev1.PodFailed
			}
			_ = k.c.Status().Update(ctx, &po)
			return
		case <-time.After(100 * time.Millisecond):
		}
		var po corev1.Pod
		if err := k.c.Get(ctx, key, &po); err == nil && !po.DeletionTimestamp.IsZero() && !termSent {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			termSent = true
		}
	}
}

func (n *nodeAgent) console(v *v1alpha1.VirtualMachineInstance) *testutil.Console {
	return testutil.AttachConsole(n.t, n.kubelet.dir(v.UID).Serial())
}

func (n *nodeAgent) launcherClient(v *v1alpha1.VirtualMachineInstance) *launcher.Client {
	c := launcher.NewClient(n.kubelet.dir(v.UID).Command())
	n.t.Cleanup(c.Close)
	return c
}

// TestInstanceLifecycle: the VMI goes Running with the pod's address as the guest's, the guest got
// its address over DHCP and serves HTTP at the pod's address, pause shows Paused, and deleting the
// VMI powers the guest off gracefully.
func TestInstanceLifecycle(t *testing.T) {
	e := newEnv(t)
	v := e.guestVMI("vm1")
	e.create(v)
	p := e.kubelet.run(v, true)
	con := e.console(v)

	v = e.waitVMI("vm1", bootTimeout, "Running and Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady)
	})
	if len(v.Status.Interfaces) != 1 || v.Status.Interfaces[0].IP != p.net.PodIP.String() || v.Status.Interfaces[0].Name != "default" {
		t.Errorf("interfaces %+v, want default at the pod's address %s", v.Status.Interfaces, p.net.PodIP)
	}
	if !strings.HasPrefix(v.Status.QEMUVersion, "7.") || v.Status.LauncherContainerImageVersion != "qvirt-launcher:test" {
		t.Errorf("qemuVersion %q launcherContainerImageVersion %q", v.Status.QEMUVersion, v.Status.LauncherContainerImageVersion)
	}
	if !isTrue(v, vmisync.ConditionSynchronized) {
		t.Errorf("Synchronized condition: %+v", condition(v, vmisync.ConditionSynchronized))
	}
	con.Expect(t, 0, "QVIRT-IP eth0 10.0.2.2", bootTimeout)

	t.Run("the launcher wrote the CPU profile of its start", func(t *testing.T) {
		file := filepath.Join(p.sockets, string(v.UID), podlayout.ProfileFile)
		// It appears, complete, a second after the guest first ran.
		testutil.Eventually(t, 10*time.Second, file, func() bool {
			_, err := os.Stat(file)
			return err == nil
		})
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		prof, err := profile.Parse(f)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if prof.PeriodType == nil || prof.PeriodType.Type != "cpu" || prof.DurationNanos <= 0 {
			t.Errorf("%s: period type %v, duration %dns; want a CPU profile of the launcher's start", file, prof.PeriodType, prof.DurationNanos)
		}
	})

	t.Run("the guest serves HTTP at the pod's address", func(t *testing.T) {
		hc := http.Client{Timeout: 5 * time.Second}
		var body string
		testutil.Eventually(t, 30*time.Second, "GET http://"+p.net.PodIP.String()+"/", func() bool {
			resp, err := hc.Get("http://" + p.net.PodIP.String() + "/")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b := make([]byte, 256)
			n, _ := resp.Body.Read(b)
			body = string(b[:n])
			return resp.StatusCode == http.StatusOK
		})
		if strings.TrimSpace(body) != "vm1" {
			t.Errorf("the guest's httpd answered %q, want its hostname vm1", body)
		}
	})

	t.Run("the node agent's metrics cover the guest", func(t *testing.T) {
		families, err := e.registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var rss float64
		for _, f := range families {
			if f.GetName() != "qvirt_vmi_memory_resident_bytes" {
				continue
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "name" && l.GetValue() == "vm1" {
						rss = m.GetGauge().GetValue()
					}
				}
			}
		}
		if rss < 16<<20 {
			t.Errorf("qvirt_vmi_memory_resident_bytes{name=vm1} = %.0f, want QEMU's RSS (tens of MiB)", rss)
		}
	})

	t.Run("pause shows Paused, unpause clears it", func(t *testing.T) {
		lc := e.launcherClient(v)
		if err := lc.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		v := e.waitVMI("vm1", 30*time.Second, "Paused", func(v *v1alpha1.VirtualMachineInstance) bool {
			return isTrue(v, v1alpha1.VirtualMachineInstancePaused)
		})
		if c := condition(v, v1alpha1.VirtualMachineInstancePaused); c.Reason != vmisync.ReasonPausedByUser {
			t.Errorf("Paused reason %q, want %q", c.Reason, vmisync.ReasonPausedByUser)
		}
		if isTrue(v, v1alpha1.VirtualMachineInstanceReady) {
			t.Error("a paused instance is Ready")
		}
		if err := lc.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		e.waitVMI("vm1", 30*time.Second, "Ready and not Paused", func(v *v1alpha1.VirtualMachineInstance) bool {
			return condition(v, v1alpha1.VirtualMachineInstancePaused) == nil && isTrue(v, v1alpha1.VirtualMachineInstanceReady)
		})
	})

	t.Run("deleting the VMI powers the guest off gracefully", func(t *testing.T) {
		from := len(con.Text())
		if err := e.c.Delete(context.Background(), v); err != nil {
			t.Fatal(err)
		}
		con.Expect(t, from, "QVIRT-POWERDOWN", 30*time.Second)
		select {
		case <-p.exited:
		case <-time.After(60 * time.Second):
			t.Fatal("the launcher did not exit after the guest powered off")
		}
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("launcher exit code %d, want 0 (guest shut down cleanly)", code)
		}
		if dir := string(e.kubelet.dir(v.UID)); fileExists(dir) {
			t.Errorf("the launcher left its socket directory %s on the node", dir)
		}
		e.waitEvent("vm1", vmisync.EventGuestEnded, "guest shutdown", 10*time.Second)
		testutil.Eventually(t, 30*time.Second, "VMI vm1 gone", func() bool {
			var v v1alpha1.VirtualMachineInstance
			err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "vm1"}, &v)
			return client.IgnoreNotFound(err) == nil && err != nil
		})
	})
}

// TestHandlerRestartKeepsGuests kills the node agent while two VMs run and starts a new one: neither
// guest reboots (their tick counters go on, QEMU keeps its PID), and a change made while no agent
// ran (a pause) is in the status again within 5 s. vm-b's masquerade network is KubeVirt's
// vmNetworkCIDR 10.11.12.0/24: its guest gets 10.11.12.2, and the new agent finds that setup as
// it left it.
func TestHandlerRestartKeepsGuests(t *testing.T) {
	e := newEnv(t)
	names := []string{"vm-a", "vm-b"}
	vmis := map[string]*v1alpha1.VirtualMachineInstance{}
	cons := map[string]*testutil.Console{}
	for _, name := range names {
		v := e.guestVMI(name)
		if name == "vm-b" {
			v.Spec.Networks[0].Pod.VMNetworkCIDR = "10.11.12.0/24"
		}
		e.create(v)
		e.kubelet.run(v, true)
		cons[name] = e.console(v)
		vmis[name] = v
	}
	pids := map[string]int{}
	for _, name := range names {
		e.waitVMI(name, bootTimeout, "Running", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady)
		})
		cons[name].Expect(t, 0, "tick 2\r\n", bootTimeout)
		ip := map[string]string{"vm-a": "10.0.2.2", "vm-b": "10.11.12.2"}[name]
		cons[name].Expect(t, 0, "QVIRT-IP eth0 "+ip, bootTimeout)
		st, err := e.launcherClient(vmis[name]).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pids[name] = st.PID
	}

	e.killHandler()
	ticks := map[string]int{}
	for _, name := range names {
		ticks[name] = cons[name].LastTick()
	}
	// While no agent runs, vm-a is paused (as an operator's QMP stop would).
	if err := e.launcherClient(vmis["vm-a"]).Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The agent stays away for longer than the heartbeat timeout: qvirt-controller stops
	// scheduling onto the node, but an agent outage is not a guest failure.
	var lastBeat time.Time
	testutil.Eventually(t, 3*heartbeatTimeout, "node "+e.node+"'s heartbeat older than the timeout", func() bool {
		var n corev1.Node
		if err := e.c.Get(context.Background(), client.ObjectKey{Name: e.node}, &n); err != nil {
			return false
		}
		lastBeat, _ = time.Parse(time.RFC3339, n.Annotations[v1alpha1.NodeHeartbeatAnnotation])
		return time.Since(lastBeat) > heartbeatTimeout+time.Second
	})
	// Time for qvirt-controller to act on the stale heartbeat, as it did before: fail the guests.
	time.Sleep(2 * time.Second)
	for _, name := range names {
		if v := e.get(name); v.Status.Phase != v1alpha1.Running {
			t.Errorf("%s is %s (%s) while its agent is away, want Running: the guest still runs", name, v.Status.Phase, v.Status.Reason)
		}
	}
	if err := e.launcherClient(vmis["vm-a"]).Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.launcherClient(vmis["vm-a"]).Pause(context.Background()); err != nil {
		t.Fatal(err)
	}

	restarted := time.Now()
	e.startHandler()
	e.waitVMI("vm-a", 5*time.Second, "Paused after the agent's restart", func(v *v1alpha1.VirtualMachineInstance) bool {
		return isTrue(v, v1alpha1.VirtualMachineInstancePaused)
	})
	t.Logf("status correct %.2fs after the agent restarted", time.Since(restarted).Seconds())
	if err := e.launcherClient(vmis["vm-a"]).Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		e.waitVMI(name, 5*time.Second, "Running and Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady)
		})
		// The counter goes on from where it was: no reboot.
		want := ticks[name] + 3
		cons[name].Expect(t, 0, fmt.Sprintf("tick %d\r\n", want), 30*time.Second)
		if n := strings.Count(cons[name].Text(), "QVIRT-GUEST-READY"); n > 1 {
			t.Errorf("%s booted %d times", name, n)
		}
		st, err := e.launcherClient(vmis[name]).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.PID != pids[name] {
			t.Errorf("%s: QEMU PID %d, was %d: the VM was restarted", name, st.PID, pids[name])
		}
	}

	t.Run("vm-b's network is as the old agent left it", func(t *testing.T) {
		// The new agent's setup found the bridge on 10.11.12.1, the guest's gateway, and left it.
		from := len(cons["vm-b"].Text())
		cons["vm-b"].Send(t, `ping -c 1 -W 5 10.11.12.1 >/dev/null && echo "GW-OK" || echo "GW-FAILED"`)
		cons["vm-b"].Expect(t, from, "GW-OK\r\n", 30*time.Second)
	})

	t.Run("a guest powered off from inside ends its instance Succeeded", func(t *testing.T) {
		cons["vm-b"].Send(t, "poweroff -f")
		v := e.waitVMI("vm-b", 30*time.Second, "Succeeded", func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.Phase == v1alpha1.Succeeded
		})
		if v.Status.Reason != "GuestShutdown" || isTrue(v, v1alpha1.VirtualMachineInstanceReady) {
			t.Errorf("reason %q, Ready %+v: want GuestShutdown and not Ready", v.Status.Reason, condition(v, v1alpha1.VirtualMachineInstanceReady))
		}
		e.waitEvent("vm-b", vmisync.EventGuestEnded, "guest shutdown", 10*time.Second)
	})
}

// TestBadLaunchers: an instance whose launcher never listens, and one whose launcher refuses the
// spec (a missing image), each get a clear condition and Event, while a good instance on the same
// node runs undisturbed.
func TestBadLaunchers(t *testing.T) {
	e := newEnv(t)
	good := e.guestVMI("good")
	e.create(good)
	goodPod := e.kubelet.run(good, true)

	silent := e.guestVMI("silent")
	e.create(silent)
	e.kubelet.run(silent, false)

	badImage := e.guestVMI("bad-image")
	badImage.Spec.Domain.Firmware.KernelBoot.Container.Image = "file:///nonexistent/qvirt-image"
	e.create(badImage)
	e.kubelet.run(badImage, true)

	// A launcher of another protocol version (an older or newer launcher image): it is asked
	// which versions it speaks and is sent nothing.
	stranger := e.guestVMI("stranger")
	e.create(stranger)
	e.kubelet.run(stranger, false)
	synced := standInLauncher(t, e.kubelet.dir(e.get("stranger").UID), "99")

	// A process that is not of the pod (here: on the host, as another pod's or a stray process
	// would be) serving the pod's launcher socket, speaking the right protocol: the agent must not
	// wire networking into its namespaces nor send it the machine.
	impostor := e.guestVMI("impostor")
	e.create(impostor)
	e.kubelet.run(impostor, false)
	fooled := standInLauncher(t, e.kubelet.dir(e.get("impostor").UID), machine.Protocol)

	c := e.waitNotSynchronized("bad-image")
	if c.Reason != vmisync.ReasonSyncFailed || !strings.Contains(c.Message, "spec.domain.firmware.kernelBoot.container.image: ") {
		t.Errorf("Synchronized condition %+v: want reason %s naming the image field", c, vmisync.ReasonSyncFailed)
	}
	e.waitEvent("bad-image", vmisync.EventSyncFailed, "/nonexistent/qvirt-image", 10*time.Second)

	// The silent pod's container started just now: the agent waits launcherStartGrace (10 s)
	// before it calls the launcher unreachable.
	if c := e.waitNotSynchronized("silent"); c.Reason != vmisync.ReasonLauncherUnreachable || !strings.Contains(c.Message, "launcher.sock") {
		t.Errorf("Synchronized condition %+v: want reason %s naming the socket", c, vmisync.ReasonLauncherUnreachable)
	}
	e.waitEvent("silent", vmisync.EventLauncherUnreachable, "launcher.sock", 10*time.Second)

	if c := e.waitNotSynchronized("stranger"); c.Reason != vmisync.ReasonProtocolMismatch ||
		!strings.Contains(c.Message, "protocol version(s) 99") || !strings.Contains(c.Message, "speaks "+machine.Protocol) {
		t.Errorf("Synchronized condition %+v: want reason %s naming versions 99 and %s", c, vmisync.ReasonProtocolMismatch, machine.Protocol)
	}
	if n := synced.Load(); n != 0 {
		t.Errorf("the node agent sent %d requests besides info and status to a launcher it cannot speak to", n)
	}

	if c := e.waitNotSynchronized("impostor"); c.Reason != vmisync.ReasonForeignLauncher || !strings.Contains(c.Message, "not of the VMI's launcher pod") {
		t.Errorf("Synchronized condition %+v: want reason %s", c, vmisync.ReasonForeignLauncher)
	}
	e.waitEvent("impostor", vmisync.EventForeignLauncher, "not of the VMI's launcher pod", 10*time.Second)
	if n := fooled.Load(); n != 0 {
		t.Errorf("the node agent sent %d requests besides info and status to a process outside the launcher pod", n)
	}

	for _, name := range []string{"silent", "bad-image", "stranger", "impostor"} {
		if v := e.get(name); v.Status.Phase != v1alpha1.Scheduled {
			t.Errorf("%s: phase %s, want it left Scheduled while the agent retries", name, v.Status.Phase)
		}
	}
	v := e.waitVMI("good", bootTimeout, "Running and Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady) &&
			isTrue(v, vmisync.ConditionSynchronized)
	})

	t.Run("a guest still running for a Failed instance is killed", func(t *testing.T) {
		// As qvirt-controller does when the node stopped beating: the instance is Failed, and a
		// node agent that comes back must not let its guest run on.
		base := v.DeepCopy()
		v.Status.Phase, v.Status.Reason = v1alpha1.Failed, "NodeUnresponsive"
		if err := e.c.Status().Patch(context.Background(), v, client.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-goodPod.exited:
		case <-time.After(30 * time.Second):
			t.Fatal("the guest of the Failed instance still runs")
		}
		e.waitEvent("good", vmisync.EventKilledLeftover, "Failed", 10*time.Second)
	})
}

// standInLauncher serves a launcher's socket for the VMI with uid that speaks only protocol
// version proto: it answers info and status (Waiting) and counts every other request.
func standInLauncher(t *testing.T, dir launcher.Dir, proto string) *atomic.Int32 {
	t.Helper()
	if err := os.MkdirAll(string(dir), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", dir.Command())
	if err != nil {
		t.Fatal(err)
	}
	var others atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(machine.Info{Protocols: []string{proto}})
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(protocol.Status{Phase: protocol.PhaseWaiting})
		if r.URL.Query().Get("watch") == "true" {
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		others.Add(1)
		http.NotFound(w, nil)
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &others
}

// TestHungLaunchers: launchers that accept calls and never answer, more of them than the node
// agent's workers, and one that answers with a reply that does not end, cost only their own
// instances: each shows Synchronized=False saying so, while a good instance on the same node
// starts and stops.
func TestHungLaunchers(t *testing.T) {
	limits := launcher.ClientOptions{CallTimeout: time.Second, MaxReplyBytes: 64 << 10}
	if os.Getenv("QVIRT_TEST_UNBOUNDED_LAUNCHER_CALLS") != "" {
		// What the node agent did before launcher calls were bounded: the test must fail.
		limits = launcher.ClientOptions{CallTimeout: time.Hour, MaxReplyBytes: 1 << 40}
	}
	e := newEnvWithLimits(t, limits)
	var hung []string
	for i := range vmisync.Workers + 1 {
		name := fmt.Sprintf("hung-%d", i)
		v := e.guestVMI(name)
		e.create(v)
		e.kubelet.run(v, false)
		hungLauncher(t, e.kubelet.dir(e.get(name).UID), nil)
		hung = append(hung, name)
	}
	endless := e.guestVMI("endless")
	e.create(endless)
	e.kubelet.run(endless, false)
	hungLauncher(t, e.kubelet.dir(e.get("endless").UID), []byte(`{"phase":"`+strings.Repeat("x", 1<<20)))

	good := e.guestVMI("good")
	e.create(good)
	goodPod := e.kubelet.run(good, true)
	good = e.waitVMI("good", bootTimeout, "Running and Ready while launchers hang", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady)
	})

	for _, name := range hung {
		if c := e.waitNotSynchronized(name); c.Reason != vmisync.ReasonLauncherTimeout || !strings.Contains(c.Message, "did not answer") {
			t.Errorf("%s: Synchronized condition %+v: want reason %s saying the launcher did not answer", name, c, vmisync.ReasonLauncherTimeout)
		}
	}
	if c := e.waitNotSynchronized("endless"); c.Reason != vmisync.ReasonLauncherReplyTooLarge || !strings.Contains(c.Message, "launcher.sock") {
		t.Errorf("endless: Synchronized condition %+v: want reason %s naming the launcher's socket", c, vmisync.ReasonLauncherReplyTooLarge)
	}

	if err := e.c.Delete(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	select {
	case <-goodPod.exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the good instance's launcher did not stop while the others hang")
	}
	testutil.Eventually(t, 30*time.Second, "VMI good gone", func() bool {
		var v v1alpha1.VirtualMachineInstance
		err := e.c.Get(context.Background(), client.ObjectKey{Namespace: e.ns, Name: "good"}, &v)
		return client.IgnoreNotFound(err) == nil && err != nil
	})
}

// hungLauncher serves a launcher's socket for the VMI with uid that reads each request and answers
// nothing, or, with a prefix, answers 200 with prefix and then nothing more, the body never ending.
// The connections stay open until the test ends.
func hungLauncher(t *testing.T, dir launcher.Dir, prefix []byte) {
	t.Helper()
	if err := os.MkdirAll(string(dir), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", dir.Command())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(done)
		_ = ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
					return
				}
				if prefix != nil {
					_, _ = fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
					_, _ = conn.Write(prefix)
				}
				<-done
			}()
		}
	}()
}

// TestLiveMigration moves a running guest from one node to another through a
// VirtualMachineInstanceMigration: the target node's agent prepares the incoming QEMU, the source
// node's agent migrates to it, and the guest keeps counting on the target, reached at the target
// pod's address.
func TestLiveMigration(t *testing.T) {
	e := newEnv(t)
	nodeB := e.addNode()
	v, _, srcCon := e.startGuest("mig")
	srcCon.Expect(t, 0, "QVIRT-IP eth0 10.0.2.2", bootTimeout)
	srcCon.Expect(t, 0, "tick 2\r\n", bootTimeout)
	// A hot-plugged disk goes along, on the same root port. It is read-only, so nothing is copied
	// (a writable emptyDisk is: TestMigrationKeepsEmptyDiskData).
	e.addDiskTarget("mig", "scratch", v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}},
		&v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio, ReadOnly: true})
	e.waitVMI("mig", 30*time.Second, "volume scratch Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		vs := volumeStatus(v, "scratch")
		return vs != nil && vs.Phase == v1alpha1.VolumeReady
	})

	vmim, target := e.startMigration(v, "mig-1", nodeB)
	dstCon := nodeB.console(v)
	started := time.Now()
	e.waitMigrationSucceeded(vmim)
	t.Logf("migration succeeded %.2fs after the target pod ran", time.Since(started).Seconds())

	got := e.waitVMI("mig", time.Minute, "Running and Ready on "+nodeB.node, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == nodeB.node && v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady) &&
			len(v.Status.Interfaces) == 1 && v.Status.Interfaces[0].IP == target.net.PodIP.String()
	})
	ms := got.Status.MigrationState
	if ms == nil || !ms.Completed || ms.Failed || ms.StartTimestamp == nil || ms.EndTimestamp == nil || ms.DataTotalBytes == nil {
		t.Errorf("migrationState %+v: want completed with timestamps and data counters", ms)
	}
	// The guest goes on counting on the target: the same guest, not a reboot.
	last := srcCon.LastTick()
	dstCon.Expect(t, 0, fmt.Sprintf("tick %d\r\n", last+2), 30*time.Second)
	if strings.Contains(dstCon.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
	if vs := volumeStatus(got, "scratch"); vs == nil || vs.Phase != v1alpha1.VolumeReady || !vs.Hotplugged {
		t.Errorf("volume scratch after the migration: %+v", vs)
	}
	from := len(dstCon.Text())
	dstCon.Send(t, "for i in $(seq 20); do [ -e /sys/block/vda/serial ] && break; sleep 1; done; cat /sys/block/vda/serial; echo; echo SERIAL-$((3+4))")
	end := dstCon.Expect(t, from, "SERIAL-7", 20*time.Second)
	if !strings.Contains(dstCon.Text()[from:end], "scratch") {
		t.Errorf("the hot-plugged disk is not the guest's vda on the target: %q", dstCon.Text()[from:end])
	}
	waitHTTP(t, target.net.PodIP.String(), "the guest's httpd at the target pod's address")
}

// TestMigrationKeepsEmptyDiskData writes a marker to a hot-plugged emptyDisk and migrates the
// instance, which stays LiveMigratable: the node agents carry the disk's copy through their tunnel
// before the memory (block migration), and the guest, on the target, reads its marker back from
// the target's disk.
func TestMigrationKeepsEmptyDiskData(t *testing.T) {
	e := newEnv(t)
	nodeB := e.addNode()
	v, _, con := e.startGuest("marker")
	con.Expect(t, 0, "tick 2\r\n", bootTimeout)
	e.addDisk("marker", "scratch", v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}})
	e.waitVMI("marker", 30*time.Second, "volume scratch Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		vs := volumeStatus(v, "scratch")
		return vs != nil && vs.Phase == v1alpha1.VolumeReady
	})
	// The guest computes the marker so that the typed command's echo does not match it.
	con.Run(t, "for i in $(seq 20); do [ -b /dev/vda ] && break; sleep 1; done; echo QVIRT-MARK-$((6*7)) > /dev/vda && sync && echo WROTE-$((2+3))", "WROTE-5", 30*time.Second)
	e.waitVMI("marker", 30*time.Second, "LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		return isTrue(v, v1alpha1.VirtualMachineInstanceIsMigratable)
	})

	vmim, _ := e.startMigration(v, "marker-1", nodeB)
	dst := nodeB.console(v)
	t.Cleanup(func() {
		if t.Failed() { // the whole guest side, for a guest that reset or lost the disk
			t.Logf("source console:\n%s\ntarget console:\n%s", con.Text(), dst.Text())
		}
	})
	e.waitMigrationSucceeded(vmim)
	got := e.waitVMI("marker", time.Minute, "Running on "+nodeB.node, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == nodeB.node && v.Status.Phase == v1alpha1.Running
	})
	// Read the disk, not the page cache that the migration carried along in the guest's memory.
	from := len(dst.Text())
	dst.Send(t, "sync; echo 3 > /proc/sys/vm/drop_caches; head -c 13 /dev/vda; echo; echo READ-$((1+1))")
	end := dst.Expect(t, from, "READ-2", 30*time.Second)
	if !strings.Contains(dst.Text()[from:end], "QVIRT-MARK-42") {
		t.Errorf("the guest lost its marker on the emptyDisk (node %s): %q", got.Status.NodeName, dst.Text()[from:end])
	}
	if strings.Contains(dst.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
}

// TestMigrationCancel deletes a migration while it runs (slowed to 1 MiB/s by a MigrationPolicy for
// the test's namespace, which the node agent gives the source launcher): the source's agent
// cancels it, the migration state says so, and the guest runs on at the source.
func TestMigrationCancel(t *testing.T) {
	e := newEnv(t)
	slow := &v1alpha1.MigrationPolicy{ObjectMeta: metav1.ObjectMeta{Name: e.ns + "-slow"},
		Spec: v1alpha1.MigrationPolicySpec{BandwidthPerMigration: ptr.To(resource.MustParse("1Mi")),
			Selectors: &v1alpha1.Selectors{NamespaceSelector: v1alpha1.LabelSelector{corev1.LabelMetadataName: e.ns}}}}
	if err := e.c.Create(context.Background(), slow); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), slow) })
	nodeB := e.addNode()
	v, _, con := e.startGuest("slow")
	con.Expect(t, 0, "tick 2\r\n", bootTimeout)

	vmim, _ := e.startMigration(v, "slow-1", nodeB)
	e.waitVMI("slow", time.Minute, "migrating", func(v *v1alpha1.VirtualMachineInstance) bool {
		ms := v.Status.MigrationState
		return ms != nil && ms.StartTimestamp != nil
	})
	if err := e.c.Delete(context.Background(), vmim); err != nil {
		t.Fatal(err)
	}
	got := e.waitVMI("slow", time.Minute, "migration failed", func(v *v1alpha1.VirtualMachineInstance) bool {
		ms := v.Status.MigrationState
		return ms != nil && ms.Failed
	})
	if ms := got.Status.MigrationState; !strings.Contains(ms.FailureReason, "cancel") || ms.Completed || ms.MigrationPolicyName != slow.Name {
		t.Errorf("migrationState %+v: want failed by cancellation, under policy %s", ms, slow.Name)
	}
	if got.Status.NodeName != e.node || got.Status.Phase != v1alpha1.Running {
		t.Errorf("after the cancelled migration: node %s phase %s, want Running on %s", got.Status.NodeName, got.Status.Phase, e.node)
	}
	last := con.LastTick()
	con.Expect(t, 0, fmt.Sprintf("tick %d\r\n", last+2), 30*time.Second)
	e.waitVMI("slow", time.Minute, "Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		return isTrue(v, v1alpha1.VirtualMachineInstanceReady) && condition(v, v1alpha1.VirtualMachineInstancePaused) == nil
	})
}

// startGuest creates the test guest's VMI, runs its launcher pod and waits until it is Running and
// Ready; the returned VMI is the Running one.
func (e *env) startGuest(name string) (*v1alpha1.VirtualMachineInstance, *pod, *testutil.Console) {
	e.t.Helper()
	v := e.guestVMI(name)
	e.create(v)
	p := e.kubelet.run(v, true)
	con := e.console(v)
	v = e.waitVMI(name, bootTimeout, "Running and Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady)
	})
	return v, p, con
}

// setConfig sets one key of qvirt-config until the test ends.
func (e *env) setConfig(key, value string) {
	e.t.Helper()
	ctx := context.Background()
	var cm corev1.ConfigMap
	if err := e.c.Get(ctx, client.ObjectKey{Namespace: "qvirt-system", Name: "qvirt-config"}, &cm); err != nil {
		e.t.Fatal(err)
	}
	old, had := cm.Data[key]
	cm.Data[key] = value
	if err := e.c.Update(ctx, &cm); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		if err := e.c.Get(ctx, client.ObjectKey{Namespace: "qvirt-system", Name: "qvirt-config"}, &cm); err != nil {
			e.t.Error(err)
			return
		}
		delete(cm.Data, key)
		if had {
			cm.Data[key] = old
		}
		if err := e.c.Update(ctx, &cm); err != nil {
			e.t.Error(err)
		}
	})
}

// TestDiskHotplug adds volumes to a running instance's spec, as `qvirtctl addvolume` does: the
// guest sees the new disk, one whose image is missing fails with a clear status and Event while
// everything else runs on, and removing them from the spec detaches them.
func TestDiskHotplug(t *testing.T) {
	e := newEnv(t)
	_, _, con := e.startGuest("hp")
	con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

	e.addDisk("hp", "scratch", v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("8Mi")}})
	e.waitVMI("hp", 30*time.Second, "volume scratch Ready", func(v *v1alpha1.VirtualMachineInstance) bool {
		vs := volumeStatus(v, "scratch")
		return vs != nil && vs.Phase == v1alpha1.VolumeReady && vs.Hotplugged && strings.HasPrefix(vs.Target, "hotplug")
	})
	e.waitEvent("hp", vmisync.EventVolumeAttached, "scratch", 10*time.Second)
	from := len(con.Text())
	// device_add returns before the guest's PCIe hotplug driver has enumerated the disk.
	con.Send(t, "for i in $(seq 20); do [ -e /sys/block/vda/serial ] && break; sleep 1; done; cat /sys/block/vda/serial; echo; echo DISKS-$((1+1))")
	con.Expect(t, from, "scratch", 30*time.Second)

	e.addDisk("hp", "missing", v1alpha1.VolumeSource{HostDisk: &v1alpha1.HostDisk{Path: "/nonexistent/qvirt/disk.img", Type: v1alpha1.HostDiskExists}})
	got := e.waitVMI("hp", 30*time.Second, "volume missing Failed", func(v *v1alpha1.VirtualMachineInstance) bool {
		vs := volumeStatus(v, "missing")
		return vs != nil && vs.Phase == v1alpha1.VolumeFailed
	})
	if vs := volumeStatus(got, "missing"); !strings.Contains(vs.Message, "/nonexistent/qvirt/disk.img") || vs.Reason != vmisync.ReasonHotplugFailed {
		t.Errorf("volume status %+v: want reason %s naming the missing image", vs, vmisync.ReasonHotplugFailed)
	}
	// The pod mounts no host disk directory (hostDisk is not enabled for the namespace): the
	// translation refuses the path before the launcher is asked.
	e.waitEvent("hp", vmisync.EventHotplugFailed, "spec.volumes[missing].hostDisk.path", 10*time.Second)
	if vs := volumeStatus(got, "scratch"); vs == nil || vs.Phase != v1alpha1.VolumeReady || got.Status.Phase != v1alpha1.Running ||
		!isTrue(got, v1alpha1.VirtualMachineInstanceReady) {
		t.Errorf("the failed hotplug disturbed the rest: phase %s, scratch %+v", got.Status.Phase, vs)
	}

	// Both go again: scratch is detached from the guest, missing's failure is dropped.
	cur := e.get("hp")
	base := cur.DeepCopy()
	cur.Spec.Volumes, cur.Spec.Domain.Devices.Disks = nil, nil
	if err := e.c.Patch(context.Background(), cur, client.MergeFrom(base)); err != nil {
		t.Fatalf("remove the volumes: %v", err)
	}
	e.waitVMI("hp", time.Minute, "no volumes", func(v *v1alpha1.VirtualMachineInstance) bool {
		return len(v.Status.VolumeStatus) == 0
	})
	e.waitEvent("hp", vmisync.EventVolumeDetached, "scratch", 10*time.Second)
	from = len(con.Text())
	con.Send(t, "ls /sys/block/; echo LISTED-$((2+3))")
	end := con.Expect(t, from, "LISTED-5", 20*time.Second)
	if strings.Contains(con.Text()[from:end], "vda") {
		t.Errorf("the guest still has vda after the unplug: %q", con.Text()[from:end])
	}
}

// addDisk adds a virtio disk with its volume to the VMI's spec, as `qvirtctl addvolume` does.
func (e *env) addDisk(vmi, name string, src v1alpha1.VolumeSource) {
	e.t.Helper()
	e.addDiskTarget(vmi, name, src, &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio})
}

// addDiskTarget hot-plugs src as a disk attached as target.
func (e *env) addDiskTarget(vmi, name string, src v1alpha1.VolumeSource, target *v1alpha1.DiskTarget) {
	e.t.Helper()
	cur := e.get(vmi)
	base := cur.DeepCopy()
	cur.Spec.Volumes = append(cur.Spec.Volumes, v1alpha1.Volume{Name: name, VolumeSource: src})
	cur.Spec.Domain.Devices.Disks = append(cur.Spec.Domain.Devices.Disks,
		v1alpha1.Disk{Name: name, Serial: name, Disk: target})
	if err := e.c.Patch(context.Background(), cur, client.MergeFrom(base)); err != nil {
		e.t.Fatalf("add volume %s to %s: %v", name, vmi, err)
	}
}

func volumeStatus(v *v1alpha1.VirtualMachineInstance, name string) *v1alpha1.VolumeStatus {
	for i := range v.Status.VolumeStatus {
		if v.Status.VolumeStatus[i].Name == name {
			return &v.Status.VolumeStatus[i]
		}
	}
	return nil
}

// TestNICHotplug adds the pod network's interface to a running instance that had none: the node
// agent sets up the masquerade binding in the launcher pod, the guest gets its address over DHCP
// and serves HTTP at the pod's address; a live migration takes the NIC along to the target pod;
// removing the interface there detaches it and leaves the pod's network as it was.
func TestNICHotplug(t *testing.T) {
	e := newEnv(t)
	v := e.guestVMI("nic")
	v.Spec.Domain.Devices.Interfaces, v.Spec.Networks = nil, nil
	e.create(v)
	p := e.kubelet.run(v, true)
	con := e.console(v)
	e.waitVMI("nic", bootTimeout, "Running", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && isTrue(v, v1alpha1.VirtualMachineInstanceReady)
	})
	con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

	cur := e.get("nic")
	base := cur.DeepCopy()
	cur.Spec.Domain.Devices.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{}}}
	cur.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	if err := e.c.Patch(context.Background(), cur, client.MergeFrom(base)); err != nil {
		t.Fatalf("add the interface: %v", err)
	}
	got := e.waitVMI("nic", 30*time.Second, "interface default hot-plugged", func(v *v1alpha1.VirtualMachineInstance) bool {
		return len(v.Status.Interfaces) == 1 && v.Status.Interfaces[0].Hotplugged
	})
	if in := got.Status.Interfaces[0]; in.IP != p.net.PodIP.String() {
		t.Errorf("interface %+v, want the pod's address %s", in, p.net.PodIP)
	}
	e.waitEvent("nic", vmisync.EventInterfaceAttached, "default", 10*time.Second)
	// The guest runs udhcpc at boot only: start it on the new NIC, as a user would.
	from := len(con.Text())
	con.Send(t, "for i in $(seq 30); do [ -e /sys/class/net/eth0 ] && break; sleep 1; done; ip link set eth0 up; udhcpc -f -q -n -i eth0 -s /etc/udhcpc.script -T 2 -t 15 >/dev/null 2>&1; echo DHCP-DONE-$?")
	con.Expect(t, from, "QVIRT-IP eth0 10.0.2.2", time.Minute)
	waitHTTP(t, p.net.PodIP.String(), "the guest's httpd at the pod's address")

	// A live migration takes the hot-plugged NIC along, on the same root port, wired to the target
	// pod's network: the guest keeps its address and serves at the target pod's.
	port := got.Status.Interfaces[0].RootPort
	if port == "" {
		t.Fatalf("interface %+v: no root port in the status", got.Status.Interfaces[0])
	}
	nodeB := e.addNode()
	vmim, target := e.startMigration(e.get("nic"), "nic-1", nodeB)
	e.waitMigrationSucceeded(vmim)
	e.waitVMI("nic", 30*time.Second, "on "+nodeB.node+" with the hot-plugged interface", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == nodeB.node && len(v.Status.Interfaces) == 1 && v.Status.Interfaces[0].Hotplugged &&
			v.Status.Interfaces[0].RootPort == port && v.Status.Interfaces[0].IP == target.net.PodIP.String()
	})
	waitHTTP(t, target.net.PodIP.String(), "the guest's httpd at the target pod's address")
	p = target

	cur = e.get("nic")
	base = cur.DeepCopy()
	cur.Spec.Domain.Devices.Interfaces, cur.Spec.Networks = nil, nil
	if err := e.c.Patch(context.Background(), cur, client.MergeFrom(base)); err != nil {
		t.Fatalf("remove the interface: %v", err)
	}
	e.waitVMI("nic", time.Minute, "no interfaces", func(v *v1alpha1.VirtualMachineInstance) bool {
		return len(v.Status.Interfaces) == 0
	})
	e.waitEvent("nic", vmisync.EventInterfaceDetached, "default", 10*time.Second)
	// The pod's namespace holds only its own links again.
	out, err := exec.Command("ip", "-n", p.net.Name, "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"qvtap0", "qvbr0"} {
		if strings.Contains(string(out), l) {
			t.Errorf("%s left in the pod after the unplug:\n%s", l, out)
		}
	}
}

// TestCPUHotplug raises a running instance's sockets within its maxSockets, as a KubeVirt user
// does: the node agent plugs the vCPUs (an Event says so), the status shows the new topology, the
// guest onlines the vCPU and counts two; a live migration's target starts with both and the guest
// keeps them.
func TestCPUHotplug(t *testing.T) {
	e := newEnv(t)
	v := e.guestVMI("cpus")
	v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 1, Threads: 1, MaxSockets: 2}
	e.create(v)
	e.kubelet.run(v, true)
	con := e.console(v)
	e.waitVMI("cpus", bootTimeout, "Running with one socket", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && v.Status.CurrentCPUTopology != nil && v.Status.CurrentCPUTopology.Sockets == 1
	})
	con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)

	cur := e.get("cpus")
	base := cur.DeepCopy()
	cur.Spec.Domain.CPU.Sockets = 2
	if err := e.c.Patch(context.Background(), cur, client.MergeFrom(base)); err != nil {
		t.Fatalf("raise the sockets: %v", err)
	}
	e.waitVMI("cpus", 30*time.Second, "two sockets", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.CurrentCPUTopology != nil && v.Status.CurrentCPUTopology.Sockets == 2
	})
	e.waitEvent("cpus", vmisync.EventVCPUsAttached, "2 sockets", 10*time.Second)
	from := len(con.Text())
	con.Send(t, `for i in $(seq 30); do [ -e /sys/devices/system/cpu/cpu1/online ] && break; sleep 1; done; `+
		`echo 1 > /sys/devices/system/cpu/cpu1/online; echo "PLUGGED-$(grep -c ^processor /proc/cpuinfo)-END"`)
	con.Expect(t, from, "PLUGGED-2-END", time.Minute)

	nodeB := e.addNode()
	vmim, _ := e.startMigration(e.get("cpus"), "cpus-1", nodeB)
	e.waitMigrationSucceeded(vmim)
	e.waitVMI("cpus", 30*time.Second, "on "+nodeB.node+" with two sockets", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName == nodeB.node && v.Status.CurrentCPUTopology != nil && v.Status.CurrentCPUTopology.Sockets == 2
	})
	dst := nodeB.console(v)
	from = len(dst.Text())
	dst.Send(t, `echo "MIGRATED-$(grep -c ^processor /proc/cpuinfo)-END"`)
	dst.Expect(t, from, "MIGRATED-2-END", time.Minute)
}

// startMigration creates migration name for v and runs its target pod on node n.
func (e *env) startMigration(v *v1alpha1.VirtualMachineInstance, name string, n *nodeAgent) (*v1alpha1.VirtualMachineInstanceMigration, *pod) {
	e.t.Helper()
	vmim := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: v.Name}}
	if err := e.c.Create(context.Background(), vmim); err != nil {
		e.t.Fatal(err)
	}
	return vmim, n.kubelet.runTarget(v, string(vmim.UID))
}

// waitMigrationSucceeded waits up to 2 minutes for vmim to succeed.
func (e *env) waitMigrationSucceeded(vmim *v1alpha1.VirtualMachineInstanceMigration) {
	e.t.Helper()
	testutil.Eventually(e.t, 2*time.Minute, "migration "+vmim.Name+" Succeeded", func() bool {
		_ = e.c.Get(context.Background(), client.ObjectKeyFromObject(vmim), vmim)
		return vmim.Status.Phase == v1alpha1.MigrationSucceeded
	}, func() string {
		return fmt.Sprintf("migration status %+v\nVMI status %+v", vmim.Status, e.get(vmim.Spec.VMIName).Status)
	})
}

// waitHTTP waits up to 30 s for the guest's httpd to answer 200 at ip.
func waitHTTP(t *testing.T, ip, what string) {
	t.Helper()
	hc := http.Client{Timeout: 5 * time.Second}
	testutil.Eventually(t, 30*time.Second, what, func() bool {
		resp, err := hc.Get("http://" + ip + "/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// migrationMessage is the messages of vmim's conditions, which say why it failed.
func migrationMessage(vmim *v1alpha1.VirtualMachineInstanceMigration) string {
	var msgs []string
	for _, c := range vmim.Status.Conditions {
		msgs = append(msgs, c.Message)
	}
	return strings.Join(msgs, "; ")
}

// TestHypervLeftOutUnderEmulation: a Windows manifest's Hyper-V enlightenments on a node that runs
// guests under emulation (every node here) are left out (hv-vpindex alone would stop QEMU), the
// guest runs, and the instance carries a warning event saying what was left out and why.
func TestHypervLeftOutUnderEmulation(t *testing.T) {
	e := newEnv(t)
	v := e.guestVMI("hyperv")
	v.Spec.Domain.Features = &v1alpha1.Features{Hyperv: &v1alpha1.FeatureHyperv{Relaxed: &v1alpha1.FeatureState{},
		VAPIC: &v1alpha1.FeatureState{}, VPIndex: &v1alpha1.FeatureState{}, SyNIC: &v1alpha1.FeatureState{}}}
	e.create(v)
	e.kubelet.run(v, true)
	e.waitVMI("hyperv", bootTimeout, "Running", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running
	})
	e.waitEvent("hyperv", vmisync.EventFeaturesLeftOut, "under emulation", 10*time.Second)
}

// TestRealtimeVCPUs: KubeVirt's real-time guest (dedicated CPUs, the guest NUMA mapping, huge
// pages) with vCPU 0 of two real-time. While the kubelet's CPU manager checkpoint gives the launcher
// pod's compute container no CPUs of its own, the node agent makes no thread real-time and says
// why in an Event; once it gives it the CPUs the launcher pinned the vCPUs to, the agent makes vCPU
// 0's thread in the launcher's QEMU SCHED_FIFO at priority 1 and leaves vCPU 1's alone.
func TestRealtimeVCPUs(t *testing.T) {
	e := newEnv(t)
	v := e.guestVMI("rt")
	v.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 1, Threads: 1, DedicatedCPUPlacement: true,
		NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}, Realtime: &v1alpha1.Realtime{Mask: "0-1,^1"}}
	v.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
	testutil.ReserveHugepages(t, int(v1alpha1.GuestMemoryMiB(&v.Spec.Domain)/2))
	e.create(v)
	e.kubelet.run(v, true)
	e.waitVMI("rt", bootTimeout, "Running", func(v *v1alpha1.VirtualMachineInstance) bool { return v.Status.Phase == v1alpha1.Running })
	var pods corev1.PodList
	if err := e.c.List(context.Background(), &pods, client.InNamespace(e.ns), client.MatchingLabels{v1alpha1.VMINameLabel: "rt"}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("the launcher pods: %v %d", err, len(pods.Items))
	}
	checkpoint := func(entries string) {
		data := `{"policyName":"static","defaultCpuSet":"","entries":{` + entries + `},"checksum":1}`
		if err := os.WriteFile(e.nodeAgent.cpuState, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint(`"some-other-pod":{"compute":"0-1"}`)
	e.waitEvent("rt", vmisync.EventRealtimeFailed, "gave container compute of pod "+string(pods.Items[0].UID)+" no CPUs of its own", time.Minute)
	qemu := qemuPIDOf(t, e.get("rt"))
	sched := func() map[string]string {
		threads, err := testutil.Threads(qemu)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, th := range threads {
			if strings.HasPrefix(th.Name, "CPU ") {
				tid, _ := strconv.Atoi(th.TID)
				a, err := unix.SchedGetAttr(tid, 0)
				if err != nil {
					t.Fatal(err)
				}
				got[th.Name] = fmt.Sprintf("policy %d priority %d", a.Policy, a.Priority)
			}
		}
		return got
	}
	normal := map[string]string{"CPU 0/TCG": "policy 0 priority 0", "CPU 1/TCG": "policy 0 priority 0"}
	if got := sched(); !maps.Equal(got, normal) {
		t.Fatalf("vCPU threads %v without CPUs of the pod's own, want %v", got, normal)
	}

	checkpoint(`"` + string(pods.Items[0].UID) + `":{"compute":"0-1"}`)
	e.waitEvent("rt", vmisync.EventRealtimeVCPUs, "vCPUs [0] run SCHED_FIFO at priority 1", time.Minute)
	want := map[string]string{"CPU 0/TCG": "policy 1 priority 1", "CPU 1/TCG": "policy 0 priority 0"}
	if got := sched(); !maps.Equal(got, want) {
		t.Fatalf("vCPU threads %v, want %v (SCHED_FIFO is policy 1)", got, want)
	}
}

// TestMemoryHotplug: an instance with memory.maxGuest boots with its memory.guest; raising
// memory.guest on the running instance (a patch, as the VM controller's LiveUpdate makes) has the
// node agent ask its launcher for the memory: the guest plugs it and counts 512 MiB more,
// status.memory says what it booted with, was asked for and has, and an Event says it.
func TestMemoryHotplug(t *testing.T) {
	e := newEnv(t)
	v := e.guestVMI("mem")
	one, two := resource.MustParse("1Gi"), resource.MustParse("2Gi")
	v.Spec.Domain.Memory.Guest, v.Spec.Domain.Memory.MaxGuest = &one, &two
	e.create(v)
	e.kubelet.run(v, true)
	con := e.console(v)
	e.waitVMI("mem", bootTimeout, "Running with 1Gi", func(v *v1alpha1.VirtualMachineInstance) bool {
		m := v.Status.Memory
		return v.Status.Phase == v1alpha1.Running && m != nil && m.GuestAtBoot.Equal(one) && m.GuestCurrent.Equal(one) && m.GuestRequested.Equal(one)
	})
	con.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	before := con.Number(t, `echo online > /sys/devices/system/memory/auto_online_blocks; modprobe virtio_mem; `+
		`echo "BEFORE-$(awk '/^MemTotal/ {print $2}' /proc/meminfo)-E""ND"`, "BEFORE")

	cur := e.get("mem")
	base := cur.DeepCopy()
	more := resource.MustParse("1536Mi")
	cur.Spec.Domain.Memory.Guest = &more
	if err := e.c.Patch(context.Background(), cur, client.MergeFrom(base)); err != nil {
		t.Fatalf("raise the guest memory: %v", err)
	}
	e.waitVMI("mem", time.Minute, "1536Mi plugged", func(v *v1alpha1.VirtualMachineInstance) bool {
		m := v.Status.Memory
		return m != nil && m.GuestCurrent.Equal(more) && m.GuestRequested.Equal(more) && m.GuestAtBoot.Equal(one)
	})
	e.waitEvent("mem", vmisync.EventMemoryPlugged, "1536 MiB", 10*time.Second)
	if after := con.Number(t, `echo "AFTER-$(awk '/^MemTotal/ {print $2}' /proc/meminfo)-E""ND"`, "AFTER"); after-before != 512<<10 {
		t.Errorf("the guest's MemTotal went from %d to %d KiB, want 512 MiB more", before, after)
	}
}

// qemuPIDOf is the QEMU process running v (its command line names the instance's UID).
func qemuPIDOf(t *testing.T, v *v1alpha1.VirtualMachineInstance) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		cmdline, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(cmdline), "qemu-system") && strings.Contains(string(cmdline), string(v.UID)) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	t.Fatalf("no QEMU runs VMI %s", v.Name)
	return 0
}
