package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/qvirt/qvirt/local/supervise"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/podnet"
	"github.com/qvirt/qvirt/test/testutil"
)

func itoa(n int) string { return strconv.Itoa(n) }

// TestControlPlane brings up the real control plane under the supervisor, as `local up` does: the
// API server answers with the admin kubeconfig at the bridge address, a killed component comes
// back, and Stop leaves no process.
func TestControlPlane(t *testing.T) {
	tools, err := envtest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	pods := podnet.NewNetwork(t)
	dir := t.TempDir()
	sup, err := supervise.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			sup.Stop(10 * time.Second)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	started := time.Now()
	etcdPort := testutil.FreePortPair(t)
	cp, err := StartControlPlane(ctx, sup, ControlPlaneOptions{Dir: dir, Tools: tools,
		Address: pods.Gateway.AsSlice(), APIServerPort: testutil.FreePortPair(t), EtcdPort: etcdPort,
		ControllerManagerPort: testutil.FreePortPair(t), SchedulerPort: testutil.FreePortPair(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane ready in %.1fs", time.Since(started).Seconds())

	cfg, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Fatalf("the admin kubeconfig at %s does not work: %v", cp.Server, err)
	}

	t.Run("etcd serves only clients with its CA's certificate", func(t *testing.T) {
		checkEtcdRefusesStrangers(t, cp, etcdPort)
	})

	var ctl ControllerOptions
	var c client.Client
	// The controllers' endpoints are published until the whole test ends.
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	t.Run("qvirt installs and its controller serves the webhook", func(t *testing.T) {
		ctl, c = installAndRunController(ctx, bg, t, cp, sup, pods.Gateway.AsSlice(), dir)
	})
	if c != nil {
		t.Run("admission stays up while a controller replica is deleted", func(t *testing.T) {
			checkAdmissionThroughReplicaDeletion(ctx, t, c, sup, ctl)
		})
	}

	if err := sup.Kill("kube-scheduler"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		states, _ := supervise.ReadStates(dir)
		var sched supervise.State
		for _, st := range states {
			if st.Name == "kube-scheduler" {
				sched = st
			}
		}
		if sched.State == supervise.Running && sched.Restarts == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kube-scheduler not restarted: %+v", states)
		}
		time.Sleep(100 * time.Millisecond)
	}

	states, _ := supervise.ReadStates(dir)
	sup.Stop(10 * time.Second)
	stopped = true
	for _, st := range states {
		if st.PID != 0 && supervise.Alive(st.PID, st.Path) {
			t.Errorf("%s (pid %d) still runs after Stop", st.Name, st.PID)
		}
	}
}

// installAndRunController installs qvirt's API and configuration, runs the real qvirt-controller
// binary's replicas under the supervisor and checks that the webhook configurations got their CA
// bundle from the controller, that a VM only the webhook refuses is refused, and that a valid VM
// gets its instance.
func installAndRunController(ctx, bg context.Context, t *testing.T, cp *ControlPlane, sup *supervise.Supervisor, addr net.IP, dir string) (ControllerOptions, client.Client) {
	// In the whole test's directory: the supervisor restarts the binary after this subtest.
	bin := filepath.Join(dir, "qvirt-controller")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/qvirt-controller").CombinedOutput(); err != nil {
		t.Fatalf("build qvirt-controller: %v\n%s", err, out)
	}
	c, err := scheme.NewClient(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	err = cp.Install(ctx, c, InstallOptions{Repo: "../..", Namespace: "qvirt-system",
		Config: map[string]string{"useEmulation": "true", "launcherImage": "qvirt-launcher:local"}})
	if err != nil {
		t.Fatal(err)
	}
	ctl := ControllerOptions{Binary: bin, Namespace: "qvirt-system", Address: addr,
		WebhookPort: testutil.FreePortRun(t, ControllerReplicas), ProbePort: testutil.FreePortRun(t, ControllerReplicas)}
	if err := cp.StartControllers(ctx, bg, sup, c, ctl); err != nil {
		t.Fatal(err)
	}
	checkCABundles(ctx, t, c)

	vm := &v1alpha1.VirtualMachine{}
	data, err := os.ReadFile("../../config/samples/vm_testguest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, vm); err != nil {
		t.Fatal(err)
	}
	vm.Namespace = "default"
	bad := vm.DeepCopy()
	bad.Name = "bad"
	bad.Spec.Template.Spec.Volumes = append(bad.Spec.Template.Spec.Volumes, v1alpha1.Volume{Name: "scratch0",
		VolumeSource: v1alpha1.VolumeSource{EmptyDisk: &v1alpha1.EmptyDiskSource{Capacity: resource.MustParse("0")}}})
	bad.Spec.Template.Spec.Domain.Devices.Disks = append(bad.Spec.Template.Spec.Domain.Devices.Disks,
		v1alpha1.Disk{Name: "scratch0", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}})
	err = c.Create(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), "vvm.qvirt.io") || !strings.Contains(err.Error(), "capacity") {
		t.Fatalf("a VM with a zero-capacity emptyDisk: %v, want the webhook's refusal naming capacity", err)
	}
	if err := c.Create(ctx, vm); err != nil {
		t.Fatalf("create VM %s: %v", vm.Name, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var vmi v1alpha1.VirtualMachineInstance
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: vm.Name}, &vmi); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("qvirt-controller made no instance for VM %s; its log: %s", vm.Name, sup.LogPath("qvirt-controller"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return ctl, c
}

// checkEtcdRefusesStrangers reads etcd's keys through its gRPC gateway as a process on the host
// would: over plain HTTP, over TLS without a client certificate and with a certificate of the
// cluster's CA (which every Kubernetes client of the local cluster holds), all refused; only the
// API server's etcd client certificate gets an answer.
func checkEtcdRefusesStrangers(t *testing.T, cp *ControlPlane, port int) {
	t.Helper()
	rangeAll := `{"key":"AA==","range_end":"AA==","keys_only":true}` // every key
	post := func(url string, cfg *tls.Config) (int, error) {
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := hc.Post(url, "application/json", strings.NewReader(rangeAll))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, nil
	}
	addr := "127.0.0.1:" + itoa(port)
	etcdCA := x509.NewCertPool()
	caPEM, err := os.ReadFile(cp.pki("etcd-ca.crt"))
	if err != nil || !etcdCA.AppendCertsFromPEM(caPEM) {
		t.Fatalf("etcd's CA: %v", err)
	}
	admin, err := tls.LoadX509KeyPair(cp.pki("admin.crt"), cp.pki("admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	if code, err := post("http://"+addr+"/v3/kv/range", nil); err == nil && code == http.StatusOK {
		t.Errorf("etcd answered a plain HTTP client")
	}
	if code, err := post("https://"+addr+"/v3/kv/range", &tls.Config{RootCAs: etcdCA}); err == nil {
		t.Errorf("etcd answered %d to a client without a certificate", code)
	}
	if code, err := post("https://"+addr+"/v3/kv/range", &tls.Config{RootCAs: etcdCA, Certificates: []tls.Certificate{admin}}); err == nil {
		t.Errorf("etcd answered %d to the cluster admin's certificate, which is not its CA's", code)
	}
	client, err := tls.LoadX509KeyPair(cp.pki("apiserver-etcd-client.crt"), cp.pki("apiserver-etcd-client.key"))
	if err != nil {
		t.Fatal(err)
	}
	if code, err := post("https://"+addr+"/v3/kv/range", &tls.Config{RootCAs: etcdCA, Certificates: []tls.Certificate{client}}); err != nil || code != http.StatusOK {
		t.Errorf("etcd refused the API server's client certificate: %d %v", code, err)
	}
}
