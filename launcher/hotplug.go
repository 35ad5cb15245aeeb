package launcher

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/qmp"
)

// Hotplugged devices sit on the spare pcie-root-ports the argv builder creates, one device per
// port, because q35's pcie.0 refuses hotplug. Unplug waits for DEVICE_DELETED, which only comes once
// the guest OS has released the device. A device is added with exactly what the argv builder gives
// a migration target's copy of it (disk.go, nic.go).

// hotDisk is a hot-plugged disk and its resolved image.
type hotDisk struct {
	machine.Disk
	img DiskImage
}

// hotNIC is a hot-plugged NIC (its Port set) and its DHCP server.
type hotNIC struct {
	machine.NIC
	// dhcp serves the NIC's lease while it is attached; nil without DHCP.
	dhcp *dhcpServer
}

var hotPath machine.Path

// HotplugDisk resolves d's image as at start and attaches it as a virtio disk on the first free
// spare root port. It returns the disk as attached (with its port).
func (l *Launcher) HotplugDisk(ctx context.Context, d *machine.Disk) (machine.Disk, error) {
	if d.Port != "" {
		return machine.Disk{}, machine.Forbidden(hotPath.Child("port"), "the launcher picks the port of a hot-plugged disk")
	}
	if errs := checkDisk(hotPath, d); len(errs) > 0 {
		return machine.Disk{}, errs
	}
	if d.Bus != machine.BusVirtio || d.CDROM || d.BootIndex != nil {
		return machine.Disk{}, machine.Invalid(hotPath.Child("bus"), d.Bus, "only a virtio disk without a boot index can be hot-plugged")
	}
	l.volumes.Lock()
	defer l.volumes.Unlock()
	p, err := l.process()
	if err != nil {
		return machine.Disk{}, err
	}
	// Refuse a taken name before resolving: resolving an emptyDisk of a cold-plugged disk's name
	// would find (and the cleanup below remove) that disk's image.
	if l.hasDisk(p, d.Name) {
		return machine.Disk{}, machine.Duplicate(hotPath.Child("name"), d.Name)
	}
	if err := checkIOThread(hotPath, d, p.Machine().IOThreads); err != nil {
		return machine.Disk{}, err
	}
	img, ferr := l.resolver.ResolveDisk(d, l.runDir, hotPath)
	if ferr != nil {
		return machine.Disk{}, ferr
	}
	hot := hotDisk{Disk: *d, img: img}
	if ferr := resolveVolumeBlockSize(&hot.Disk, img, hotPath); ferr != nil {
		removeEphemeral(d.Name, img)
		return machine.Disk{}, ferr
	}
	if err := l.attachDisk(ctx, p, &hot); err != nil {
		removeEphemeral(d.Name, img)
		return machine.Disk{}, err
	}
	return hot.Disk, nil
}

