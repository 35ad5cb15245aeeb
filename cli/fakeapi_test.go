package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	pollInterval = 100 * time.Millisecond
	// Room for the guest's last echo on a loaded machine (1 s in qvirtctl itself).
	eofQuiet = 3 * time.Second
	envtest.Main(m, &cp)
}

const testToken = "qvirtctl-test-token"

// fakeAPI plays kube-apiserver with qvirt-api behind it: the contract's subresource paths are
// served here (a fake of qvirt-api's side, with real websockets), everything else is proxied to
// the envtest kube-apiserver. Every request must carry the kubeconfig's bearer token.
type fakeAPI struct {
	srv *httptest.Server
	mu  sync.Mutex
	// requests are "METHOD PATH BODY" of the subresource calls.
	requests []string
	// qmpSent are the QMP commands the fake QEMU received.
	qmpSent []string
	// consoles holds the open console session per VMI, for takeover.
	consoles map[string]*websocket.Conn
	// onMigrate runs after a migrate call created its VMIM.
	onMigrate func(vmim *qv1.VirtualMachineInstanceMigration)
	// watched counts the watch requests proxied, by resource (the path's last element).
	watched map[string]int
}

func newFakeAPI(t *testing.T) *fakeAPI {
	t.Helper()
	f := &fakeAPI{consoles: map[string]*websocket.Conn{}, watched: map[string]int{}}
	target, err := url.Parse(cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := rest.TransportFor(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = rt
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+testToken {
			writeStatus(w, http.StatusUnauthorized, metav1.StatusReasonUnauthorized, "Unauthorized", nil)
			return
		}
		if strings.HasPrefix(r.URL.Path, "/apis/"+subv1.GroupVersion.Group+"/") {
			f.serveSubresource(w, r)
			return
		}
		r.Header.Del("Authorization")
		if r.URL.Query().Get("watch") == "true" {
			f.mu.Lock()
			f.watched[path.Base(r.URL.Path)]++
			f.mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	f.srv.EnableHTTP2 = true // like kube-apiserver: websockets must still get HTTP/1.1
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string, details *metav1.StatusDetails) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Code: int32(code), Reason: reason, Message: msg, Details: details})
}

func writeSuccess(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess, Code: 200})
}

func (f *fakeAPI) record(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, s)
}

func (f *fakeAPI) recorded() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.requests...)
}

// serveSubresource implements the contract for .../namespaces/NS/RESOURCE/NAME/SUB and /version.
func (f *fakeAPI) serveSubresource(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == subv1.VersionPath() {
		_ = json.NewEncoder(w).Encode(subv1.Version{GitVersion: "v0.1.0-fake", GoVersion: "go1.26.8", Platform: "linux/amd64"})
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/apis/subresources.qvirt.io/v1alpha1/namespaces/"), "/")
	if len(parts) != 4 {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource", nil)
		return
	}
	ns, res, name, sub := parts[0], parts[1], parts[2], parts[3]
	body, _ := io.ReadAll(r.Body)
	f.record(fmt.Sprintf("%s %s %s", r.Method, r.URL.Path, bytes.TrimSpace(body)))
	if strings.HasPrefix(name, "missing") {
		writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, fmt.Sprintf("%s %q not found", res, name),
			&metav1.StatusDetails{Name: name, Kind: res, Group: "qvirt.io"})
		return
	}
	if strings.HasPrefix(name, "forbidden") {
		writeStatus(w, http.StatusForbidden, metav1.StatusReasonForbidden, fmt.Sprintf(
			`%s.subresources.qvirt.io %q is forbidden: User "tester" cannot get resource "%s/%s" in API group "subresources.qvirt.io" in the namespace %q`,
			res, name, res, sub, ns), &metav1.StatusDetails{Name: name, Kind: res, Group: "subresources.qvirt.io"})
		return
	}
	switch sub {
	case subv1.Console:
		f.console(w, r, ns+"/"+name)
	case subv1.VNC:
		f.echo(w, r, "RFB 003.008\n")
	case subv1.USBRedir:
		f.echo(w, r, "USBREDIR-HELLO")
	case subv1.QMP:
		f.qmp(w, r)
	case subv1.Screenshot:
		f.screenshot(w, name)
	case subv1.Migrate:
		f.migrate(w, r, ns, name)
	case subv1.GuestOSInfo:
		if name == "noagent" {
			writeStatus(w, http.StatusConflict, metav1.StatusReasonConflict, "guestosinfo refused by its launcher: the guest agent is not connected", nil)
			return
		}
		_, _ = w.Write([]byte(`{"guestAgentVersion":"7.2.22","hostname":"` + name + `","os":{"id":"debian","prettyName":"Debian GNU/Linux 12"}}`))
	default:
		if r.Method != http.MethodPut {
			writeStatus(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, "PUT only", nil)
			return
		}
		writeSuccess(w)
	}
}

