// Package podinit is the first process of a container on a virtual node, as runc's init is on a
// real one. The provider starts it as root in the container's new PID and mount namespaces; it
// mounts a /proc of that PID namespace (so the container sees only its own processes, and none of
// another pod's /proc/<pid>/root or /mem), drops to the container's user and group, and execs the
// container's binary, which becomes PID 1 of the namespace.
//
// Go cannot run code between fork and exec, so this step is a binary of its own
// (cmd/qvirt-pod-init) rather than code in the provider.
package podinit

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Args are the init's command line for a container that runs path with argv as cred (nil: the
// provider's own user), for the provider to put after the init binary's path.
func Args(path string, argv []string, cred *syscall.Credential) []string {
	out := []string{}
	if cred != nil {
		out = append(out, fmt.Sprintf("--uid=%d", cred.Uid), fmt.Sprintf("--gid=%d", cred.Gid))
	}
	out = append(out, "--", path)
	return append(out, argv...)
}

// Main runs the init with args (without the program name) and does not return on success.
func Main(args []string) error {
	fs := flag.NewFlagSet("qvirt-pod-init", flag.ContinueOnError)
	uid := fs.Int("uid", -1, "user to run the container as (-1: stay root)")
	gid := fs.Int("gid", -1, "group to run the container as (-1: the uid's number)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rest := fs.Args()
	if len(rest) < 2 {
		return errors.New("usage: qvirt-pod-init [--uid N --gid N] -- PATH ARGV0 [ARGS...]")
	}
	if os.Getpid() != 1 {
		return fmt.Errorf("qvirt-pod-init must be PID 1 of a new PID namespace, it is PID %d", os.Getpid())
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc of the container's PID namespace: %w", err)
	}
	if err := dropTo(*uid, *gid); err != nil {
		return err
	}
	path, argv := rest[0], rest[1:]
	if err := unix.Exec(path, argv, os.Environ()); err != nil {
		return fmt.Errorf("exec %s: %w", path, err)
	}
	return nil
}

// dropTo switches every thread to uid and gid with no supplementary groups; uid -1 keeps root.
func dropTo(uid, gid int) error {
	if uid < 0 {
		return nil
	}
	if gid < 0 {
		gid = uid
	}
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("drop supplementary groups: %w", err)
	}
	if err := syscall.Setgid(gid); err != nil {
		return fmt.Errorf("setgid %d: %w", gid, err)
	}
	if err := syscall.Setuid(uid); err != nil {
		return fmt.Errorf("setuid %d: %w", uid, err)
	}
	return nil
}
