package guestagent

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"unicode/utf8"
)

// Info is guest-info: the agent's version and the commands it has enabled.
type Info struct {
	Version string
	// Commands are the enabled commands, at most MaxItems of them (qemu-ga 7.2 has about 50).
	Commands []string
}

// OSInfo is guest-get-osinfo: the guest's os-release and uname.
type OSInfo struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	PrettyName    string `json:"pretty-name"`
	Version       string `json:"version"`
	VersionID     string `json:"version-id"`
	Variant       string `json:"variant"`
	VariantID     string `json:"variant-id"`
	KernelRelease string `json:"kernel-release"`
	KernelVersion string `json:"kernel-version"`
	Machine       string `json:"machine"`
}

// Interface is one of guest-network-get-interfaces' interfaces.
type Interface struct {
	Name string
	// MAC is the hardware address as the guest reports it (lower case), "" when none.
	MAC string
	// Addresses are the valid IP addresses, IPv4 and IPv6, in the guest's order.
	Addresses []Address
}

// Address is an interface address with its prefix length.
type Address struct {
	IP     netip.Addr
	Prefix int
}

// User is one of guest-get-users' logged-in users.
type User struct {
	Name   string
	Domain string
	// LoginTime is seconds since the epoch, as the guest says.
	LoginTime float64
}

// Filesystem is one of guest-get-fsinfo's mounted filesystems.
type Filesystem struct {
	Name       string
	Mountpoint string
	Type       string
	UsedBytes  uint64
	TotalBytes uint64
	Disks      []FilesystemDisk
}

// FilesystemDisk is a disk under a filesystem.
type FilesystemDisk struct {
	Serial  string
	BusType string
}

// Ping is guest-ping.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.call(ctx, "guest-ping", nil)
	return err
}

// Info runs guest-info.
func (c *Client) Info(ctx context.Context) (Info, error) {
	raw, err := c.call(ctx, "guest-info", nil)
	if err != nil {
		return Info{}, err
	}
	return DecodeInfo(raw)
}

// OSInfo runs guest-get-osinfo.
func (c *Client) OSInfo(ctx context.Context) (OSInfo, error) {
	raw, err := c.call(ctx, "guest-get-osinfo", nil)
	if err != nil {
		return OSInfo{}, err
	}
	return DecodeOSInfo(raw)
}

// Interfaces runs guest-network-get-interfaces.
func (c *Client) Interfaces(ctx context.Context) ([]Interface, error) {
	raw, err := c.call(ctx, "guest-network-get-interfaces", nil)
	if err != nil {
		return nil, err
	}
	return DecodeInterfaces(raw)
}

// Users runs guest-get-users.
func (c *Client) Users(ctx context.Context) ([]User, error) {
	raw, err := c.call(ctx, "guest-get-users", nil)
	if err != nil {
		return nil, err
	}
	return DecodeUsers(raw)
}

// Filesystems runs guest-get-fsinfo.
func (c *Client) Filesystems(ctx context.Context) ([]Filesystem, error) {
	raw, err := c.call(ctx, "guest-get-fsinfo", nil)
	if err != nil {
		return nil, err
	}
	return DecodeFilesystems(raw)
}

// Hostname runs guest-get-host-name.
func (c *Client) Hostname(ctx context.Context) (string, error) {
	raw, err := c.call(ctx, "guest-get-host-name", nil)
	if err != nil {
		return "", err
	}
	var r struct {
		Name string `json:"host-name"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", fmt.Errorf("guest-get-host-name: %w", err)
	}
	return clip(r.Name), nil
}

// FreezeStatus runs guest-fsfreeze-status: "thawed" or "frozen".
func (c *Client) FreezeStatus(ctx context.Context) (string, error) {
	raw, err := c.call(ctx, "guest-fsfreeze-status", nil)
	if err != nil {
		return "", err
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("guest-fsfreeze-status: %w", err)
	}
	return clip(s), nil
}

// Freeze runs guest-fsfreeze-freeze and returns how many filesystems were frozen.
func (c *Client) Freeze(ctx context.Context) (int, error) {
	return c.count(ctx, "guest-fsfreeze-freeze")
}

// Thaw runs guest-fsfreeze-thaw and returns how many filesystems were thawed.
func (c *Client) Thaw(ctx context.Context) (int, error) { return c.count(ctx, "guest-fsfreeze-thaw") }

func (c *Client) count(ctx context.Context, cmd string) (int, error) {
	raw, err := c.call(ctx, cmd, nil)
	if err != nil {
		return 0, err
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("%s: %w", cmd, err)
	}
	return n, nil
}

// DecodeInfo decodes guest-info's return value, bounded.
func DecodeInfo(raw json.RawMessage) (Info, error) {
	var r struct {
		Version  string `json:"version"`
		Commands capped[struct {
			Name    string `json:"name"`
			Enabled bool   `json:"enabled"`
		}] `json:"supported_commands"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return Info{}, fmt.Errorf("guest-info: %w", err)
	}
	info := Info{Version: clip(r.Version)}
	for _, c := range r.Commands {
		if c.Enabled {
			info.Commands = append(info.Commands, clip(c.Name))
		}
	}
	return info, nil
}