// console echoes "got:" plus what it receives, after a banner; a newer session takes over.
func (f *fakeAPI) console(w http.ResponseWriter, r *http.Request, key string) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{subv1.SubprotocolPlain}})
	if err != nil {
		return
	}
	f.mu.Lock()
	if old := f.consoles[key]; old != nil {
		old.Close(4001, "taken over by a console session of user bob")
	}
	f.consoles[key] = c
	f.mu.Unlock()
	ctx := r.Context()
	_ = c.Write(ctx, websocket.MessageBinary, []byte("QVIRT-GUEST-READY\r\n"))
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		if string(b) == "poweroff\r" {
			c.Close(websocket.StatusNormalClosure, "the VM stopped")
			return
		}
		_ = c.Write(ctx, websocket.MessageBinary, append([]byte("got:"), b...))
	}
}

// echo sends greeting (VNC's RFB greeting, say) and echoes what it receives until it receives
// "BYE": then it closes the stream, as a VMI that stops does.
func (f *fakeAPI) echo(w http.ResponseWriter, r *http.Request, greeting string) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{subv1.SubprotocolPlain}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	_ = c.Write(ctx, websocket.MessageBinary, []byte(greeting))
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		if string(b) == "BYE" {
			c.Close(websocket.StatusNormalClosure, "the VMI stopped")
			return
		}
		_ = c.Write(ctx, websocket.MessageBinary, b)
	}
}

// qmp is a scripted QEMU monitor as the handler shows it.
func (f *fakeAPI) qmp(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{subv1.SubprotocolQMP}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := r.Context()
	_ = c.Write(ctx, websocket.MessageText, []byte(`{"QMP": {"version": {"qemu": {"major": 7, "minor": 2, "micro": 0}}, "capabilities": []}}`))
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			return
		}
		var req struct {
			Execute   string          `json:"execute"`
			Arguments json.RawMessage `json:"arguments"`
			ID        json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(b, &req); err != nil {
			return
		}
		f.mu.Lock()
		f.qmpSent = append(f.qmpSent, req.Execute+" "+string(req.Arguments))
		f.mu.Unlock()
		reply := map[string]any{"id": req.ID}
		switch req.Execute {
		case "qmp_capabilities":
			reply["return"] = map[string]any{}
		case "query-commands":
			reply["return"] = []map[string]string{{"name": "query-status"}, {"name": "query-version"}, {"name": "query-commands"},
				{"name": "human-monitor-command"}, {"name": "stop"}, {"name": "cont"}}
		case "query-status":
			_ = c.Write(ctx, websocket.MessageText, []byte(`{"event": "RESUME", "timestamp": {"seconds": 1, "microseconds": 2}}`))
			reply["return"] = map[string]any{"status": "running", "running": true, "singlestep": false}
		case "human-monitor-command":
			var a struct {
				CommandLine string `json:"command-line"`
			}
			_ = json.Unmarshal(req.Arguments, &a)
			reply["return"] = "VM status: running\r\n(from " + a.CommandLine + ")\r\n"
		case "x-drop":
			c.Close(websocket.StatusGoingAway, "qvirt-handler is shutting down")
			return
		case "stop":
			reply["error"] = map[string]string{"class": "GenericError", "desc": `"stop" is not read-only: it needs update on virtualmachineinstances/qmp-write (subresources.qvirt.io)`}
		default:
			reply["error"] = map[string]string{"class": "CommandNotFound", "desc": "The command " + req.Execute + " has not been found"}
		}
		out, _ := json.Marshal(reply)
		if err := c.Write(ctx, websocket.MessageText, out); err != nil {
			return
		}
	}
}

