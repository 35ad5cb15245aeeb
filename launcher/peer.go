package launcher

import (
	"context"
	"fmt"
	"net"

	"github.com/qvirt/qvirt/internal/unixsock"
	"golang.org/x/sys/unix"
)

// Peer is the process serving a launcher socket, as the kernel reports it (SO_PEERCRED), in the
// caller's PID namespace. The node agent (hostPID on a real node) reaches the launcher pod's
// network namespace through /proc/<PID>/ns/net and makes the guest's tap owned by UID and GID.
type Peer struct {
	PID      int
	UID, GID uint32
}

// NetNSPath is the peer's network namespace.
func (p Peer) NetNSPath() string { return fmt.Sprintf("/proc/%d/ns/net", p.PID) }

// PeerOf connects to the launcher's command socket and reports who serves it.
func PeerOf(ctx context.Context, socket string) (Peer, error) {
	conn, err := unixsock.Dial(ctx, socket)
	if err != nil {
		return Peer{}, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return Peer{}, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Peer{}, err
	}
	if credErr != nil {
		return Peer{}, fmt.Errorf("peer credentials of %s: %w", socket, credErr)
	}
	return Peer{PID: int(cred.Pid), UID: cred.Uid, GID: cred.Gid}, nil
}
