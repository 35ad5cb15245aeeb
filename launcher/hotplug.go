package launcher

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/qvirt/qvirt/qmp"
)

// Hotplugged devices sit on the spare pcie-root-ports the argv builder creates, one device per
// port, because q35's pcie.0 refuses hotplug. Unplug waits for DEVICE_DELETED, which only comes once
// the guest OS has released the device.

// HotplugDisk attaches req's image as a virtio disk and records the port it took in req.Port.
func (l *Launcher) HotplugDisk(ctx context.Context, req *DiskHotplug) error {
	if err := validateDiskHotplug(req); err != nil {
		return err
	}
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.Machine().hasDisk(req.Name) || l.hotplug[req.Name].Name != "" {
		return field.Duplicate(field.NewPath("name"), req.Name)
	}
	port, err := l.freePortLocked(p.Machine())
	if err != nil {
		return err
	}
	req.Port = port
	mon := p.Monitor()
	if err := mon.BlockdevAdd(ctx, hotplugBlockdev(req)); err != nil {
		return fmt.Errorf("attach disk %q: %w", req.Name, err)
	}
	if err := mon.DeviceAdd(ctx, hotplugDiskDevice(req)); err != nil {
		_ = mon.BlockdevDel(ctx, DriveNode(req.Name))
		return fmt.Errorf("attach disk %q: %w", req.Name, err)
	}
	l.hotplug[req.Name] = *req
	l.notifyLocked()
	return nil
}

// hotplugBlockdev is the blockdev-add for a hotplugged disk: a format node over a file node, the
// same node names the argv builder gives cold-plugged disks.
func hotplugBlockdev(req *DiskHotplug) qmp.BlockdevOptions {
	ro := req.ReadOnly
	cache := &qmp.BlockdevCache{Direct: ptrTo(true), NoFlush: ptrTo(false)}
	opts := qmp.BlockdevOptions{
		Driver: req.Format, NodeName: DriveNode(req.Name), ReadOnly: &ro, Cache: cache,
		File: qmp.BlockdevOptions{Driver: "file", NodeName: FileNode(req.Name), Filename: req.Path, ReadOnly: &ro,
			Cache: cache, Props: map[string]any{"aio": "threads"}},
	}
	if req.Format == "qcow2" {
		// Never follow a backing file named inside an image.
		opts.Props = map[string]any{"backing": nil}
	}
	return opts
}

func hotplugDiskDevice(req *DiskHotplug) qmp.Device {
	props := map[string]any{"drive": DriveNode(req.Name), "write-cache": "on"}
	if req.Serial != "" {
		props["serial"] = req.Serial
	}
	return qmp.Device{Driver: "virtio-blk-pci", ID: DiskDeviceID(req.Name), Bus: req.Port, Props: props}
}

func validateDiskHotplug(req *DiskHotplug) error {
	if msgs := validation.IsDNS1123Label(req.Name); len(msgs) > 0 {
		return field.Invalid(field.NewPath("name"), req.Name, msgs[0])
	}
	if !filepath.IsAbs(req.Path) {
		return field.Invalid(field.NewPath("path"), req.Path, "must be an absolute path")
	}
	if _, err := os.Stat(req.Path); err != nil {
		return field.Invalid(field.NewPath("path"), req.Path, err.Error())
	}
	if req.Format != "raw" && req.Format != "qcow2" {
		return field.NotSupported(field.NewPath("format"), req.Format, []string{"raw", "qcow2"})
	}
	return nil
}

// freePortLocked is the first spare root port no hotplugged device uses.
func (l *Launcher) freePortLocked(m *Machine) (string, error) {
	used := map[string]bool{}
	for _, d := range l.hotplug {
		used[d.Port] = true
	}
	for _, n := range l.nics {
		used[n.port] = true
	}
	for i := range m.SpareRootPorts {
		if id := HotplugPortID(i); !used[id] {
			return id, nil
		}
	}
	return "", &ConflictError{Msg: fmt.Sprintf("all %d hotplug ports are in use", m.SpareRootPorts)}
}

// UnplugDisk detaches a hotplugged disk once the guest has let it go.
func (l *Launcher) UnplugDisk(ctx context.Context, name string) error {
	return l.unplug(ctx, "disk", name, DiskDeviceID(name), func(mon *qmp.Monitor) error {
		// The file node was created inline under the format node and goes with it.
		return mon.BlockdevDel(ctx, DriveNode(name))
	}, func() bool { _, ok := l.hotplug[name]; return ok }, func() { delete(l.hotplug, name) })
}

// unplug removes device id, waiting for the guest to release it, then its backend, and forgets it.
// has and forget run under l.mu.
func (l *Launcher) unplug(ctx context.Context, kind, name, id string, backend func(*qmp.Monitor) error, has func() bool, forget func()) error {
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	ok := has()
	l.mu.Unlock()
	if !ok {
		return field.NotFound(field.NewPath("name"), name)
	}
	if err := p.Monitor().DeviceDelAndWait(ctx, id); err != nil {
		return fmt.Errorf("detach %s %q: %w", kind, name, err)
	}
	if err := backend(p.Monitor()); err != nil {
		return fmt.Errorf("detach %s %q: remove backend: %w", kind, name, err)
	}
	l.mu.Lock()
	forget()
	l.notifyLocked()
	l.mu.Unlock()
	return nil
}

type hotNIC struct {
	NICHotplug
	port string
	// dhcp serves req.DHCP's lease while the NIC is attached; nil without DHCP.
	dhcp *dhcpServer
}

