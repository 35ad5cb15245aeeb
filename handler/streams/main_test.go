package streams_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/streams"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests run the stream server against a real kube-apiserver (envtest) holding the VMIs and
// a real launcher booting the test guest under TCG, and talk to it with real websocket clients
// over mutual TLS.

var (
	cp       *envtest.ControlPlane
	guestDir string
)

const nodeName = "node-a"

func TestMain(m *testing.M) {
	flag.Parse()
	if !fuzzing() {
		var err error
		if guestDir, err = testutil.GuestDir(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	envtest.Main(m, &cp)
}

// fuzzing reports whether this binary runs a fuzz target (coordinator or worker), which needs
// neither the guest nor a control plane.
func fuzzing() bool {
	f, w := flag.Lookup("test.fuzz"), flag.Lookup("test.fuzzworker")
	return (f != nil && f.Value.String() != "") || (w != nil && w.Value.String() == "true")
}

// server is a running stream server and what a client needs to reach it.
type server struct {
	*streams.Server
	pki     *pki
	podsDir string
	base    string // https://127.0.0.1:port
	stop    context.CancelFunc
	stopped chan error
	once    sync.Once
}

func startServer(t *testing.T, podsDir string, p *pki, edit func(*streams.Options)) *server {
	t.Helper()
	opts := streams.Options{
		Reader: cp.Client, NodeName: nodeName, PodsDir: podsDir,
		CertFile: p.certFile, KeyFile: p.keyFile, ClientCAFile: p.caFile,
		Addr: "127.0.0.1:0", Log: testr.New(t),
	}
	if edit != nil {
		edit(&opts)
	}
	s, err := streams.New(opts)
	if err != nil {
		t.Fatalf("streams.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := &server{Server: s, pki: p, podsDir: podsDir, stop: cancel, stopped: make(chan error, 1)}
	go func() { srv.stopped <- s.Start(ctx) }()
	t.Cleanup(func() { srv.shutdown(t) })
	waitFor(t, 5*time.Second, "the server to listen", func() bool { return s.Addr() != nil })
	srv.base = "https://" + s.Addr().String()
	return srv
}

// shutdown stops the server and checks it returned cleanly; safe to call twice.
func (s *server) shutdown(t *testing.T) {
	t.Helper()
	s.once.Do(func() {
		s.stop()
		select {
		case err := <-s.stopped:
			if err != nil {
				t.Errorf("Start returned %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("the server did not stop within 10s")
		}
	})
}

// caller is who qvirt-api says the end user is.
type caller struct {
	user  string
	write bool
}

func (c caller) header() http.Header {
	h := http.Header{}
	if c.user != "" {
		h.Set(streams.HeaderUser, c.user)
		h.Add(streams.HeaderGroups, "devs")
		h.Add(streams.HeaderGroups, "system:authenticated")
	}
	if c.write {
		h.Set(streams.HeaderQMPWrite, "true")
	}
	return h
}

var alice = caller{user: "alice"}

// dial opens a websocket to one of a VMI's streams as qvirt-api would.
func (s *server) dial(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, endpoint string, who caller, protocol string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := "wss" + strings.TrimPrefix(s.base, "https") + streams.Path(vmi.Namespace, vmi.Name, endpoint)
	opts := &websocket.DialOptions{HTTPClient: s.pki.httpClient(&s.pki.client.tls), HTTPHeader: who.header()}
	if protocol != "" {
		opts.Subprotocols = []string{protocol}
	}
	c, resp, err := websocket.Dial(ctx, url, opts)
	if err == nil {
		c.SetReadLimit(8 << 20)
		t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// mustDial is dial that fails the test unless the upgrade succeeds with the protocol.
func (s *server) mustDial(t *testing.T, vmi *v1alpha1.VirtualMachineInstance, endpoint string, who caller, protocol string) *websocket.Conn {
	t.Helper()
	c, resp, err := s.dial(t, vmi, endpoint, who, protocol)
	if err != nil {
		t.Fatalf("dial %s: %v (%s)", endpoint, err, body(resp))
	}
	if c.Subprotocol() != protocol {
		t.Fatalf("dial %s: subprotocol %q, want %q", endpoint, c.Subprotocol(), protocol)
	}
	return c
}

// do sends a plain request with cert; it returns the status and the metav1.Status body.
func (s *server) do(t *testing.T, method, path string, who caller, cert *tls.Certificate) (int, metav1.Status, error) {
	t.Helper()
	req, err := http.NewRequest(method, s.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = who.header()
	resp, err := s.pki.httpClient(cert).Do(req)
	if err != nil {
		return 0, metav1.Status{}, err
	}
	defer resp.Body.Close()
	var st metav1.Status
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("%s %s: %d with a body that is not a Status: %q", method, path, resp.StatusCode, data)
	}
	return resp.StatusCode, st, nil
}

func body(resp *http.Response) string {
	if resp == nil || resp.Body == nil {
		return "no response"
	}
	data, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, data)
}

func waitFor(t *testing.T, d time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createVMI creates a VMI like the test guest and sets its status as the handler would.
func createVMI(t *testing.T, name string, edit func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	req, err := translate.LoadFile("../../test/guest/vmi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	req.Spec.Domain.Firmware.KernelBoot.Container.Image = "file://" + guestDir
	req.Spec.Domain.Devices.AutoattachGraphicsDevice = ptr.To(true)
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: req.Spec}
	vmi.Status.NodeName, vmi.Status.Phase = nodeName, v1alpha1.Running
	vmi.Status.ActivePods = map[types.UID]string{podOf(vmi.Name): nodeName}
	if edit != nil {
		edit(vmi)
	}
	status := vmi.Status
	ctx := context.Background()
	if err := cp.Client.Create(ctx, vmi); err != nil {
		t.Fatalf("create VMI %s: %v", name, err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), vmi) })
	vmi.Status = status
	if err := cp.Client.Status().Update(ctx, vmi); err != nil {
		t.Fatalf("update status of VMI %s: %v", name, err)
	}
	return vmi
}

// guest is the test guest booted by a real launcher serving in the VMI's socket directory.
type guest struct {
	vmi    *v1alpha1.VirtualMachineInstance
	client *launcher.Client
}

// podOf is the UID of the launcher pod createVMI records for the VMI named name.
func podOf(name string) types.UID { return types.UID("pod-of-" + name) }

// bootGuest starts a launcher for vmi in its pod's sockets volume under podsDir and syncs it; the
// guest is still booting when it returns (QVIRT-GUEST-READY comes some seconds later).
func bootGuest(t *testing.T, podsDir string, vmi *v1alpha1.VirtualMachineInstance) *guest {
	t.Helper()
	dir := launcher.VMIDir(testutil.PodSocketDir(t, podsDir, podOf(vmi.Name)), vmi.UID)
	if err := os.MkdirAll(string(dir), 0o700); err != nil {
		t.Fatal(err)
	}
	l := launcher.New(string(dir), launcher.HostResolver{SpareRootPorts: 1}, launcher.Options{Log: testr.New(t)})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = launcher.Serve(ctx, dir.Command(), l, testr.New(t))
	}()
	g := &guest{vmi: vmi, client: launcher.NewClient(dir.Command())}
	t.Cleanup(func() {
		if st, err := g.client.Status(context.Background()); err == nil && st.PID > 0 && st.Exit == nil {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			waitFor(t, 10*time.Second, "QEMU to exit", func() bool { s, _ := l.Status(context.Background()); return s.Exit != nil })
		}
		cancel()
		<-served
	})
	waitFor(t, 5*time.Second, "the launcher's socket", func() bool { _, err := os.Stat(dir.Command()); return err == nil })
	req := testutil.SyncRequest(t, vmi, nil)
	st, err := g.client.Sync(context.Background(), req)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}
	if st.Phase != protocol.PhaseRunning {
		t.Fatalf("after sync: phase %s (%s)", st.Phase, st.StartError)
	}
	return g
}

// stream reads every message of a websocket in the background.
// stream is a websocket read in the background (test/testutil).
type stream = testutil.WSStream

func read(c *websocket.Conn) *stream { return testutil.ReadWS(c) }

func pathOf(vmi *v1alpha1.VirtualMachineInstance, endpoint string) string {
	return streams.Path(vmi.Namespace, vmi.Name, endpoint)
}
