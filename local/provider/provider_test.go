package provider_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/vishvananda/netlink"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/podnet"
	"github.com/qvirt/qvirt/test/testutil"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

const (
	busyboxImage = "qvirt.test/busybox:1"
	// wwwDir is where the server pod mounts its emptyDir; the provider creates the mount point on
	// the host, the test removes it.
	wwwDir = "/run/qvirt-provider-test/www"
)

// node is one running virtual node.
type node struct {
	name, stateDir, bridge, cidr string
	cancel                       context.CancelFunc
	done                         chan error
}

// hostState is what the provider may change on the host.
type hostState struct {
	links     []string
	ipForward string
}

func readHostState(t *testing.T) hostState {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name+"/"+l.Type())
	}
	slices.Sort(names)
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	return hostState{links: names, ipForward: strings.TrimSpace(string(fwd))}
}

// podInit builds qvirt-pod-init into the test's temporary directory (go's build cache makes all but
// the first build quick).
func podInit(t *testing.T) (string, error) {
	out := filepath.Join(t.TempDir(), "qvirt-pod-init")
	build := exec.Command("go", "build", "-o", out, "./cmd/qvirt-pod-init")
	build.Dir = envtest.RepoRoot()
	if b, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build qvirt-pod-init: %w\n%s", err, b)
	}
	return out, nil
}

func startNode(t *testing.T, ctx context.Context, name, cidr, bridge, binDir string, log logr.Logger, mods ...func(*provider.Options)) *node {
	t.Helper()
	initBin, err := podInit(t)
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	n := &node{name: name, stateDir: filepath.Join(state, name), bridge: bridge, cidr: cidr, done: make(chan error, 1)}
	// A stopped node's Node stays Ready here (no node lifecycle controller): remove it, or a later
	// test's scheduler may place pods on it.
	t.Cleanup(func() {
		_ = kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	ctx, n.cancel = context.WithCancel(ctx)
	opts := provider.Options{
		NodeName:  name,
		Config:    cp.Config,
		StateDir:  n.stateDir,
		Images:    map[string]string{busyboxImage: "/bin/busybox"},
		PodCIDR:   cidr,
		Bridge:    bridge,
		CNIBinDir: binDir,
		Log:       log,
		// As the local cluster hides its state directory.
		InitBinary:  initBin,
		HiddenPaths: []string{state},
	}
	for _, m := range mods {
		m(&opts)
	}
	go func() { n.done <- provider.Run(ctx, opts) }()
	return n
}

func (n *node) stop(t *testing.T) {
	t.Helper()
	n.cancel()
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("node %s: Run: %v", n.name, err)
		}
	case <-time.After(60 * time.Second):
		t.Errorf("node %s: Run did not return 60 s after its context ended", n.name)
	}
}

