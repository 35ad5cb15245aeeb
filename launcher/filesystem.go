package launcher

// The shared filesystem kind (KubeVirt's filesystems with virtiofs): a vhost-user-fs PCI device
// on its own root port whose back end is a virtiofsd the launcher runs for it, one per filesystem,
// serving a directory of the launcher's pod. The guest mounts it by its tag, the filesystem's name.
// Fixed when QEMU starts: cold form only.
//
// virtiofsd is QEMU 7.2's C daemon (Debian's qemu-system-common). It confines itself to the shared
// directory with a sandbox, and both of its sandboxes need privileges the launcher does not have:
// "chroot" calls chroot(2), "namespace" (the default) unshares mount, pid and network namespaces
// and pivots into the directory. The launcher therefore starts it in a user namespace of its own
// where the launcher's uid and gid are the only ones mapped, to 0: there it may chroot, and it
// holds nothing outside it (every file it creates belongs to the launcher's uid on the host, and
// a guest user other than root, whose uid is not mapped, cannot create files). The chroot sandbox,
// not the namespace one: that one mounts a new /proc, which the kernel refuses in a user namespace
// when the container runtime has masked parts of the pod's /proc, as runc does. The user namespace
// needs clone(CLONE_NEWUSER), which the runtime's default seccomp profile refuses without
// CAP_SYS_ADMIN: the launcher pod of an instance with filesystems runs without that profile
// (controllers/vmi). virtiofsd gets its listening socket from the launcher (--fd), so it needs no
// lock directory under /var/run either.

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/qvirt/qvirt/machine"
)

// DefaultVirtiofsd is QEMU's virtiofsd as Debian installs it (qemu-system-common).
const DefaultVirtiofsd = "/usr/lib/qemu/virtiofsd"

// GuestRAMID is the id of the guest's RAM backend when it must be shared (a machine with
// filesystems).
const GuestRAMID = "guest-ram"

// maxFilesystemTag is the length of virtio-fs's tag field (QEMU's vhost-user-fs refuses longer).
const maxFilesystemTag = 36

// FilesystemDeviceID is the -device id of filesystem name: "fs-<name>".
func FilesystemDeviceID(name string) string { return "fs-" + name }

// FilesystemChardevID is the -chardev id of filesystem name's vhost-user socket.
func FilesystemChardevID(name string) string { return "chr-fs-" + name }

// FilesystemSocket is where the virtiofsd of the machine's filesystem i (from 0) listens; QEMU
// connects to it. By index, so a long name cannot make the path too long for a socket address.
func (m *Machine) FilesystemSocket(i int) string { return Dir(m.RunDir).Filesystem(i) }

// Filesystem is the vhost-user socket of filesystem i.
func (d Dir) Filesystem(i int) string { return string(d) + "/fs" + strconv.Itoa(i) + ".sock" }

// filesystems adds a vhost-user-fs device per filesystem, each on its own root port.
func (b *builder) filesystems() {
	for i, f := range b.m.Filesystems {
		p := machinePath.Child("filesystems").Index(i)
		if !b.unique(p.Child("name"), "fs", f.Name) {
			continue
		}
		if len(f.Name) > maxFilesystemTag {
			b.fail(machine.Invalid(p.Child("name"), f.Name, fmt.Sprintf("must be at most %d bytes: it is the virtio-fs tag", maxFilesystemTag)))
			continue
		}
		b.checkAbs(p.Child("dir"), f.Dir)
		if s := b.m.FilesystemSocket(i); len(s) > maxSocketLen {
			b.fail(machine.Invalid(machinePath.Child("runDir"), b.m.RunDir, fmt.Sprintf("too long: socket path %s exceeds the %d bytes of a unix socket address", s, maxSocketLen)))
			continue
		}
		b.devs = append(b.devs,
			"-chardev", "socket,id="+FilesystemChardevID(f.Name)+",path="+optEscape(b.m.FilesystemSocket(i)),
			"-device", "vhost-user-fs-pci,id="+FilesystemDeviceID(f.Name)+",chardev="+FilesystemChardevID(f.Name)+
				",tag="+f.Name+",bus="+b.rootPort("port-"+FilesystemDeviceID(f.Name)))
	}
}

// sharedDir checks that filesystem f's directory is one in this pod (its volume is mounted).
func sharedDir(p machine.Path, f machine.Filesystem) *machine.FieldError {
	if err := absPath(p, f.Dir); err != nil {
		return err
	}
	st, err := os.Stat(f.Dir)
	switch {
	case err != nil:
		return machine.Invalid(p, f.Dir, fmt.Sprintf("the %s volume's directory: %v (the launcher pod mounts it)", f.Kind, err))
	case !st.IsDir():
		return machine.Invalid(p, f.Dir, "not a directory")
	}
	return nil
}

// startFilesystem starts the virtiofsd of filesystem f, listening on socket before it returns, so
// QEMU finds it when it starts.
func (d *daemons) startFilesystem(f machine.Filesystem, socket, virtiofsd string) error {
	st, err := os.Stat(f.Dir)
	if err != nil {
		return fmt.Errorf("shared directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("shared directory %s is not a directory", f.Dir)
	}
	sock, err := listenFor(socket)
	if err != nil {
		return err
	}
	defer sock.Close()
	cmd := exec.Command(virtiofsd,
		"--fd=3", "-o", "source="+f.Dir, "-o", "sandbox=chroot", "-o", "cache=auto",
		// The hard limit of open files cannot be raised without CAP_SYS_RESOURCE on the host.
		"--rlimit-nofile=0")
	cmd.ExtraFiles = []*os.File{sock}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Pdeathsig:                  syscall.SIGKILL,
		Cloneflags:                 syscall.CLONE_NEWUSER,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		GidMappingsEnableSetgroups: false,
	}
	// virtiofsd exits 0 when QEMU closes its socket, which QEMU does only as it ends (a guest
	// powering off): no failure, and QEMU's own exit tells why.
	_, err = d.run(daemon{name: "virtiofsd", of: fmt.Sprintf("filesystem %q", f.Name), cmd: cmd}, d.log.WithValues("filesystem", f.Name, "dir", f.Dir))
	return err
}
