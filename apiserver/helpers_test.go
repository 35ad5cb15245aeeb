package apiserver_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/handler/streams"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/local/pki"
	"github.com/qvirt/qvirt/test/testutil"
)

// testPKI holds the files of the handler link (one CA signing the handlers' certificates, one per
// node, and qvirt-api's client certificate) and qvirt-api's serving certificate, for the
// APIService.
type testPKI struct {
	dir       string
	ca        *pki.CA
	servingCA []byte
}

func newTestPKI(dir string) (*testPKI, error) {
	ca, err := pki.LoadOrCreateCA(dir, "ca")
	if err != nil {
		return nil, err
	}
	for name, leaf := range map[string]pki.Leaf{
		"api":   {CommonName: "qvirt-api", Client: true},
		"rogue": {CommonName: "not-the-handler", DNSNames: []string{"localhost"}, Server: true},
	} {
		if err := ca.Issue(dir, name, leaf); err != nil {
			return nil, err
		}
	}
	sca, err := pki.LoadOrCreateCA(dir, "serving-ca")
	if err != nil {
		return nil, err
	}
	svc := "qvirt-api." + installNS + ".svc"
	if err := sca.Issue(dir, "serving", pki.Leaf{CommonName: svc, DNSNames: []string{svc}, Server: true}); err != nil {
		return nil, err
	}
	servingCA, err := os.ReadFile(filepath.Join(dir, "serving-ca.crt"))
	if err != nil {
		return nil, err
	}
	return &testPKI{dir: dir, ca: ca, servingCA: servingCA}, nil
}

// handlerCert issues node's qvirt-handler certificate, as qvirt-controller signs it, and returns
// its name for startHandlerWithCert.
func (p *testPKI) handlerCert(t *testing.T, node string) string {
	t.Helper()
	name := "handler-" + node
	if err := p.ca.Issue(p.dir, name, certs.HandlerNodeSpec(node)); err != nil {
		t.Fatal(err)
	}
	return name
}

func (p *testPKI) file(name string) string { return filepath.Join(p.dir, name) }

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func dynamicFor(cfg *rest.Config) (*dynamic.DynamicClient, error) { return dynamic.NewForConfig(cfg) }

func rbacBinding(user, clusterRole string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user + "-" + strings.ReplaceAll(clusterRole, ":", "-"), Namespace: testNS},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
}

// node is a Node whose qvirt-handler stream server is at addr.
func createNode(t *testing.T, name, addr string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if addr != "" {
		n.Annotations = map[string]string{v1alpha1.NodeStreamsAddressAnnotation: addr}
	}
	if err := cp.Client.Create(context.Background(), n); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), n) })
}

// startHandler runs the handler's stream server for node over podsDir, with node's certificate,
// trusting qvirt-api's client certificate.
func startHandler(t *testing.T, e *env, node, podsDir string) string {
	t.Helper()
	return startHandlerWithCert(t, e, node, podsDir, e.pki.handlerCert(t, node))
}

// startHandlerWithCert is startHandler serving the certificate cert (a leaf of the test PKI).
func startHandlerWithCert(t *testing.T, e *env, node, podsDir, cert string) string {
	t.Helper()
	s, err := streams.New(streams.Options{
		Reader: cp.Client, NodeName: node, PodsDir: podsDir,
		CertFile: e.pki.file(cert + ".crt"), KeyFile: e.pki.file(cert + ".key"), ClientCAFile: e.pki.file("ca.crt"),
		AllowedClientNames: []string{"qvirt-api"}, Addr: "127.0.0.1:0",
		Log: funcr.New(func(prefix, args string) { fmt.Fprintf(e.handlerLogs, "%s %s\n", prefix, args) }, funcr.Options{}).WithName("handler"),
	})
	if err != nil {
		t.Fatalf("streams.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("the handler's stream server did not stop")
		}
	})
	testutil.Eventually(t, 5*time.Second, "the stream server to listen", func() bool { return s.Addr() != nil })
	return s.Addr().String()
}

