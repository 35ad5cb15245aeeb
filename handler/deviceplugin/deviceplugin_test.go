package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/go-logr/logr/testr"
	"github.com/qvirt/qvirt/api/v1alpha1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// No kubelet can run on these machines, so the test stands in for it the way the kubelet's device
// manager works: a real gRPC Registration server on kubelet.sock, and a real gRPC client dialling
// the endpoint a plugin registered, calling ListAndWatch and Allocate.

type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	server *grpc.Server
	regs   chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if r.Version != pluginapi.Version {
		return nil, status.Errorf(codes.InvalidArgument, "unsupported version %q", r.Version)
	}
	k.regs <- r
	return &pluginapi.Empty{}, nil
}

// startKubelet starts a kubelet stand-in in dir. Like a starting kubelet it first wipes the
// directory, then listens on kubelet.sock.
func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{server: grpc.NewServer(), regs: make(chan *pluginapi.RegisterRequest, 16)}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go func() { _ = k.server.Serve(l) }()
	t.Cleanup(k.server.Stop)
	return k
}

// registrations waits for n registrations and returns them by resource name.
func (k *fakeKubelet) registrations(t *testing.T, n int) map[string]*pluginapi.RegisterRequest {
	t.Helper()
	got := map[string]*pluginapi.RegisterRequest{}
	timeout := time.After(10 * time.Second)
	for len(got) < n {
		select {
		case r := <-k.regs:
			got[r.ResourceName] = r
		case <-timeout:
			t.Fatalf("got %d registrations, want %d", len(got), n)
		}
	}
	return got
}

func startManager(t *testing.T, opts Options) (stop func()) {
	t.Helper()
	m := New(opts)
	ctx, cancel := context.WithCancel(logf.IntoContext(context.Background(), testr.New(t)))
	done := make(chan error, 1)
	go func() { done <- m.Start(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("device plugins: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// dialPlugin connects to a registered plugin the way the kubelet does: its endpoint is a socket
// name in the device-plugin directory.
func dialPlugin(t *testing.T, dir string, r *pluginapi.RegisterRequest) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// listDevices reads the first ListAndWatch message.
func listDevices(t *testing.T, c pluginapi.DevicePluginClient) []*pluginapi.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return resp.Devices
}

func TestRegistersListsAndAllocates(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	startManager(t, Options{Dir: dir, KVM: true})

	regs := k.registrations(t, 2)
	for res, dev := range map[string]string{v1alpha1.KVMResource: "/dev/kvm", v1alpha1.TunResource: "/dev/net/tun"} {
		r, ok := regs[res]
		if !ok {
			t.Fatalf("%s not registered; got %v", res, regs)
		}
		if strings.Contains(r.Endpoint, "/") {
			t.Errorf("%s endpoint %q is not a name in the plugin directory", res, r.Endpoint)
		}
		c := dialPlugin(t, dir, r)
		devs := listDevices(t, c)
		if len(devs) != DefaultDevices {
			t.Errorf("%s: %d devices, want %d", res, len(devs), DefaultDevices)
		}
		for _, d := range devs {
			if d.Health != pluginapi.Healthy {
				t.Errorf("%s: device %s is %s", res, d.ID, d.Health)
			}
		}

		ctx := context.Background()
		resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{devs[0].ID}}, {DevicesIds: []string{devs[1].ID, devs[2].ID}},
		}})
		if err != nil {
			t.Fatalf("%s: allocate: %v", res, err)
		}
		if len(resp.ContainerResponses) != 2 {
			t.Fatalf("%s: %d container responses, want 2", res, len(resp.ContainerResponses))
		}
		for _, cr := range resp.ContainerResponses {
			if len(cr.Devices) != 1 || cr.Devices[0].HostPath != dev || cr.Devices[0].ContainerPath != dev || cr.Devices[0].Permissions != "rw" {
				t.Errorf("%s: device specs %v, want %s rw", res, cr.Devices, dev)
			}
		}
		_, err = c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"nope"}}}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: allocating an unknown device: %v, want InvalidArgument", res, err)
		}
	}
}

func TestNoKVMWithoutWorkingKVM(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	startManager(t, Options{Dir: dir, KVM: false, Devices: 3})
	regs := k.registrations(t, 1)
	if _, ok := regs[v1alpha1.TunResource]; !ok || len(regs) != 1 {
		t.Fatalf("registrations %v, want tun only", regs)
	}
	if n := len(listDevices(t, dialPlugin(t, dir, regs[v1alpha1.TunResource]))); n != 3 {
		t.Fatalf("%d devices, want 3", n)
	}
	select {
	case r := <-k.regs:
		t.Fatalf("unexpected registration of %s", r.ResourceName)
	case <-time.After(500 * time.Millisecond):
	}
	if _, err := os.Stat(filepath.Join(dir, "qvirt-kvm.sock")); err == nil {
		t.Fatal("a kvm plugin socket exists")
	}
}

func TestReregistersWhenKubeletRestarts(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	startManager(t, Options{Dir: dir, KVM: true})
	old := k.registrations(t, 2)
	oldClient := dialPlugin(t, dir, old[v1alpha1.KVMResource])
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := oldClient.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}

	// The kubelet restarts: it goes away, wipes the directory (the plugins' sockets with it) and
	// listens on a new kubelet.sock.
	k.server.Stop()
	k2 := startKubelet(t, dir)
	regs := k2.registrations(t, 2)
	for _, res := range []string{v1alpha1.KVMResource, v1alpha1.TunResource} {
		if n := len(listDevices(t, dialPlugin(t, dir, regs[res]))); n != DefaultDevices {
			t.Errorf("%s after kubelet restart: %d devices", res, n)
		}
	}
	// The old kubelet's stream ended with the old server.
	if _, err := stream.Recv(); err == nil {
		t.Error("ListAndWatch stream of the replaced server still open")
	}
}

func TestRegistersWhenKubeletComesLater(t *testing.T) {
	dir := t.TempDir()
	startManager(t, Options{Dir: dir, KVM: false})
	// Give the plugins time to find no kubelet.
	time.Sleep(200 * time.Millisecond)
	k := startKubelet(t, dir)
	regs := k.registrations(t, 1)
	if n := len(listDevices(t, dialPlugin(t, dir, regs[v1alpha1.TunResource]))); n != DefaultDevices {
		t.Fatalf("%d devices", n)
	}
}

func TestStopRemovesSockets(t *testing.T) {
	dir := t.TempDir()
	k := startKubelet(t, dir)
	stop := startManager(t, Options{Dir: dir, KVM: true})
	k.registrations(t, 2)
	stop()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "kubelet.sock" {
		t.Fatalf("left in the plugin directory: %v", names)
	}
}