// hasDisk says whether a cold-plugged or hot-plugged disk is named name.
func (l *Launcher) hasDisk(p *Process, name string) bool {
	if d := p.Machine().Disk(name); d != nil && d.Port == "" {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.hotplug[name]
	return ok
}

func (l *Launcher) attachDisk(ctx context.Context, p *Process, hot *hotDisk) error {
	chain, errs := diskChain(hotPath.Child("source"), hot.Name, &hot.img)
	if len(errs) > 0 {
		return errs
	}
	if len(chain) > 1 {
		return machine.Forbidden(hotPath.Child("source"), "a disk with a backing image cannot be hot-plugged")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	port, err := l.freePortLocked(p.Machine())
	if err != nil {
		return err
	}
	hot.Port = port
	mon := p.Monitor()
	nodes := blockNodes(&hot.Disk, chain) // file node, then the format node over it
	for i, n := range nodes {
		if err := mon.BlockdevAdd(ctx, n); err != nil {
			if i > 0 {
				_ = mon.BlockdevDel(ctx, FileNode(hot.Name))
			}
			return fmt.Errorf("attach disk %q: %w", hot.Name, err)
		}
	}
	if err := mon.DeviceAdd(ctx, virtioDiskDevice(&hot.Disk, port)); err != nil {
		_ = mon.BlockdevDel(ctx, DriveNode(hot.Name))
		_ = mon.BlockdevDel(ctx, FileNode(hot.Name))
		return fmt.Errorf("attach disk %q: %w", hot.Name, err)
	}
	l.hotplug[hot.Name] = *hot
	l.notifyLocked()
	return nil
}

// removeEphemeral deletes the image the launcher created for disk name (an emptyDisk, the overlay
// of a writable containerDisk, or an ephemeral volume's overlay). Only files named as the resolver
// names those images are touched.
func removeEphemeral(name string, img DiskImage) {
	if !img.Ephemeral || !strings.HasSuffix(img.Path, "/"+emptyDiskFile(name)) && !strings.HasSuffix(img.Path, "/"+overlayFile(name)) &&
		!strings.HasSuffix(img.Path, "/"+claimOverlayFile(name)) {
		return
	}
	_ = os.Remove(img.Path)
}

// freePortLocked is the first spare root port no hotplugged device uses.
func (l *Launcher) freePortLocked(m *Machine) (string, error) {
	used := map[string]bool{}
	for _, d := range l.hotplug {
		used[d.Port] = true
	}
	for _, n := range l.nics {
		used[n.Port] = true
	}
	for i := range m.SpareRootPorts {
		if id := HotplugPortID(i); !used[id] {
			return id, nil
		}
	}
	return "", &ConflictError{Msg: fmt.Sprintf("all %d hotplug ports are in use", m.SpareRootPorts)}
}

// UnplugDisk detaches a hot-plugged disk once the guest has let it go, then its block nodes, and
// deletes the image the launcher created for it (an emptyDisk).
func (l *Launcher) UnplugDisk(ctx context.Context, name string) error {
	l.volumes.Lock()
	defer l.volumes.Unlock()
	l.mu.Lock()
	d := l.hotplug[name]
	l.mu.Unlock()
	err := l.unplug(ctx, "disk", name, DiskDeviceID(name), func(mon *qmp.Monitor) error {
		if err := mon.BlockdevDel(ctx, DriveNode(name)); err != nil {
			return err
		}
		return mon.BlockdevDel(ctx, FileNode(name))
	}, func() bool { _, ok := l.hotplug[name]; return ok }, func() { delete(l.hotplug, name) })
	if err != nil {
		return err
	}
	removeEphemeral(name, d.img)
	return nil
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
		return machine.Invalid(hotPath.Child("name"), name, fmt.Sprintf("no hot-plugged %s has this name", kind))
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

// HotplugNIC attaches a tap the node agent created as a NIC and, when n.DHCP is set, serves the
// NIC's lease until UnplugNIC or QEMU's exit. The DHCP server is listening before the device is
// added, so the guest's first DISCOVER is answered.
func (l *Launcher) HotplugNIC(ctx context.Context, n *machine.NIC) error {
	if n.Port != "" {
		return machine.Forbidden(hotPath.Child("port"), "the launcher picks the port of a hot-plugged NIC")
	}
	hw, lease, err := checkHotNIC(hotPath, n)
	if err != nil {
		return err
	}
	p, err := l.process()
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.nics[n.Name]; dup || p.Machine().hasColdNIC(n.Name) {
		return machine.Duplicate(hotPath.Child("name"), n.Name)
	}
	port, err := l.freePortLocked(p.Machine())
	if err != nil {
		return err
	}
	srv, err := startNICDHCP(n, lease, hotPath.Child("dhcp", "interface"))
	if err != nil {
		return err
	}
	hot := hotNIC{NIC: *n, dhcp: srv}
	hot.Port = port
	if err := l.addNICDevice(ctx, p, &hot.NIC, hw); err != nil {
		if srv != nil {
			srv.stop()
		}
		return err
	}
	l.watchNICDHCP(p, n.Name, srv)
	l.nics[n.Name] = hot
	if l.agent != nil {
		l.agent.pollSoon() // the guest's new interface and its address, reported within seconds
	}
	l.notifyLocked()
	return nil
}

func (m *Machine) hasColdNIC(name string) bool {
	n := m.NIC(name)
	return n != nil && n.Port == ""
}

// checkHotNIC checks a NIC that is or was hot-plugged and returns its MAC in QEMU's form and its
// DHCP lease (nil when it asks for none).
func checkHotNIC(p machine.Path, n *machine.NIC) (string, *DHCPLease, error) {
	hw, errs := checkNIC(p, n)
	if len(errs) > 0 {
		return "", nil, errs
	}
	if !nicDrivers[n.Model].pcie {
		return "", nil, machine.Invalid(p.Child("model"), n.Model, "only a PCIe NIC (virtio, e1000e) can be hot-plugged")
	}
	if n.DHCP == nil {
		return hw, nil, nil
	}
	lease, err := leaseFor(n.DHCP, n.MAC)
	if err == nil {
		err = lease.validate()
	}
	if err != nil {
		return "", nil, machine.Invalid(p.Child("dhcp"), n.DHCP.Interface, err.Error())
	}
	return hw, &lease, nil
}

// startNICDHCP starts the DHCP server of a hot-plugged NIC (nil when it wants none); a failure
// is a field error at p, the NIC's DHCP interface.
func startNICDHCP(n *machine.NIC, lease *DHCPLease, p machine.Path) (*dhcpServer, error) {
	if lease == nil {
		return nil, nil
	}
	srv, err := startDHCP(n.DHCP.Interface, *lease)
	if err != nil {
		return nil, machine.Invalid(p, n.DHCP.Interface, err.Error())
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

// addNICDevice adds the tap backend and the NIC on its port.
func (l *Launcher) addNICDevice(ctx context.Context, p *Process, n *machine.NIC, hw string) error {
	mon := p.Monitor()
	if err := mon.NetdevAddTap(ctx, qmp.NetdevTap{ID: NetdevID(n.Name), Ifname: n.Tap, Queues: int(n.Queues)}); err != nil {
		return fmt.Errorf("attach nic %q: %w", n.Name, err)
	}
	if err := mon.DeviceAdd(ctx, nicDevice(n, hw, n.Port)); err != nil {
		_ = mon.NetdevDel(ctx, NetdevID(n.Name))
		return fmt.Errorf("attach nic %q: %w", n.Name, err)
	}
	return nil
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

// placeNICs checks a migration target's hot-plugged NICs (those of m with a Port) and starts the
// DHCP servers they ask for, before QEMU starts, so a lease that cannot be served is refused as
// for POST /v1/nics. It returns the NICs to record once QEMU runs (adoptNICs); on error no server
// is left running. The argv builder checks the ports against the spare ones.
func placeNICs(m *Machine) ([]hotNIC, error) {
	var placed []hotNIC
	for i := range m.NICs {
		n := &m.NICs[i]
		if n.Port == "" {
			continue
		}
		p := machinePath.Child("nics").Index(i)
		_, lease, err := checkHotNIC(p, n)
		if err == nil {
			var srv *dhcpServer
			if srv, err = startNICDHCP(n, lease, p.Child("dhcp", "interface")); err == nil {
				placed = append(placed, hotNIC{NIC: *n, dhcp: srv})
				continue
			}
		}
		stopNICDHCP(placed)
		return nil, err
	}
	return placed, nil
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
