// Package unixsock dials unix sockets by paths of any length. A socket address holds at most 107
// bytes, and the node agent reaches a launcher's sockets through the kubelet's pod directory
// (/var/lib/kubelet/pods/<pod-uid>/volumes/kubernetes.io~empty-dir/sockets/<vmi-uid>/…), which is
// longer: a long path is dialled through an O_PATH descriptor of its directory,
// /proc/self/fd/<n>/<name>, as KubeVirt does.
package unixsock

import (
	"context"
	"errors"
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

// Listen creates a unix socket at path (of any length, as Dial) and listens on it; a stale file
// there is removed first.
func Listen(path string) (net.Listener, error) {
	dir, name := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listen on unix %s: open socket directory: %w", path, err)
	}
	defer unix.Close(fd)
	short := filepath.Join("/proc/self/fd", strconv.Itoa(fd), name)
	if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return nil, fmt.Errorf("listen on unix %s: remove the stale socket: %w", path, err)
	}
	ln, err := net.Listen("unix", short)
	if err != nil {
		return nil, fmt.Errorf("listen on unix %s: %w", path, err)
	}
	// The short name is gone with the descriptor: the listener must not unlink by it on Close.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	return ln, nil
}

// Chown gives the socket at path (of any length) to uid:gid. A symlink put there meanwhile is
// changed itself, never its target: the directory may be a tenant's.
func Chown(path string, uid, gid int) error {
	return inDir(path, func(fd int, name string) error {
		if err := unix.Fchownat(fd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown %s: %w", path, err)
		}
		return nil
	})
}

// Remove removes the socket at path (of any length); a missing one is no error.
func Remove(path string) error {
	return inDir(path, func(fd int, name string) error {
		if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		return nil
	})
}

func inDir(path string, f func(fd int, name string) error) error {
	dir, name := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open socket directory of %s: %w", path, err)
	}
	defer unix.Close(fd)
	return f(fd, name)
}