func fileLogger(t *testing.T) (logr.Logger, func()) {
	path := filepath.Join(t.TempDir(), "provider.log")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	log := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(f, prefix, args)
	}, funcr.Options{Verbosity: 1})
	return log, func() {
		if t.Failed() {
			b, _ := os.ReadFile(path)
			t.Logf("provider log:\n%s", tail(b, 20000))
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func TestVirtualNodes(t *testing.T) {
	testutil.LockHostNetwork(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	binDir, err := provider.BuildCNIPlugins(ctx, filepath.Join(cacheHome(t), "qvirt", "cni"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(wwwDir)) })
	client := kubernetes.NewForConfigOrDie(cp.Config)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vnode-"}}
	if ns, err = client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	before := readHostState(t)
	log, dumpLog := fileLogger(t)
	defer dumpLog()
	n1 := startNode(t, ctx, "vnode-1", "10.231.1.0/24", "qvt-test-n1", binDir, log)
	n2 := startNode(t, ctx, "vnode-2", "10.231.2.0/24", "qvt-test-n2", binDir, log)
	stopped := false
	defer func() {
		if !stopped {
			n1.stop(t)
			n2.stop(t)
		}
	}()
	tc := &testCluster{t: t, ctx: ctx, client: client, ns: ns.Name}

	t.Run("nodes register Ready with an InternalIP and qvirt's device resources", func(t *testing.T) {
		for _, n := range []*node{n1, n2} {
			tc.t = t
			no := tc.waitNode(n.name)
			want := strings.TrimSuffix(n.cidr, "0/24") + "1"
			if len(no.Status.Addresses) != 1 || no.Status.Addresses[0].Type != corev1.NodeInternalIP || no.Status.Addresses[0].Address != want {
				t.Errorf("node %s addresses = %v, want one InternalIP %s", n.name, no.Status.Addresses, want)
			}
			if q := no.Status.Allocatable[provider.ResourceKVM]; q.Value() < 1 {
				t.Errorf("node %s allocatable %s = %s", n.name, provider.ResourceKVM, q.String())
			}
			if no.Labels[corev1.LabelHostname] != n.name {
				t.Errorf("node %s hostname label = %q", n.name, no.Labels[corev1.LabelHostname])
			}
		}
	})

	var serverIP string
	var pids []int
	t.Run("a pod on each node runs with its IP; the node 1 pod reaches the node 2 pod over the bridges", func(t *testing.T) {
		tc.t = t
		server := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "server"},
			Spec: corev1.PodSpec{
				NodeName: n2.name,
				Containers: []corev1.Container{{
					Name: "httpd", Image: busyboxImage,
					Command: []string{"sh", "-c", `printf '%s %s %s' "$MY_IP" "$NODE" "$ME" > ` + wwwDir + `/index.html && exec httpd -f -p 8080 -h ` + wwwDir},
					Env: []corev1.EnvVar{
						{Name: "MY_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
						{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
						{Name: "ME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					},
					VolumeMounts: []corev1.VolumeMount{{Name: "www", MountPath: wwwDir}},
				}},
				Volumes: []corev1.Volume{{Name: "www", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			},
		})
		created := time.Now()
		server = tc.waitPhase(server.Name, corev1.PodRunning)
		t.Logf("server pod: create → Running in %s", time.Since(created).Round(time.Millisecond))
		serverIP = server.Status.PodIP
		if !strings.HasPrefix(serverIP, "10.231.2.") {
			t.Fatalf("server pod IP = %q, want one in node 2's 10.231.2.0/24", serverIP)
		}
		pids = append(pids, pidOf(t, server))

		want := serverIP + " " + n2.name + " server"
		// From the host.
		body := tc.httpGet("http://" + serverIP + ":8080/")
		if body != want {
			t.Errorf("host GET server pod = %q, want %q (env from status.podIP, spec.nodeName, metadata.name)", body, want)
		}
		// From a pod on node 1, through both bridges; the client writes the page as its
		// termination message.
		client := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "client"},
			Spec: corev1.PodSpec{
				NodeName:      n1.name,
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "wget", Image: busyboxImage,
					Command: []string{"sh", "-c", "for i in $(seq 50); do wget -q -O /dev/termination-log http://$(PEER):8080/ && exit 0; sleep 0.2; done; exit 1"},
					Env:     []corev1.EnvVar{{Name: "PEER", Value: serverIP}},
				}},
			},
		})
		client = tc.waitPhase(client.Name, corev1.PodSucceeded)
		if !strings.HasPrefix(client.Status.PodIP, "10.231.1.") {
			t.Errorf("client pod IP = %q, want one in node 1's 10.231.1.0/24", client.Status.PodIP)
		}
		term := client.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 0 || term.Message != want {
			t.Errorf("client container state = %+v, want exit 0 with message %q", client.Status.ContainerStatuses[0].State, want)
		}
	})

	t.Run("deleting a running pod terminates its process and removes the pod", func(t *testing.T) {
		tc.t = t
		sleeper := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "sleeper"},
			Spec: corev1.PodSpec{NodeName: n1.name, Containers: []corev1.Container{{
				// PID 1 of its namespace: a signal without a handler does not reach it, as in any container.
				Name: "sleep", Image: busyboxImage, Command: []string{"sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](65534)}}}},
		})
		created := time.Now()
		sleeper = tc.waitPhase(sleeper.Name, corev1.PodRunning)
		t.Logf("sleeper pod: create → Running in %s", time.Since(created).Round(time.Millisecond))
		pid := pidOf(t, sleeper)
		pids = append(pids, pid)
		if uid := processUIDAfterInit(t, pid); uid != "65534" {
			t.Errorf("process runs as uid %s, want runAsUser 65534", uid)
		}
		deleted := time.Now()
		if err := client.CoreV1().Pods(tc.ns).Delete(ctx, sleeper.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		tc.waitGone(sleeper.Name)
		t.Logf("sleeper pod: delete (grace 30 s) → gone in %s", time.Since(deleted).Round(time.Millisecond))
		if processAlive(pid) {
			t.Errorf("process %d of the deleted pod still runs", pid)
		}
	})

	t.Run("a pod sees only its own processes and volumes, not another pod's on the same node", func(t *testing.T) {
		tc.t = t
		victim := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "victim"},
			Spec: corev1.PodSpec{NodeName: n1.name, Containers: []corev1.Container{{
				Name: "main", Image: busyboxImage, Command: []string{"sh", "-c", "echo secret > /data/secret && exec sleep 3600"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](107)},
				VolumeMounts:    []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}},
		})
		victim = tc.waitPhase(victim.Name, corev1.PodRunning)
		vpid := pidOf(t, victim)
		pids = append(pids, vpid)
		secret := filepath.Join(provider.EmptyDirPath(n1.stateDir, victim.UID, "data"), "secret")
		waitFile(t, secret)
		// The attacker runs as the same user on the same node, and knows the victim's host PID and
		// where its volume lies on the host. Each probe prints one word.
		probe := strings.Join([]string{
			`echo pid=$$$$`, // $$ is the API's escape for $
			`[ -e /proc/$VPID ] && echo sees-victim || echo no-victim-pid`,
			`cat $SECRET 2>/dev/null || echo no-secret`,
			`ls -A $STATE | wc -l | sed 's/^/state-entries=/'`,
			`kill -0 $VPID 2>/dev/null && echo signalled || echo no-signal`,
			`cat /proc/$VPID/root$SECRET 2>/dev/null || echo no-proc-root`,
		}, "; ")
		attacker := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "attacker"},
			Spec: corev1.PodSpec{NodeName: n1.name, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "main", Image: busyboxImage, Command: []string{"sh", "-c", "(" + probe + ") > /dev/termination-log"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](107)},
				Env: []corev1.EnvVar{{Name: "SECRET", Value: secret}, {Name: "STATE", Value: n1.stateDir},
					{Name: "VPID", Value: strconv.Itoa(vpid)}}}}},
		})
		attacker = tc.waitPhase(attacker.Name, corev1.PodSucceeded)
		got := strings.Fields(attacker.Status.ContainerStatuses[0].State.Terminated.Message)
		want := []string{"pid=1", "no-victim-pid", "no-secret", "state-entries=0", "no-signal", "no-proc-root"}
		if !slices.Equal(got, want) {
			t.Errorf("what the attacker pod saw = %q, want %q", got, want)
		}
		if data, err := os.ReadFile(secret); err != nil || string(data) != "secret\n" {
			t.Errorf("victim's volume on the host = %q, %v", data, err)
		}
	})

	t.Run("a Secret volume waits for its Secret (FailedMount), then holds its keys read-only", func(t *testing.T) {
		tc.t = t
		reader := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "secret-reader"},
			Spec: corev1.PodSpec{NodeName: n1.name, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "main", Image: busyboxImage,
				Command: []string{"sh", "-c", "cat /secret/userdata > /dev/termination-log; touch /secret/x 2>/dev/null && echo WRITABLE >> /dev/termination-log; exit 0"},
				// The launcher's user: the kubelet's files are root's, mode 0644.
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](107)},
				VolumeMounts:    []corev1.VolumeMount{{Name: "ud", MountPath: "/secret", ReadOnly: true}}}},
				Volumes: []corev1.Volume{{Name: "ud", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "cloud-user"}}}}},
		})
		tc.waitEvent(reader, corev1.EventTypeWarning, "FailedMount", `secret "cloud-user" not found`)
		tc.waitFor(reader.Name, "Pending in ContainerCreating", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return p.Status.Phase == corev1.PodPending && len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ContainerCreating"
		})
		time.Sleep(2 * time.Second) // a few retries later, still waiting
		if p, err := client.CoreV1().Pods(tc.ns).Get(ctx, reader.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
			t.Fatalf("without its Secret the pod is %+v (%v); want it Pending", p.Status, err)
		}
		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "cloud-user"}, StringData: map[string]string{"userdata": "#cloud-config\nuser: qvirt\n"}}
		if _, err := client.CoreV1().Secrets(tc.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		reader = tc.waitPhase(reader.Name, corev1.PodSucceeded)
		if term := reader.Status.ContainerStatuses[0].State.Terminated; term == nil || term.Message != "#cloud-config\nuser: qvirt\n" {
			t.Errorf("container state %+v: want the Secret's userdata read back, and the volume not writable", reader.Status.ContainerStatuses[0].State)
		}
	})

	t.Run("a claim not yet Bound keeps the pod in ContainerCreating (FailedMount) until it is, then mounts its volume", func(t *testing.T) {
		// The scheduler places a pod once its claim names a volume; the claim's status says Bound
		// a moment later. A kubelet waits for that; it does not fail the pod.
		tc.t = t
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "hello"), []byte("from the volume"), 0o644); err != nil {
			t.Fatal(err)
		}
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: tc.ns + "-late"}, Spec: corev1.PersistentVolumeSpec{
			Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}}}
		if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
		})
		pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "late"}, Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
		pvc, err := client.CoreV1().PersistentVolumeClaims(tc.ns).Create(ctx, pvc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		reader := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "claim-reader"},
			Spec: corev1.PodSpec{NodeName: n1.name, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "main", Image: busyboxImage, Command: []string{"sh", "-c", "cat /data/hello > /dev/termination-log"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name}}}}},
		})
		tc.waitFor(reader.Name, "Pending in ContainerCreating", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return p.Status.Phase == corev1.PodPending && len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ContainerCreating"
		})
		tc.waitEvent(reader, corev1.EventTypeWarning, "FailedMount", "claim late is Pending, not Bound")
		// Bound as the PV controller binds: the claim names its volume first, its status follows.
		pvc.Spec.VolumeName = pv.Name
		if pvc, err = client.CoreV1().PersistentVolumeClaims(tc.ns).Update(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // a few retries later, still waiting
		if p, err := client.CoreV1().Pods(tc.ns).Get(ctx, reader.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending {
			t.Fatalf("with its claim naming a volume but not Bound, the pod is %+v (%v); want it Pending", p.Status, err)
		}
		pvc.Status.Phase = corev1.ClaimBound
		if _, err = client.CoreV1().PersistentVolumeClaims(tc.ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		reader = tc.waitPhase(reader.Name, corev1.PodSucceeded)
		if term := reader.Status.ContainerStatuses[0].State.Terminated; term == nil || term.Message != "from the volume" {
			t.Errorf("container state %+v: want the volume's file read back", reader.Status.ContainerStatuses[0].State)
		}
	})

	t.Run("configMap, downwardAPI and projected service account volumes hold their files, as a kubelet writes them", func(t *testing.T) {
		tc.t = t
		for _, cm := range []*corev1.ConfigMap{
			{ObjectMeta: metav1.ObjectMeta{Name: "app-cm"}, Data: map[string]string{"greeting": "hello"}, BinaryData: map[string][]byte{"blob": {0, 1, 2}}},
			// kube-controller-manager publishes it in every namespace; the test's control plane runs none.
			{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt"}, Data: map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\ntest\n"}},
		} {
			if _, err := client.CoreV1().ConfigMaps(tc.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := client.CoreV1().ServiceAccounts(tc.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "vm-sa"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		reader := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "config-reader", Labels: map[string]string{"app": "web", "tier": "front"}},
			Spec: corev1.PodSpec{NodeName: n1.name, RestartPolicy: corev1.RestartPolicyNever, ServiceAccountName: "vm-sa",
				AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{
					Name: "main", Image: busyboxImage,
					Command: []string{"sh", "-c", `{ echo "greeting=$(cat /cm/greeting) blob=$(od -An -tx1 /cm/blob | tr -d ' \n')"; cat /pod/labels; echo; echo "name=$(cat /pod/name)"; ` +
						`echo "ns=$(cat /sa/namespace)"; cat /sa/ca.crt; cat /sa/token; } > /dev/termination-log; ` +
						`touch /cm/x /pod/x /sa/x 2>/dev/null && echo WRITABLE >> /dev/termination-log; exit 0`},
					SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](107)},
					VolumeMounts: []corev1.VolumeMount{{Name: "cm", MountPath: "/cm", ReadOnly: true}, {Name: "pod", MountPath: "/pod", ReadOnly: true},
						{Name: "sa", MountPath: "/sa", ReadOnly: true}}}},
				Volumes: []corev1.Volume{
					{Name: "cm", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "app-cm"}}}},
					{Name: "pod", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
						{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
						{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}}},
					{Name: "sa", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
						{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To[int64](3607)}},
						{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
							Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
						{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace",
							FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}}}}}},
				}},
		})
		reader = tc.waitPhase(reader.Name, corev1.PodSucceeded)
		term := reader.Status.ContainerStatuses[0].State.Terminated
		if term == nil {
			t.Fatalf("container state %+v", reader.Status.ContainerStatuses[0].State)
		}
		want := "greeting=hello blob=000102\napp=\"web\"\ntier=\"front\"\nname=config-reader\nns=" + tc.ns + "\n-----BEGIN CERTIFICATE-----\ntest\n"
		token, ok := strings.CutPrefix(term.Message, want)
		if !ok || strings.Contains(term.Message, "WRITABLE") {
			t.Fatalf("the pod read %q; want it to start with %q, and the volumes not writable", term.Message, want)
		}
		// The token is the service account's, bound to the pod: kube-apiserver authenticates it.
		review, err := client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if st := review.Status; !st.Authenticated || st.User.Username != "system:serviceaccount:"+tc.ns+":vm-sa" || !slices.Contains(st.User.Extra["authentication.kubernetes.io/pod-name"], "config-reader") {
			t.Errorf("token review %+v: want the pod's token of vm-sa", st)
		}
	})

	t.Run("a process exiting 3 makes a Never pod Failed with exit code 3 and its termination message", func(t *testing.T) {
		tc.t = t
		pod := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "exit3"},
			Spec: corev1.PodSpec{NodeName: n2.name, RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "main", Image: busyboxImage, Command: []string{"sh", "-c", "echo to-stdout; echo to-stderr >&2; echo bye > /dev/termination-log; exit 3"}}}},
		})
		pod = tc.waitPhase(pod.Name, corev1.PodFailed)
		logs, err := os.ReadFile(provider.LogPath(n2.stateDir, pod.Namespace, pod.Name, pod.UID, "main"))
		if err != nil || string(logs) != "to-stdout\nto-stderr\n" {
			t.Errorf("container log = %q (%v), want stdout and stderr", logs, err)
		}
		term := pod.Status.ContainerStatuses[0].State.Terminated
		if term == nil || term.ExitCode != 3 || term.Message != "bye\n" || term.Reason != "Error" {
			t.Errorf("container state = %+v, want terminated with exit code 3, reason Error, message \"bye\\n\"", pod.Status.ContainerStatuses[0].State)
		}
	})

	t.Run("restartPolicy Always restarts a failing container and counts restarts", func(t *testing.T) {
		tc.t = t
		pod := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "crasher"},
			Spec: corev1.PodSpec{NodeName: n1.name, Containers: []corev1.Container{{
				Name: "main", Image: busyboxImage, Command: []string{"sh", "-c", "sleep 0.3; exit 7"}}}},
		})
		pod = tc.waitFor(pod.Name, "restartCount ≥ 2", func(p *corev1.Pod) bool {
			return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 2
		})
		cs := pod.Status.ContainerStatuses[0]
		if pod.Status.Phase != corev1.PodRunning {
			t.Errorf("phase = %s, want Running while restarting", pod.Status.Phase)
		}
		if last := cs.LastTerminationState.Terminated; last == nil || last.ExitCode != 7 {
			t.Errorf("lastState = %+v, want terminated with exit code 7", cs.LastTerminationState)
		}
	})

	t.Run("kube-scheduler places a pod requesting qvirt's device resources on a virtual node", func(t *testing.T) {
		tc.t = t
		sched := startScheduler(t)
		defer sched()
		one := resource.MustParse("1")
		pod := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "scheduled"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "sleep", Image: busyboxImage, Command: []string{"sleep", "3600"},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{provider.ResourceKVM: one, provider.ResourceTun: one},
					Limits:   corev1.ResourceList{provider.ResourceKVM: one, provider.ResourceTun: one},
				},
			}}},
		})
		created := time.Now()
		pod = tc.waitPhase(pod.Name, corev1.PodRunning)
		t.Logf("scheduled pod: create → Running on %s in %s", pod.Spec.NodeName, time.Since(created).Round(time.Millisecond))
		pids = append(pids, pidOf(t, pod))
	})

	var nodeGroups []string
	t.Run("a pod's processes share a CPU cgroup weighted by its requests, under the node's weighted by its CPUs", func(t *testing.T) {
		tc.t = t
		pod := tc.create(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "cpu-weighted"},
			Spec: corev1.PodSpec{
				NodeName: n1.name,
				Containers: []corev1.Container{
					{Name: "a", Image: busyboxImage, Command: []string{"sh", "-c", "sleep 3600 & wait"},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}}},
					{Name: "b", Image: busyboxImage, Command: []string{"sleep", "3600"},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}},
				},
			},
		})
		pod = tc.waitPhase(pod.Name, corev1.PodRunning)
		pid := pidOf(t, pod)
		group := cpuCgroup(t, pid)
		if filepath.Base(group) != "pod"+string(pod.UID) {
			t.Fatalf("container process %d is in cpu cgroup %s, want the pod's (pod%s)", pid, group, pod.UID)
		}
		// What the container forked (sleep under sh) is there too.
		children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		for _, c := range strings.Fields(string(children)) {
			if child, _ := strconv.Atoi(c); cpuCgroup(t, child) != group {
				t.Errorf("child %d of the container is in cpu cgroup %s, not the pod's %s", child, cpuCgroup(t, child), group)
			}
		}
		// 1250 millicores, 1024 shares per CPU (the kubelet's conversion).
		dir := filepath.Join("/sys/fs/cgroup/cpu", group)
		if got := readTrimmed(t, filepath.Join(dir, "cpu.shares")); got != "1280" {
			t.Errorf("the pod's cpu.shares = %s, want 1280 (its containers request 1.25 CPUs)", got)
		}
		node := filepath.Dir(dir)
		nodeGroups = append(nodeGroups, node)
		if got, want := readTrimmed(t, filepath.Join(node, "cpu.shares")), strconv.Itoa(runtime.NumCPU()*1024); got != want {
			t.Errorf("the node's cgroup %s has cpu.shares %s, want %s (its %d allocatable CPUs)", node, got, want, runtime.NumCPU())
		}
		if err := tc.client.CoreV1().Pods(tc.ns).Delete(tc.ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(1))}); err != nil {
			t.Fatal(err)
		}
		tc.waitGone(pod.Name)
		// The object can go before the processes' last moments (the provider removes the group
		// after them).
		deadline := time.Now().Add(10 * time.Second)
		for _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist); _, err = os.Stat(dir) {
			if time.Now().After(deadline) {
				t.Fatalf("the pod's cgroup %s is left 10 s after the pod is gone (stat: %v)", dir, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("stopping the providers leaves no process, namespace, veth, bridge or IPAM state", func(t *testing.T) {
		tc.t = t
		n1.stop(t)
		n2.stop(t)
		stopped = true
		for _, pid := range pids {
			if processAlive(pid) {
				t.Errorf("process %d still runs after the providers stopped", pid)
			}
		}
		after := readHostState(t)
		// Other tests on this machine may add and remove links meanwhile: only new ones count, and
		// not taps, which the providers never make in the host's namespace (a pod's taps are in
		// its own) and the launcher's and metrics' tests running beside this package do, nor the
		// bridges and veths of package podnet, which the node agent's tests beside it make.
		for _, l := range after.links {
			if !slices.Contains(before.links, l) && !strings.HasSuffix(l, "/tuntap") && !podnetLink(l) {
				t.Errorf("link %s is left after the providers stopped (before: %v)", l, before.links)
			}
		}
		if before.ipForward != after.ipForward {
			t.Errorf("ip_forward before %s, after %s", before.ipForward, after.ipForward)
		}
		for _, g := range nodeGroups {
			if _, err := os.Stat(g); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the node's CPU cgroup %s is left (stat: %v)", g, err)
			}
		}
		for _, n := range []*node{n1, n2} {
			for _, d := range []string{"netns", "ipam", "cni-cache", "pods"} {
				if _, err := os.Stat(filepath.Join(n.stateDir, d)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("node %s: %s left in the state dir (stat: %v)", n.name, d, err)
				}
			}
		}
	})
}

type testCluster struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	ns     string
}