// HotplugNIC attaches a tap the node agent created as a NIC and, when req.DHCP is set, serves the
// NIC's lease until UnplugNIC or QEMU's exit. The DHCP server is listening before the device is
// added, so the guest's first DISCOVER is answered.
func (l *Launcher) HotplugNIC(ctx context.Context, req *NICHotplug) error {
	lease, err := validateNICHotplug(req)
	if err != nil {
		return err
	}
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.nics[req.Name]; dup || p.Machine().hasInterface(req.Name) {
		return field.Duplicate(field.NewPath("name"), req.Name)
	}
	port, err := l.freePortLocked(p.Machine())
	if err != nil {
		return err
	}
	srv, err := l.startNICDHCP(p, req, lease)
	if err != nil {
		return err
	}
	if err := l.addNICDevice(ctx, p, req, port); err != nil {
		if srv != nil {
			srv.stop()
		}
		return err
	}
	l.nics[req.Name] = hotNIC{NICHotplug: *req, port: port, dhcp: srv}
	l.notifyLocked()
	return nil
}

// startNICDHCP starts the DHCP server of a hot-plugged NIC (nil when req wants none) and stops it
// when QEMU exits; a server that fails later is logged, as at start (serveDHCP).
func (l *Launcher) startNICDHCP(p *Process, req *NICHotplug, lease *DHCPLease) (*dhcpServer, error) {
	if lease == nil {
		return nil, nil
	}
	srv, err := startDHCP(req.DHCP.Interface, *lease)
	if err != nil {
		return nil, field.Invalid(field.NewPath("dhcp", "interface"), req.DHCP.Interface, err.Error())
	}
	go func() {
		select {
		case <-p.Done():
			srv.stop()
		case <-srv.served:
			if !srv.stopping.Load() {
				l.opts.Log.Error(srv.err, "DHCP server stopped", "interface", req.Name)
			}
		}
	}()
	return srv, nil
}

// addNICDevice adds the tap backend and the NIC on port.
func (l *Launcher) addNICDevice(ctx context.Context, p *Process, req *NICHotplug, port string) error {
	mon := p.Monitor()
	if err := mon.NetdevAddTap(ctx, qmp.NetdevTap{ID: NetdevID(req.Name), Ifname: req.Tap}); err != nil {
		return fmt.Errorf("attach nic %q: %w", req.Name, err)
	}
	model := req.Model
	if model == "" {
		model = "virtio"
	}
	dev := qmp.Device{Driver: nicDrivers[model], ID: NICDeviceID(req.Name), Bus: port,
		Props: map[string]any{"netdev": NetdevID(req.Name), "mac": req.MAC}}
	if err := mon.DeviceAdd(ctx, dev); err != nil {
		_ = mon.NetdevDel(ctx, NetdevID(req.Name))
		return fmt.Errorf("attach nic %q: %w", req.Name, err)
	}
	return nil
}

// validateNICHotplug checks req and returns its DHCP lease, nil when it asks for none.
func validateNICHotplug(req *NICHotplug) (*DHCPLease, error) {
	if msgs := validation.IsDNS1123Label(req.Name); len(msgs) > 0 {
		return nil, field.Invalid(field.NewPath("name"), req.Name, msgs[0])
	}
	if req.Tap == "" || len(req.Tap) > 15 {
		return nil, field.Invalid(field.NewPath("tap"), req.Tap, "must be a tap device name of 1 to 15 characters")
	}
	if _, err := parseMAC(req.MAC); err != nil {
		return nil, field.Invalid(field.NewPath("mac"), req.MAC, err.Error())
	}
	if _, ok := nicDrivers[orDefault(req.Model, "virtio")]; !ok {
		return nil, field.NotSupported(field.NewPath("model"), req.Model, []string{"virtio", "e1000e"})
	}
	if req.DHCP == nil {
		return nil, nil
	}
	if req.DHCP.Interface == "" || len(req.DHCP.Interface) > 15 {
		return nil, field.Invalid(field.NewPath("dhcp", "interface"), req.DHCP.Interface, "must be a network interface name of 1 to 15 characters")
	}
	lease, err := req.DHCP.lease(req.MAC)
	if err == nil {
		err = lease.validate()
	}
	if err != nil {
		return nil, field.Invalid(field.NewPath("dhcp"), req.DHCP, err.Error())
	}
	return &lease, nil
}

// UnplugNIC detaches a hotplugged NIC once the guest has let it go, then stops its DHCP server:
// when it returns, the server's socket is closed.
func (l *Launcher) UnplugNIC(ctx context.Context, name string) error {
	return l.unplug(ctx, "nic", name, NICDeviceID(name), func(mon *qmp.Monitor) error {
		return mon.NetdevDel(ctx, NetdevID(name))
	}, func() bool { _, ok := l.nics[name]; return ok }, func() {
		if srv := l.nics[name].dhcp; srv != nil {
			srv.stop()
		}
		delete(l.nics, name)
	})
}

// nicDrivers are the NIC models that can be hotplugged: PCIe devices that sit on a root port.
var nicDrivers = map[string]string{"virtio": "virtio-net-pci", "e1000e": "e1000e"}

func (m *Machine) hasDisk(name string) bool {
	for _, d := range m.Spec.Domain.Devices.Disks {
		if d.Name == name {
			return true
		}
	}
	for _, d := range m.Hotplugged {
		if d.Name == name {
			return true
		}
	}
	return false
}

func (m *Machine) hasInterface(name string) bool {
	for _, in := range m.Spec.Domain.Devices.Interfaces {
		if in.Name == name {
			return true
		}
	}
	return false
}

// MAC is the MAC address of a spec interface: the spec's, else the one the caller derived.
func (m *Machine) MAC(iface string) string {
	for _, in := range m.Spec.Domain.Devices.Interfaces {
		if in.Name == iface && in.MacAddress != "" {
			return in.MacAddress
		}
	}
	return m.MACs[iface]
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func ptrTo[T any](v T) *T { return &v }
