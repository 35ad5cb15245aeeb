// Package deviceplugin is the node agent's kubelet device plugin: it advertises
// devices.qvirt.io/tun (always) and devices.qvirt.io/kvm (only when the capability probe found KVM
// working) as a fixed number of shareable devices, and hands a container that asks for one the
// /dev/net/tun or /dev/kvm device node. Launcher pods request these resources instead of running
// privileged, as KubeVirt's do.
//
// Each resource is its own plugin: a gRPC server (k8s.io/kubelet deviceplugin/v1beta1) on a unix
// socket in the kubelet's device-plugin directory, registered with the kubelet's Registration
// service on kubelet.sock there. A kubelet that restarts wipes the directory and recreates
// kubelet.sock; the Manager watches the directory (inotify) and serves and registers again.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// DefaultDevices is how many "devices" each resource advertises: the cap on launcher pods per node
// asking for it (a device node can be shared by any number), KubeVirt's figure.
const DefaultDevices = 110

// registerTimeout bounds one Register call to the kubelet.
const registerTimeout = 10 * time.Second

// Options configure the Manager.
type Options struct {
	// Dir is the kubelet's device-plugin directory; pluginapi.DevicePluginPath when empty.
	Dir string
	// KVM advertises devices.qvirt.io/kvm: set it from nodeagent.Capabilities.KVM.
	KVM bool
	// Devices is the number of devices per resource; DefaultDevices when 0.
	Devices int
}

// Manager runs the device plugins. It is a manager.Runnable without leader election.
type Manager struct {
	dir         string
	kubeletSock string
	plugins     []*plugin
}

// New returns the device plugins for opts.
func New(opts Options) *Manager {
	dir := opts.Dir
	if dir == "" {
		dir = pluginapi.DevicePluginPath
	}
	n := opts.Devices
	if n <= 0 {
		n = DefaultDevices
	}
	m := &Manager{dir: dir, kubeletSock: filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))}
	m.plugins = append(m.plugins, newPlugin(v1alpha1.TunResource, "/dev/net/tun", filepath.Join(dir, "qvirt-tun.sock"), n))
	if opts.KVM {
		m.plugins = append(m.plugins, newPlugin(v1alpha1.KVMResource, "/dev/kvm", filepath.Join(dir, "qvirt-kvm.sock"), n))
	}
	return m
}

// Resources are the resource names this Manager advertises.
func (m *Manager) Resources() []string {
	var rs []string
	for _, p := range m.plugins {
		rs = append(rs, p.resource)
	}
	return rs
}

// NeedLeaderElection is false: every node serves its own devices.
func (m *Manager) NeedLeaderElection() bool { return false }

// Start serves every plugin and registers it with the kubelet, serves and registers again when the
// kubelet restarts, and stops the plugins (removing their sockets) when ctx ends. A kubelet that
// is not there yet is no error: registration happens when its socket appears.
func (m *Manager) Start(ctx context.Context) error {
	log := logf.FromContext(ctx).WithName("deviceplugin")
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("device plugins: watch %s: %w", m.dir, err)
	}
	defer w.Close()
	// Watch before serving, so a kubelet starting meanwhile is not missed.
	if err := w.Add(m.dir); err != nil {
		return fmt.Errorf("device plugins: watch %s: %w", m.dir, err)
	}
	defer func() {
		for _, p := range m.plugins {
			p.stop()
		}
	}()
	for _, p := range m.plugins {
		if err := p.serve(); err != nil {
			return err
		}
		m.register(ctx, p)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-w.Errors:
			log.Error(err, "watching the kubelet's device-plugin directory", "dir", m.dir)
		case ev := <-w.Events:
			m.handle(ctx, ev)
		}
	}
}