func (f *fakeAPI) screenshot(w http.ResponseWriter, name string) {
	if name == "garbage" {
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write([]byte("<html>not a picture</html>"))
		return
	}
	w.Header().Set("Content-Type", "image/png")
	_ = png.Encode(w, image.NewRGBA(image.Rect(0, 0, 720, 400)))
}

func (f *fakeAPI) migrate(w http.ResponseWriter, r *http.Request, ns, name string) {
	vmim := &qv1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: name + "-migration-"},
		Spec:       qv1.VirtualMachineInstanceMigrationSpec{VMIName: name},
	}
	if err := cp.Client.Create(r.Context(), vmim); err != nil {
		writeStatus(w, http.StatusInternalServerError, metav1.StatusReasonInternalError, err.Error(), nil)
		return
	}
	_ = json.NewEncoder(w).Encode(vmim)
	if f.onMigrate != nil {
		go f.onMigrate(vmim.DeepCopy())
	}
}

// waitWatching waits until the client has opened a watch on each resource, at most 30 s.
func (f *fakeAPI) waitWatching(resources ...string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		f.mu.Lock()
		missing := slices.DeleteFunc(slices.Clone(resources), func(r string) bool { return f.watched[r] > 0 })
		f.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no watch on %v after 30 s", missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kubeconfig writes a kubeconfig for the fake with two contexts, a (namespace ns-a, current) and
// b (namespace ns-b), and returns its path.
func (f *fakeAPI) kubeconfig(t *testing.T) string {
	t.Helper()
	pemCA := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.srv.Certificate().Raw})
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pemCA, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: tester
  user:
    token: %s
contexts:
- name: a
  context: {cluster: fake, user: tester, namespace: ns-a}
- name: b
  context: {cluster: fake, user: tester, namespace: ns-b}
current-context: a
`, f.srv.URL, caFile, testToken)
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// run runs qvirtctl in-process with args and returns stdout, stderr and the exit code.
func run(t *testing.T, stdin io.Reader, args ...string) (string, string, int) {
	t.Helper()
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	var stdout, stderr lockedBuffer
	code := Main(append([]string{"qvirtctl"}, args...), stdin, &stdout, &stderr)
	return stdout.String(), stderr.String(), code
}

// lockedBuffer is a bytes.Buffer safe for a writer and a concurrent reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// createVMI creates a VMI in ns (creating ns) and sets its phase.
func createVMI(t *testing.T, ns, name string, phase qv1.VirtualMachineInstancePhase) *qv1.VirtualMachineInstance {
	t.Helper()
	ctx := context.Background()
	ensureNamespace(t, ns)
	mem := resource.MustParse("128Mi")
	vmi := &qv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	vmi.Spec.Domain.Memory = &qv1.Memory{Guest: &mem}
	if err := cp.Client.Create(ctx, vmi); err != nil {
		t.Fatalf("create VMI %s/%s: %v", ns, name, err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), vmi) })
	setPhase(t, vmi, phase)
	return vmi
}

func setPhase(t *testing.T, vmi *qv1.VirtualMachineInstance, phase qv1.VirtualMachineInstancePhase) {
	t.Helper()
	vmi.Status.Phase = phase
	if err := cp.Client.Status().Update(context.Background(), vmi); err != nil {
		t.Fatalf("set VMI %s phase %s: %v", vmi.Name, phase, err)
	}
}

func ensureNamespace(t *testing.T, ns string) {
	t.Helper()
	_, _, _ = cp.KubectlCmd(context.Background(), nil, "create", "namespace", ns)
}

// collect copies r into a buffer in the background.
func collect(r io.Reader) *lockedBuffer {
	var b lockedBuffer
	go func() { _, _ = io.Copy(&b, r) }()
	return &b
}

// eventually waits until cond holds or fails with what the last look showed.
func eventually(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, seen := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; saw %q", what, d, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