func (tc *testCluster) create(pod *corev1.Pod) *corev1.Pod {
	tc.t.Helper()
	pod.Namespace = tc.ns
	out, err := tc.client.CoreV1().Pods(tc.ns).Create(tc.ctx, pod, metav1.CreateOptions{})
	if err != nil {
		tc.t.Fatal(err)
	}
	return out
}

func (tc *testCluster) waitFor(name, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	tc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var last *corev1.Pod
	for time.Now().Before(deadline) {
		p, err := tc.client.CoreV1().Pods(tc.ns).Get(tc.ctx, name, metav1.GetOptions{})
		if err == nil {
			last = p
			if ok(p) {
				return p
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if last != nil {
		tc.t.Fatalf("pod %s: not %s within 60 s; status %+v", name, what, last.Status)
	}
	tc.t.Fatalf("pod %s: not %s within 60 s", name, what)
	return nil
}

func (tc *testCluster) waitPhase(name string, phase corev1.PodPhase) *corev1.Pod {
	tc.t.Helper()
	return tc.waitFor(name, string(phase), func(p *corev1.Pod) bool {
		if phase == corev1.PodRunning {
			return p.Status.Phase == phase && p.Status.PodIP != ""
		}
		return p.Status.Phase == phase
	})
}

func (tc *testCluster) waitGone(name string) {
	tc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		_, err := tc.client.CoreV1().Pods(tc.ns).Get(tc.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tc.t.Fatalf("pod %s still exists 60 s after its deletion", name)
}

func (tc *testCluster) waitNode(name string) *corev1.Node {
	tc.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		no, err := tc.client.CoreV1().Nodes().Get(tc.ctx, name, metav1.GetOptions{})
		if err == nil {
			for _, c := range no.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return no
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	tc.t.Fatalf("node %s not Ready within 60 s", name)
	return nil
}

func (tc *testCluster) httpGet(url string) string {
	tc.t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	var lastErr error
	// A minute: the pod's server may still be starting on a loaded machine.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		resp, err := c.Get(url)
		if err == nil {
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK {
				return string(b)
			}
			lastErr = fmt.Errorf("status %s, body %q, read %v", resp.Status, b, err)
		} else {
			lastErr = err
		}
		time.Sleep(100 * time.Millisecond)
	}
	tc.t.Fatalf("GET %s: %v", url, lastErr)
	return ""
}

// cpuCgroup is the cgroup v1 cpu controller's path of a process (/proc/PID/cgroup).
func cpuCgroup(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "cpu") {
			return f[2]
		}
	}
	t.Fatalf("process %d has no cpu cgroup: %s", pid, b)
	return ""
}

func readTrimmed(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// pidOf reads the process id from a running container's ID (process://PID).
func pidOf(t *testing.T, pod *corev1.Pod) int {
	t.Helper()
	id := pod.Status.ContainerStatuses[0].ContainerID
	pid, err := strconv.Atoi(strings.TrimPrefix(id, "process://"))
	if err != nil {
		t.Fatalf("container ID %q: %v", id, err)
	}
	return pid
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	for range 100 {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s did not appear", path)
}

// processAlive says whether pid runs (a zombie counts as gone).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// processUIDAfterInit is the real uid of a container's process once qvirt-pod-init (root) has
// exec'd it.
func processUIDAfterInit(t *testing.T, pid int) string {
	t.Helper()
	for range 50 {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) != "qvirt-pod-init" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return processUID(t, pid)
}

// processUID is the real uid of a process.
func processUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return ""
}

// startScheduler runs the control plane's kube-scheduler until the returned func is called.
func startScheduler(t *testing.T) func() {
	t.Helper()
	cmd := exec.Command(filepath.Join(cp.Env.BinaryAssetsDirectory, "kube-scheduler"),
		"--kubeconfig", cp.Kubeconfig, "--leader-elect=false", "--secure-port=0")
	logf, err := os.Create(filepath.Join(t.TempDir(), "kube-scheduler.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("kube-scheduler log:\n%s", tail(b, 5000))
		}
	}
}

func cacheHome(t *testing.T) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// podnetLink reports whether l ("name/type") is a link of package podnet's.
func podnetLink(l string) bool {
	return strings.HasPrefix(l, podnet.BridgePrefix) || strings.HasPrefix(l, podnet.HostVethPrefix)
}