// testVMI creates a VMI like the test guest, with the status the handler would give it.
func testVMI(t *testing.T, name, node string, phase v1alpha1.VirtualMachineInstancePhase) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	req, err := translate.LoadFile("../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	req.Spec.Domain.Firmware.KernelBoot.Container.Image = "file://" + guestDir
	req.Spec.Domain.Devices.AutoattachGraphicsDevice = ptr.To(true)
	req.Spec.Domain.Devices.ClientPassthrough = &v1alpha1.ClientPassthroughDevices{}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Spec: req.Spec}
	ctx := context.Background()
	if err := cp.Client.Create(ctx, vmi); err != nil {
		t.Fatalf("create VMI %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), vmi) })
	vmi.Status.NodeName, vmi.Status.Phase = node, phase
	vmi.Status.ActivePods = map[types.UID]string{podOf(name): node}
	if err := cp.Client.Status().Update(ctx, vmi); err != nil {
		t.Fatalf("update status of VMI %s: %v", name, err)
	}
	return vmi
}

// podOf is the UID of the launcher pod testVMI records for the VMI named name.
func podOf(name string) types.UID { return types.UID("pod-of-" + name) }

// bootGuest starts a real launcher for vmi in its pod's sockets volume under podsDir and syncs it (the guest boots); it
// returns the launcher's client.
func bootGuest(t *testing.T, podsDir string, vmi *v1alpha1.VirtualMachineInstance) *launcher.Client {
	t.Helper()
	dir := launcher.VMIDir(testutil.PodSocketDir(t, podsDir, podOf(vmi.Name)), vmi.UID)
	if err := os.MkdirAll(string(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	l := launcher.New(string(dir), launcher.HostResolver{SpareRootPorts: 1}, launcher.Options{Log: testr.New(t).WithName("launcher")})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = launcher.Serve(ctx, dir.Command(), l, testr.New(t))
	}()
	c := launcher.NewClient(dir.Command())
	t.Cleanup(func() {
		if st, err := c.Status(context.Background()); err == nil && st.PID > 0 && st.Exit == nil {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			testutil.Eventually(t, 10*time.Second, "QEMU to exit", func() bool { s, _ := l.Status(context.Background()); return s.Exit != nil })
		}
		cancel()
		<-served
	})
	testutil.Eventually(t, 5*time.Second, "the launcher's socket", func() bool { _, err := os.Stat(dir.Command()); return err == nil })
	st, err := c.Sync(context.Background(), testutil.SyncRequest(t, vmi, nil))
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if st.Phase != protocol.PhaseRunning {
		t.Fatalf("after sync: phase %s (%s)", st.Phase, st.StartError)
	}
	return c
}

// url is the kube-apiserver URL of a subresource; scheme https or wss.
func url(scheme, resource, name, subresource string) string {
	return scheme + strings.TrimSuffix(strings.TrimPrefix(cp.Config.Host, "https"), "/") + sub.Path(testNS, resource, name, subresource)
}

// httpClient is a client authenticated as the user of cfg.
func httpClient(cfg *rest.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfigFor(cfg)}, Timeout: 60 * time.Second}
}

// dial opens a subresource websocket through kube-apiserver as the user of cfg.
func dial(t *testing.T, cfg *rest.Config, name, subresource, protocol string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := &http.Transport{TLSClientConfig: tlsConfigFor(cfg)}
	c, resp, err := websocket.Dial(ctx, url("wss", sub.VirtualMachineInstances, name, subresource), &websocket.DialOptions{
		HTTPClient: &http.Client{Transport: tr}, Subprotocols: []string{protocol},
	})
	if err == nil {
		c.SetReadLimit(16 << 20)
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// status decodes a metav1.Status body; it fails the test for any other body.
func status(t *testing.T, resp *http.Response) metav1.Status {
	t.Helper()
	if resp == nil {
		t.Fatalf("no HTTP response")
	}
	data, _ := io.ReadAll(resp.Body)
	var st metav1.Status
	if err := json.Unmarshal(data, &st); err != nil || st.Kind != "Status" {
		t.Fatalf("HTTP %d with a body that is not a Status: %q", resp.StatusCode, data)
	}
	return st
}

// put sends PUT with body to a virtualmachines or virtualmachineinstances subresource.
func put(t *testing.T, cfg *rest.Config, resource, name, subresource, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, url("https", resource, name, subresource), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient(cfg).Do(req)
	if err != nil {
		t.Fatalf("PUT %s/%s/%s: %v", resource, name, subresource, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data
}

func get(t *testing.T, cfg *rest.Config, path string) (int, []byte, http.Header) {
	t.Helper()
	resp, err := httpClient(cfg).Get(strings.TrimSuffix(cp.Config.Host, "/") + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, data, resp.Header
}

// stream reads every message of a websocket in the background.
// stream is a websocket read in the background (test/testutil).
type stream = testutil.WSStream

func read(c *websocket.Conn) *stream { return testutil.ReadWS(c) }