// handle reacts to a change in the device-plugin directory: kubelet.sock created means a new
// kubelet, whose registry is empty; a plugin socket removed (the kubelet wipes the directory when it
// starts) means that plugin must serve again. A socket that exists again by the time its Remove is
// handled is the plugin's own new one.
func (m *Manager) handle(ctx context.Context, ev fsnotify.Event) {
	log := logf.FromContext(ctx).WithName("deviceplugin")
	if ev.Name == m.kubeletSock && ev.Has(fsnotify.Create) {
		log.Info("kubelet (re)started: registering the device plugins again")
		for _, p := range m.plugins {
			if !exists(p.socket) {
				if err := p.serve(); err != nil {
					log.Error(err, "serve device plugin", "resource", p.resource)
					continue
				}
			}
			m.register(ctx, p)
		}
		return
	}
	for _, p := range m.plugins {
		if ev.Name != p.socket || !ev.Has(fsnotify.Remove) || exists(p.socket) {
			continue
		}
		log.Info("device plugin socket removed: serving again", "resource", p.resource)
		if err := p.serve(); err != nil {
			log.Error(err, "serve device plugin", "resource", p.resource)
			continue
		}
		m.register(ctx, p)
	}
}

// register tells the kubelet about p; a failure is logged, the kubelet's socket appearing brings
// the next try.
//
// The kubelet's socket appears at bind(), a moment before the kubelet listens: while it exists,
// a refused registration is tried again for a few seconds.
func (m *Manager) register(ctx context.Context, p *plugin) {
	log := logf.FromContext(ctx).WithName("deviceplugin")
	deadline := time.Now().Add(registerTimeout)
	for {
		err := Register(ctx, m.kubeletSock, p.resource, filepath.Base(p.socket))
		if err == nil {
			break
		}
		if !exists(m.kubeletSock) || time.Now().After(deadline) || ctx.Err() != nil {
			log.Info("device plugin not registered yet", "resource", p.resource, "reason", err.Error())
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Info("device plugin registered", "resource", p.resource, "devices", len(p.devices))
}

// Register calls the kubelet's Registration service on kubeletSock for resource served at endpoint
// (a socket name in the kubelet's device-plugin directory).
func Register(ctx context.Context, kubeletSock, resource, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("register %s: dial kubelet at %s: %w", resource, kubeletSock, err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: endpoint, ResourceName: resource,
		Options: &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet at %s: %w", resource, kubeletSock, err)
	}
	return nil
}

// plugin serves one resource. serve and stop are called from the Manager's goroutine only; the
// gRPC methods run on the server's goroutines and read only immutable fields and done.
type plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	resource, devPath, socket string
	devices                   []*pluginapi.Device
	ids                       map[string]bool

	mu     sync.Mutex
	server *grpc.Server
	done   chan struct{} // closed when the current server stops, ending ListAndWatch streams
}

func newPlugin(resource, devPath, socket string, n int) *plugin {
	p := &plugin{resource: resource, devPath: devPath, socket: socket, ids: map[string]bool{}}
	base := filepath.Base(devPath)
	for i := range n {
		id := fmt.Sprintf("%s%d", base, i)
		p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
		p.ids[id] = true
	}
	return p
}

// serve (re)starts the plugin's gRPC server on a fresh socket.
func (p *plugin) serve() error {
	p.stop()
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("device plugin %s: remove stale socket: %w", p.resource, err)
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		return fmt.Errorf("device plugin %s: listen on %s: %w", p.resource, p.socket, err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	p.mu.Lock()
	p.server, p.done = s, make(chan struct{})
	p.mu.Unlock()
	go func() { _ = s.Serve(l) }() // returns when stopped
	return nil
}

// stop ends the current server, if any, and its streams. The socket file stays when the kubelet
// already removed and reused the name; otherwise Serve's listener removes it on close.
func (p *plugin) stop() {
	p.mu.Lock()
	s, done := p.server, p.done
	p.server, p.done = nil, nil
	p.mu.Unlock()
	if s == nil {
		return
	}
	close(done)
	s.Stop()
}

func (p *plugin) streamDone() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// GetDevicePluginOptions: no PreStartContainer, no preferred allocation.
func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once: the devices are fixed and always healthy (a node whose
// KVM breaks is found by the probe at the agent's next start). The stream stays open until the
// kubelet closes it or the plugin stops.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	done := p.streamDone()
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-s.Context().Done():
	case <-done:
	}
	return nil
}

// Allocate gives each container the device node, read-write, for every request of known IDs.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		for _, id := range cr.DevicesIds {
			if !p.ids[id] {
				return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device %q", p.resource, id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Devices: []*pluginapi.DeviceSpec{{ContainerPath: p.devPath, HostPath: p.devPath, Permissions: "rw"}},
		})
	}
	return resp, nil
}

// PreStartContainer is not used (GetDevicePluginOptions says so).
func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
