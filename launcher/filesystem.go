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
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"

	"github.com/go-logr/logr"

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

// fsDaemons are the virtiofsd processes of one QEMU.
type fsDaemons struct {
	log  logr.Logger
	mu   sync.Mutex
	cmds []*exec.Cmd
	// stopping is set once the launcher ends them, so their exit is not a failure.
	stopping bool
	// failed receives the first daemon that ended on its own while QEMU needed it.
	failed chan error
}

// startFilesystems starts a virtiofsd for each of m's filesystems, listening on its socket before
// it returns, so QEMU finds them when it starts. The daemons die with the launcher.
func startFilesystems(m *Machine, virtiofsd string, log logr.Logger) (*fsDaemons, error) {
	d := &fsDaemons{log: log, failed: make(chan error, 1)}
	for i, f := range m.Filesystems {
		if err := d.start(i, f, m.FilesystemSocket(i), virtiofsd); err != nil {
			d.stop()
			return nil, fmt.Errorf("filesystem %q: %w", f.Name, err)
		}
	}
	return d, nil
}

func (d *fsDaemons) start(i int, f machine.Filesystem, socket, virtiofsd string) error {
	st, err := os.Stat(f.Dir)
	if err != nil {
		return fmt.Errorf("shared directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("shared directory %s is not a directory", f.Dir)
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen for QEMU: %w", err)
	}
	// virtiofsd owns the socket from here; the launcher's copy only keeps it from being removed
	// when closed.
	ln.SetUnlinkOnClose(false)
	sock, err := ln.File()
	_ = ln.Close()
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
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s in a user namespace: %w", virtiofsd, err)
	}
	d.mu.Lock()
	d.cmds = append(d.cmds, cmd)
	d.mu.Unlock()
	log := d.log.WithValues("filesystem", f.Name, "pid", cmd.Process.Pid)
	log.Info("virtiofsd started", "dir", f.Dir)
	tail := newTailBuffer(1024)
	copied := make(chan struct{})
	go copyLines(stderr, copied, func(line string) {
		tail.Write([]byte(line + "\n"))
		log.Info("virtiofsd", "stderr", line)
	})
	go func() {
		<-copied
		err := cmd.Wait()
		d.mu.Lock()
		stopping := d.stopping
		d.mu.Unlock()
		// virtiofsd exits 0 when QEMU closes its socket, which QEMU does only as it ends (a guest
		// powering off): no failure, and QEMU's own exit tells why.
		if stopping || err == nil {
			log.Info("virtiofsd ended", "error", err)
			return
		}
		log.Error(err, "virtiofsd ended while the guest needs it")
		select {
		case d.failed <- fmt.Errorf("virtiofsd of filesystem %q ended (%v): %s", f.Name, err, tail.String()):
		default:
		}
	}()
	return nil
}

// stop ends the daemons (QEMU has ended or failed to start).
func (d *fsDaemons) stop() {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.stopping = true
	cmds := d.cmds
	d.mu.Unlock()
	for _, c := range cmds {
		_ = c.Process.Kill()
	}
}

// watch kills QEMU when a daemon ends before it: the guest's filesystem would hang otherwise. The
// exit says which daemon ended.
func (d *fsDaemons) watch(p *Process) {
	select {
	case err := <-d.failed:
		p.daemonFailed(err)
	case <-p.exited:
	}
}

func copyLines(r io.Reader, done chan<- struct{}, line func(string)) {
	defer close(done)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line(sc.Text())
	}
}
