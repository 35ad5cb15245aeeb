package launcher

import (
	"context"
	"errors"
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
	srv, err := startNICDHCP(req, lease, field.NewPath("dhcp", "interface"))
	if err != nil {
		return err
	}
	if err := l.addNICDevice(ctx, p, req, port); err != nil {
		if srv != nil {
			srv.stop()
		}
		return err
	}
	l.watchNICDHCP(p, req.Name, srv)
	l.nics[req.Name] = hotNIC{NICHotplug: *req, port: port, dhcp: srv}
	l.notifyLocked()
	return nil
}

// startNICDHCP starts the DHCP server of a hot-plugged NIC (nil when req wants none); a failure
// is a field error at p, the request's DHCP interface.
func startNICDHCP(req *NICHotplug, lease *DHCPLease, p *field.Path) (*dhcpServer, error) {
	if lease == nil {
		return nil, nil
	}
	srv, err := startDHCP(req.DHCP.Interface, *lease)
	if err != nil {
		return nil, field.Invalid(p, req.DHCP.Interface, err.Error())
	}
	return srv, nil
}

// watchNICDHCP stops a hot-plugged NIC's DHCP server (if any) when QEMU exits; a server that
// fails earlier is logged, as at start (serveDHCP).
func (l *Launcher) watchNICDHCP(p *Process, name string, srv *dhcpServer) {
	if srv == nil {
		return
	}
	go func() {
		select {
		case <-p.Done():
			srv.stop()
		case <-srv.served:
			if !srv.stopping.Load() {
				l.opts.Log.Error(srv.err, "DHCP server stopped", "interface", name)
			}
		}
	}()
}

// addNICDevice adds the tap backend and the NIC on port.
func (l *Launcher) addNICDevice(ctx context.Context, p *Process, req *NICHotplug, port string) error {
	mon := p.Monitor()
	if err := mon.NetdevAddTap(ctx, qmp.NetdevTap{ID: NetdevID(req.Name), Ifname: req.Tap}); err != nil {
		return fmt.Errorf("attach nic %q: %w", req.Name, err)
	}
	if err := mon.DeviceAdd(ctx, nicDevice(req, port)); err != nil {
		_ = mon.NetdevDel(ctx, NetdevID(req.Name))
		return fmt.Errorf("attach nic %q: %w", req.Name, err)
	}
	return nil
}

// nicDevice is a hot-plugged NIC's device on port. The argv builder gives a migration target's
// placed NIC (Machine.HotplugNICs) the same properties: QEMU's migration stream only fits a device
// alike. No option ROM, as for cold-plugged NICs (there is no network boot): a ROM is a RAM block
// the target would need too.
func nicDevice(req *NICHotplug, port string) qmp.Device {
	return qmp.Device{Driver: nicDrivers[orDefault(req.Model, "virtio")], ID: NICDeviceID(req.Name), Bus: port,
		Props: map[string]any{"netdev": NetdevID(req.Name), "mac": req.MAC, "romfile": ""}}
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

// placeNICs checks a migration target's hot-plugged NICs (req.HotplugNICs) and starts the DHCP
// servers they ask for, before QEMU starts, so a lease that cannot be served is refused as for
// POST /v1/nics. It returns the NICs to record once QEMU runs (adoptNICs); on error no server is
// left running.
func placeNICs(req *SyncRequest) ([]hotNIC, error) {
	var placed []hotNIC
	stop := func() { stopNICDHCP(placed) }
	names := map[string]bool{}
	for _, in := range req.Spec.Domain.Devices.Interfaces {
		names[in.Name] = true
	}
	for i := range req.HotplugNICs {
		pn := &req.HotplugNICs[i]
		p := field.NewPath("hotplugNICs").Index(i)
		lease, err := validatePlacedNIC(pn, p, names)
		if err != nil {
			stop()
			return nil, err
		}
		names[pn.Name] = true
		srv, err := startNICDHCP(&pn.NICHotplug, lease, p.Child("dhcp", "interface"))
		if err != nil {
			stop()
			return nil, err
		}
		placed = append(placed, hotNIC{NICHotplug: pn.NICHotplug, port: pn.Port, dhcp: srv})
	}
	return placed, nil
}

// validatePlacedNIC checks one placed NIC as POST /v1/nics would, with field paths under p, and
// that its name is not taken; the argv builder checks the port against the spare ones.
func validatePlacedNIC(pn *PlacedNIC, p *field.Path, taken map[string]bool) (*DHCPLease, error) {
	lease, err := validateNICHotplug(&pn.NICHotplug)
	var fe *field.Error
	if errors.As(err, &fe) {
		under := *fe
		under.Field = p.String() + "." + fe.Field
		return nil, &under
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	if taken[pn.Name] {
		return nil, field.Duplicate(p.Child("name"), pn.Name)
	}
	if pn.Port == "" {
		return nil, field.Required(p.Child("port"), "the root port the NIC has on the source")
	}
	return lease, nil
}

// adoptNICs records the placed NICs of a QEMU that started with them, as HotplugNIC would have:
// they are listed as hot-plugged, can be unplugged, and their DHCP servers stop with QEMU.
func (l *Launcher) adoptNICs(p *Process, placed []hotNIC) {
	for _, h := range placed {
		l.watchNICDHCP(p, h.Name, h.dhcp)
		l.nics[h.Name] = h
	}
}

// stopNICDHCP stops the DHCP servers of placed NICs whose QEMU did not start.
func stopNICDHCP(placed []hotNIC) {
	for _, h := range placed {
		if h.dhcp != nil {
			h.dhcp.stop()
		}
	}
}
