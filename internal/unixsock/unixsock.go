// Package unixsock dials unix sockets by paths of any length. A socket address holds at most 107
// bytes, and the node agent reaches a launcher's sockets through the kubelet's pod directory
// (/var/lib/kubelet/pods/<pod-uid>/volumes/kubernetes.io~empty-dir/sockets/<vmi-uid>/…), which is
// longer: a long path is dialled through an O_PATH descriptor of its directory,
// /proc/self/fd/<n>/<name>, as KubeVirt does.
package unixsock

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// maxPath is the longest path a sockaddr_un holds, without its terminating NUL.
const maxPath = len(unix.RawSockaddrUnix{}.Path) - 1

// Dial connects to the unix socket at path.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxPath {
		return d.DialContext(ctx, "unix", path)
	}
	dir, name := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"},
			Err: fmt.Errorf("open socket directory: %w", err)}
	}
	defer unix.Close(fd)
	short := filepath.Join("/proc/self/fd", strconv.Itoa(fd), name)
	conn, err := d.DialContext(ctx, "unix", short)
	if err != nil {
		return nil, fmt.Errorf("dial unix %s: %w", path, err)
	}
	return conn, nil
}
