// Package podsockets finds a launcher's sockets from the node agent's side, and checks who serves
// them. Each launcher pod keeps its sockets in an emptyDir of its own (podlayout.SocketsVolume), so
// no pod can see, create or replace another VMI's sockets; the node agent (root, with the kubelet's
// pods directory mounted) reaches that emptyDir on the host through the pod's UID.
package podsockets

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// Dir is the socket directory of VMI vmiUID in its launcher pod podUID on this node; podsDir is the
// kubelet's pods directory (podlayout.KubeletPodsDir).
func Dir(podsDir string, podUID, vmiUID types.UID) launcher.Dir {
	return launcher.VMIDir(podlayout.HostSocketDir(podsDir, string(podUID)), vmiUID)
}

// ErrNoPodHere is a VMI with no active launcher pod on this node.
var ErrNoPodHere = errors.New("no active launcher pod of the VMI on this node")

// Running is the socket directory of the launcher pod that runs vmi on node: its active pod there
// (status.activePods).
func Running(podsDir, node string, vmi *v1alpha1.VirtualMachineInstance) (launcher.Dir, error) {
	for podUID, n := range vmi.Status.ActivePods {
		if n == node {
			return Dir(podsDir, podUID, vmi.UID), nil
		}
	}
	return "", fmt.Errorf("VMI %s/%s: %w", vmi.Namespace, vmi.Name, ErrNoPodHere)
}

// ErrForeignPeer is a process serving a launcher socket that is not of the launcher pod owning it.
var ErrForeignPeer = errors.New("the process serving the launcher socket is not of the VMI's launcher pod")

// VerifyPeer checks that peer, the process serving dir's launcher.sock, is a process of the pod
// that owns dir: its own view of podlayout.SocketDir/<vmi> is dir itself (same device and inode).
// Only the containers of that pod mount its sockets volume there, so a process of another pod, or
// a stray one on the host, fails the check even if it got hold of the socket.
func VerifyPeer(peer launcher.Peer, dir launcher.Dir) error {
	var want unix.Stat_t
	if err := unix.Stat(string(dir), &want); err != nil {
		return fmt.Errorf("socket directory %s: %w", dir, err)
	}
	inPod := filepath.Join(podlayout.SocketDir, filepath.Base(string(dir)))
	got, err := statInRoot(peer.PID, inPod)
	if err != nil {
		return fmt.Errorf("%w: process %d has no %s: %v", ErrForeignPeer, peer.PID, inPod, err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return fmt.Errorf("%w: process %d (uid %d) sees another directory at %s", ErrForeignPeer, peer.PID, peer.UID, inPod)
	}
	return nil
}

// statInRoot stats path as process pid sees it: resolved inside its root, where an absolute
// symlink (/var/run -> /run, say) stays in the process's filesystem instead of the caller's.
func statInRoot(pid int, path string) (unix.Stat_t, error) {
	var st unix.Stat_t
	root, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return st, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, path, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstat(fd, &st)
	return st, err
}
