package kubenode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// KubeletRootDir is where every node's kubelet keeps its state, as it does on any Kubernetes
// node: inside the node's own mount namespace, where the node's directory is bind-mounted over it.
// Manifests written for real clusters (qvirt-handler's hostPath mounts of /var/lib/kubelet/pods
// and /var/lib/kubelet/device-plugins) then reach the right node's pods and device plugins,
// though several nodes share one host.
const KubeletRootDir = "/var/lib/kubelet"

// nsfsMagic is the statfs type of a namespace file (NSFS_MAGIC).
const nsfsMagic = 0x6e736673

// mountNamespace is the file that holds the node's mount namespace: containerd, its shims and
// runc, the kubelet, and through runc every container of the node's pods live in it. Host
// mounts propagate into it (slave); the kubelet's and containerd's mounts stay in it and go
// with it.
func (n *Node) mountNamespace() string { return n.path("ns", "mnt") }

// createMountNamespace makes the node's mount namespace, with the node's kubelet directory at
// KubeletRootDir, unless it is there already (a restarted node keeps its own).
func (n *Node) createMountNamespace() error {
	file := n.mountNamespace()
	if isNamespaceFile(file) {
		return nil
	}
	// A namespace file can only be bind-mounted onto a mount that is not shared.
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		return err
	}
	if err := os.MkdirAll(KubeletRootDir, 0o755); err != nil {
		return fmt.Errorf("mount point %s: %w", KubeletRootDir, err)
	}
	// Shared within the namespace, as the kubelet's root directory is on a node: containers that
	// mount a part of it with HostToContainer propagation (qvirt-handler) get the volumes the
	// kubelet mounts there later, and containerd refuses them otherwise.
	out, err := exec.Command("/usr/bin/unshare", "--mount="+file, "--propagation=slave",
		"mount", "--bind", "--make-rshared", n.path("kubelet"), KubeletRootDir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount namespace %s: unshare: %w: %s", file, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func isNamespaceFile(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == nsfsMagic
}

// inNamespace is a supervise.Component's Via that runs it inside the node's mount namespace:
// nsenter execs it, so the supervisor's PID is the component's own.
func (n *Node) inNamespace() []string {
	return []string{nsenterPath, "--mount=" + n.mountNamespace(), "--"}
}

// nsenterPath is util-linux's nsenter (Debian's util-linux, essential on every Debian host).
const nsenterPath = "/usr/bin/nsenter"

func checkUtilLinux() error {
	var errs []error
	for _, p := range []string{nsenterPath, "/usr/bin/unshare", "/usr/bin/mount"} {
		if _, err := os.Stat(p); err != nil {
			errs = append(errs, fmt.Errorf("kubenode: %w (Debian's util-linux and mount)", err))
		}
	}
	return errors.Join(errs...)
}
