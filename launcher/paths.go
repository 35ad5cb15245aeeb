package launcher

import (
	"fmt"
	"path/filepath"
)

// Dir is one VMI's socket directory, <socket-dir>/<vmi-uid>: the launcher creates it and its
// sockets in its pod's own sockets volume (podlayout.SocketDir); the node agent finds them through
// the kubelet's pod directory (podlayout.HostSocketDir), a path too long for a socket address, so
// it dials with internal/unixsock.
type Dir string

// VMIDir is the directory of the VMI with uid under socketDir.
func VMIDir[UID ~string](socketDir string, uid UID) Dir {
	return Dir(filepath.Join(socketDir, string(uid)))
}

// Command is the launcher's command socket (package launcher/protocol).
func (d Dir) Command() string { return filepath.Join(string(d), SocketName) }

// QMP is the launcher's own QMP control socket; only the launcher uses it.
func (d Dir) QMP() string { return filepath.Join(string(d), "qmp.sock") }

// ShellQMP is the second QMP monitor, for the operator shell; its users must filter commands.
func (d Dir) ShellQMP() string { return filepath.Join(string(d), "qmp-shell.sock") }

// Serial is the guest's serial console (ttyS0).
func (d Dir) Serial() string { return filepath.Join(string(d), "serial.sock") }

// VNC is the VNC display, when a graphics device is attached.
func (d Dir) VNC() string { return filepath.Join(string(d), "vnc.sock") }

// USBRedir is the socket of USB redirection slot n (from 0), QEMU's server: a client's usbredir
// stream plugs a USB device into the guest.
func (d Dir) USBRedir(n int) string {
	return filepath.Join(string(d), fmt.Sprintf("usbredir-%d.sock", n))
}

// PIDFile is where QEMU writes its pid.
func (d Dir) PIDFile() string { return filepath.Join(string(d), "qemu.pid") }

// MigrationIn is where a migration target's QEMU listens for the guest. Only the pod and the node
// agent reach it: the agent carries the stream there from the source node's agent (handler/migproxy).
func (d Dir) MigrationIn() string { return filepath.Join(string(d), "migration-in.sock") }

// MigrationOut is where the source node's agent listens for the source QEMU's outgoing stream.
func (d Dir) MigrationOut() string { return filepath.Join(string(d), "migration-out.sock") }

// NBDIn is where a migration target's QEMU exports the disks whose contents the source must copy
// (block migration); like MigrationIn, only the pod and the node agent reach it.
func (d Dir) NBDIn() string { return filepath.Join(string(d), "nbd-in.sock") }

// NBDOut is where the source node's agent listens for the source QEMU's NBD connections to the
// target's disks.
func (d Dir) NBDOut() string { return filepath.Join(string(d), "nbd-out.sock") }

// GuestAgent is the host end of the guest agent's virtio-serial channel (org.qemu.guest_agent.0);
// only the launcher connects to it.
func (d Dir) GuestAgent() string { return filepath.Join(string(d), "guest-agent.sock") }

// DownwardMetrics is the host end of the downward metrics port (org.github.vhostmd.1); only the
// launcher connects to it.
func (d Dir) DownwardMetrics() string { return filepath.Join(string(d), "downward-metrics.sock") }