// DecodeOSInfo decodes guest-get-osinfo's return value, bounded.
func DecodeOSInfo(raw json.RawMessage) (OSInfo, error) {
	var o OSInfo
	if err := json.Unmarshal(raw, &o); err != nil {
		return OSInfo{}, fmt.Errorf("guest-get-osinfo: %w", err)
	}
	for _, s := range []*string{&o.ID, &o.Name, &o.PrettyName, &o.Version, &o.VersionID, &o.Variant,
		&o.VariantID, &o.KernelRelease, &o.KernelVersion, &o.Machine} {
		*s = clip(*s)
	}
	return o, nil
}

// DecodeInterfaces decodes guest-network-get-interfaces' return value: at most MaxItems
// interfaces of at most MaxItems addresses each; addresses that do not parse are left out.
func DecodeInterfaces(raw json.RawMessage) ([]Interface, error) {
	var r capped[struct {
		Name      string `json:"name"`
		MAC       string `json:"hardware-address"`
		Addresses capped[struct {
			Type    string `json:"ip-address-type"`
			Address string `json:"ip-address"`
			Prefix  int    `json:"prefix"`
		}] `json:"ip-addresses"`
	}]
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("guest-network-get-interfaces: %w", err)
	}
	out := make([]Interface, 0, min(len(r), MaxItems))
	for _, in := range r {
		i := Interface{Name: clip(in.Name), MAC: strings.ToLower(clip(in.MAC))}
		for _, a := range in.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || ip.Zone() != "" {
				continue
			}
			if a.Prefix < 0 || a.Prefix > ip.BitLen() {
				continue
			}
			i.Addresses = append(i.Addresses, Address{IP: ip, Prefix: a.Prefix})
		}
		out = append(out, i)
	}
	return out, nil
}

// DecodeUsers decodes guest-get-users' return value, bounded.
func DecodeUsers(raw json.RawMessage) ([]User, error) {
	var r capped[struct {
		User      string  `json:"user"`
		Domain    string  `json:"domain"`
		LoginTime float64 `json:"login-time"`
	}]
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("guest-get-users: %w", err)
	}
	out := make([]User, 0, min(len(r), MaxItems))
	for _, u := range r {
		t := u.LoginTime
		if math.IsNaN(t) || math.IsInf(t, 0) || t < 0 {
			t = 0
		}
		out = append(out, User{Name: clip(u.User), Domain: clip(u.Domain), LoginTime: t})
	}
	return out, nil
}

// DecodeFilesystems decodes guest-get-fsinfo's return value, bounded.
func DecodeFilesystems(raw json.RawMessage) ([]Filesystem, error) {
	var r capped[struct {
		Name       string `json:"name"`
		Mountpoint string `json:"mountpoint"`
		Type       string `json:"type"`
		UsedBytes  uint64 `json:"used-bytes"`
		TotalBytes uint64 `json:"total-bytes"`
		Disks      capped[struct {
			Serial  string `json:"serial"`
			BusType string `json:"bus-type"`
		}] `json:"disk"`
	}]
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("guest-get-fsinfo: %w", err)
	}
	out := make([]Filesystem, 0, min(len(r), MaxItems))
	for _, f := range r {
		fs := Filesystem{Name: clip(f.Name), Mountpoint: clip(f.Mountpoint), Type: clip(f.Type),
			UsedBytes: f.UsedBytes, TotalBytes: f.TotalBytes}
		for _, d := range f.Disks {
			fs.Disks = append(fs.Disks, FilesystemDisk{Serial: clip(d.Serial), BusType: clip(d.BusType)})
		}
		out = append(out, fs)
	}
	return out, nil
}

// clip makes s valid UTF-8 of at most MaxString bytes, cut at a rune boundary.
func clip(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= MaxString {
		return s
	}
	s = s[:MaxString]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
