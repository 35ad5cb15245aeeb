package qmp

import (
	"context"
	"encoding/json"
	"fmt"

	gqmp "github.com/digitalocean/go-qemu/qmp"
)

// BlockdevOptions are blockdev-add's arguments: the members common to every
// driver, a few driver members qvirt uses, and Props for the rest, which
// are flattened into the same JSON object (QEMU 7.2 schema: BlockdevOptions,
// a union on "driver").
type BlockdevOptions struct {
	Driver       string         `json:"driver"` // file, host_device, raw, qcow2, null-co, ...
	NodeName     string         `json:"node-name,omitempty"`
	ReadOnly     *bool          `json:"read-only,omitempty"`
	AutoReadOnly *bool          `json:"auto-read-only,omitempty"`
	ForceShare   *bool          `json:"force-share,omitempty"`
	Discard      string         `json:"discard,omitempty"`       // ignore, unmap
	DetectZeroes string         `json:"detect-zeroes,omitempty"` // off, on, unmap
	Cache        *BlockdevCache `json:"cache,omitempty"`
	// Filename is the path, for the file and host_device drivers.
	Filename string `json:"filename,omitempty"`
	// File is the protocol layer under a format driver (raw, qcow2): the
	// node name of an existing node (a string) or a nested BlockdevOptions.
	File any `json:"file,omitempty"`
	// Props are further driver members, such as "size" for null-co or
	// "backing" for qcow2. A key that repeats a field above is an error.
	Props map[string]any `json:"-"`
}

// BlockdevCache is the "cache" member of blockdev-add.
type BlockdevCache struct {
	Direct  *bool `json:"direct,omitempty"`
	NoFlush *bool `json:"no-flush,omitempty"`
}

// MarshalJSON flattens Props into the object.
func (o BlockdevOptions) MarshalJSON() ([]byte, error) {
	type plain BlockdevOptions
	return flatten(plain(o), o.Props)
}

// BlockdevAdd creates a block node. opts is a BlockdevOptions, a map, or any
// value that marshals to blockdev-add's arguments object.
func (m *Monitor) BlockdevAdd(ctx context.Context, opts any) error {
	return m.Call(ctx, "blockdev-add", opts, nil)
}

// BlockdevDel removes a block node that no device or other node uses.
func (m *Monitor) BlockdevDel(ctx context.Context, nodeName string) error {
	args := struct {
		NodeName string `json:"node-name"`
	}{nodeName}
	return m.Call(ctx, "blockdev-del", args, nil)
}

// Device is device_add's arguments. device_add takes a driver's properties
// at the top level of its arguments, as -device does, so Props are
// flattened next to driver, id and bus; values are JSON-typed (numbers,
// booleans, strings), not -device's strings.
type Device struct {
	Driver string         `json:"driver"`
	ID     string         `json:"id,omitempty"`
	Bus    string         `json:"bus,omitempty"`
	Props  map[string]any `json:"-"`
}

// MarshalJSON flattens Props into the object.
func (d Device) MarshalJSON() ([]byte, error) {
	type plain Device
	return flatten(plain(d), d.Props)
}

// DeviceAdd hot-plugs a device. On q35, pcie.0 refuses hot-plug: plug into a
// pcie-root-port created at start.
func (m *Monitor) DeviceAdd(ctx context.Context, dev Device) error {
	return m.Call(ctx, "device_add", dev, nil)
}

// DeviceDel asks for a device's removal and returns when QEMU accepted the
// request. For PCI devices removal completes only when the guest
// acknowledges it, signalled by DEVICE_DELETED; see DeviceDelAndWait.
func (m *Monitor) DeviceDel(ctx context.Context, id string) error {
	return m.Call(ctx, "device_del", deviceID{id}, nil)
}

// DeviceDelAndWait asks for a device's removal and waits for its
// DEVICE_DELETED event. With a guest that ignores the unplug request it
// waits until ctx ends.
func (m *Monitor) DeviceDelAndWait(ctx context.Context, id string) error {
	match := func(ev gqmp.Event) bool { return ev.Data["device"] == id }
	_, _, err := m.ExecuteAndWait(ctx, "device_del", deviceID{id}, EventDeviceDeleted, match)
	return err
}

type deviceID struct {
	ID string `json:"id"`
}

// NetdevTap is netdev_add's arguments for a tap backend (QEMU 7.2:
// NetdevTapOptions). Give either Ifname, to open an existing persistent tap
// by name, or FD/FDs, naming descriptors passed earlier with SendFD. QEMU
// rejects ifname, script, downscript, vnet_hdr and queues together with fd.
//
// With Ifname, an empty Script or Downscript is sent as "no": QEMU would
// otherwise run /etc/qemu-ifup and /etc/qemu-ifdown, and qvirt never runs
// scripts.
type NetdevTap struct {
	ID         string `json:"id"`
	Ifname     string `json:"ifname,omitempty"`
	FD         string `json:"fd,omitempty"`
	FDs        string `json:"fds,omitempty"` // colon-separated names, one per queue
	Script     string `json:"script,omitempty"`
	Downscript string `json:"downscript,omitempty"`
	VNetHdr    *bool  `json:"vnet_hdr,omitempty"` // underscore, unlike most QMP names
	Vhost      *bool  `json:"vhost,omitempty"`
	VhostFD    string `json:"vhostfd,omitempty"`
	VhostFDs   string `json:"vhostfds,omitempty"`
	Queues     int    `json:"queues,omitempty"`
}

// MarshalJSON adds "type": "tap" and the script defaults.
func (t NetdevTap) MarshalJSON() ([]byte, error) {
	type plain NetdevTap
	p := plain(t)
	if p.FD == "" && p.FDs == "" {
		p.Script = orNo(p.Script)
		p.Downscript = orNo(p.Downscript)
	}
	return flatten(p, map[string]any{"type": "tap"})
}

func orNo(s string) string {
	if s == "" {
		return "no"
	}
	return s
}

// NetdevAddTap creates a tap network backend.
func (m *Monitor) NetdevAddTap(ctx context.Context, tap NetdevTap) error {
	return m.NetdevAdd(ctx, tap)
}

// NetdevAdd creates a network backend of any type; args must marshal to an
// object with "type" and "id" (QEMU 7.2: the Netdev union).
func (m *Monitor) NetdevAdd(ctx context.Context, args any) error {
	return m.Call(ctx, "netdev_add", args, nil)
}

// NetdevDel removes a network backend.
func (m *Monitor) NetdevDel(ctx context.Context, id string) error {
	return m.Call(ctx, "netdev_del", deviceID{id}, nil)
}

// flatten marshals known, which must encode as a JSON object, and adds
// extra's keys to that object. Keys are then in sorted order.
func flatten(known any, extra map[string]any) ([]byte, error) {
	b, err := json.Marshal(known)
	if err != nil || len(extra) == 0 {
		return b, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, err
	}
	for k, v := range extra {
		if _, dup := obj[k]; dup {
			return nil, fmt.Errorf("property %q given twice", k)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("property %q: %w", k, err)
		}
		obj[k] = raw
	}
	return json.Marshal(obj)
}
