package launcher_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestVirtiofsGuest shares a ConfigMap volume and a claim with the test guest as KubeVirt's
// spec.domain.devices.filesystems write them, translated as the node agent does, with the two
// directories standing where the launcher pod mounts them. The launcher runs QEMU's virtiofsd for
// each, unprivileged in a user namespace of its own: the guest mounts both by tag, reads the
// ConfigMap's file and writes into the claim, and the file shows up on the host. When one daemon
// dies, the launcher ends QEMU saying which, and the other daemon goes with it.
func TestVirtiofsGuest(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(launcher.DefaultVirtiofsd); err != nil {
		t.Fatalf("%s: %v (qemu-system-common installs it with QEMU)", launcher.DefaultVirtiofsd, err)
	}
	vmi := guestVMI(t)
	vmi.Spec.Volumes = append(vmi.Spec.Volumes,
		v1alpha1.Volume{Name: "app-config", VolumeSource: v1alpha1.VolumeSource{ConfigMap: &v1alpha1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: "app-config"}}}},
		v1alpha1.Volume{Name: "shared-data", VolumeSource: v1alpha1.VolumeSource{PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{
			ClaimName: "shared-data"}}})
	vmi.Spec.Domain.Devices.Filesystems = []v1alpha1.Filesystem{
		{Name: "app-config", Virtiofs: &v1alpha1.FilesystemVirtiofs{}},
		{Name: "shared-data", Virtiofs: &v1alpha1.FilesystemVirtiofs{}},
	}
	m, err := translate.Machine(vmi, translate.Host{Emulation: true, Pod: &translate.PodVolumes{Claims: map[string]translate.Claim{
		"shared-data": {CapacityBytes: 1 << 30}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Filesystems) != 2 || m.Filesystems[0].Dir != "/var/run/qvirt/config-volumes/app-config" || m.Filesystems[1].Dir != "/var/run/qvirt/claims/shared-data" {
		t.Fatalf("filesystems %+v, want the config volume's and the claim's mounts in the pod", m.Filesystems)
	}
	// Where the pod would mount them.
	configDir, claimDir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(configDir, "greeting"), []byte("hello-from-configmap\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	m.Filesystems[0].Dir, m.Filesystems[1].Dir = configDir, claimDir

	v := newLauncher(t)
	ctx := context.Background()
	start := time.Now()
	if st, err := v.client.Sync(ctx, &protocol.SyncRequest{Machine: *m}); err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	t.Logf("guest ready %s after sync", time.Since(start).Round(time.Millisecond))
	run := func(t *testing.T, line, want string) {
		t.Helper()
		from := len(c.Text())
		c.Send(t, line)
		c.Expect(t, from, want, time.Minute)
	}

	t.Run("the guest mounts the ConfigMap by its tag and reads its file", func(t *testing.T) {
		run(t, `mkdir -p /mnt/cfg /mnt/data && mount -t virtiofs app-config /mnt/cfg && echo "CFG-[$(cat /mnt/cfg/greeting)]"`,
			"CFG-[hello-from-configmap]")
	})
	t.Run("a file the guest writes into the claim is on the host", func(t *testing.T) {
		run(t, `mount -t virtiofs shared-data /mnt/data && echo written-by-guest > /mnt/data/note && sync && echo "WROTE-$((40+2))"`, "WROTE-42")
		got, err := os.ReadFile(filepath.Join(claimDir, "note"))
		if err != nil || string(got) != "written-by-guest\n" {
			t.Fatalf("the claim's note on the host: %q %v, want the guest's line", got, err)
		}
		// And a file the host adds afterwards is in the guest.
		if err := os.WriteFile(filepath.Join(claimDir, "from-host"), []byte("host-line\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		run(t, `echo "HOST-[$(cat /mnt/data/from-host)]"`, "HOST-[host-line]")
	})
	t.Run("virtiofsd runs in its own user namespace", func(t *testing.T) {
		pids := daemonsServing(t, false, configDir, claimDir)
		if len(pids) != 2 {
			t.Fatalf("virtiofsd processes serving the two directories: %v, want 2", pids)
		}
		self, err := os.Readlink("/proc/self/ns/user")
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			ns, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/user")
			if err != nil || ns == self {
				t.Errorf("virtiofsd %d's user namespace %q %v, want its own (the launcher's is %s)", pid, ns, err, self)
			}
		}
	})
	t.Run("a daemon that dies ends QEMU, saying which, and the other daemon with it", func(t *testing.T) {
		pids := daemonsServing(t, false, configDir)
		if len(pids) != 1 {
			t.Fatalf("the ConfigMap's virtiofsd: %v", pids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "QEMU to exit", func() bool {
			st, err := v.client.Status(ctx)
			return err == nil && st.Exit != nil
		})
		st, _ := v.client.Status(ctx)
		if st.Exit.Reason != protocol.ExitCrashed || !strings.Contains(st.Exit.Detail, `virtiofsd of filesystem "app-config" ended`) {
			t.Fatalf("exit %q (%s), want %q naming the app-config filesystem's virtiofsd", st.Exit.Reason, st.Exit.Detail, protocol.ExitCrashed)
		}
		waitFor(t, 10*time.Second, "the claim's virtiofsd and both sandboxed workers to end", func() bool { return len(daemonsServing(t, true, configDir, claimDir)) == 0 })
	})
}

// daemonsServing are the pids of the virtiofsd processes the launcher started whose source is one
// of dirs (each test's own temporary directories, so no other test's daemons). Each forks its
// sandboxed worker, which daemonsServing counts too when all is set.
func daemonsServing(t *testing.T, all bool, dirs ...string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		args := strings.Split(string(raw), "\x00")
		if args[0] != launcher.DefaultVirtiofsd || !all && parent(e.Name()) != os.Getpid() {
			continue
		}
		for _, d := range dirs {
			for _, a := range args {
				if a == "source="+d {
					out = append(out, pid)
				}
			}
		}
	}
	return out
}

// parent is process pid's parent, from /proc/PID/stat (the field after the command's parenthesis).
func parent(pid string) int {
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// TestVirtiofsRefusals: a filesystem whose directory is missing is refused before anything
// starts, naming the field; a tag longer than virtio-fs's 36 bytes is refused in the argv.
func TestVirtiofsRefusals(t *testing.T) {
	vmi := guestVMI(t)
	m, err := translate.Machine(vmi, translate.Host{Emulation: true})
	if err != nil {
		t.Fatal(err)
	}
	m.Filesystems = append(m.Filesystems, machineFS("gone", filepath.Join(t.TempDir(), "absent")))
	_, err = launcher.HostResolver{}.Resolve(m, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "machine.filesystems[0].dir") {
		t.Fatalf("resolve a missing shared directory: %v, want an error at machine.filesystems[0].dir", err)
	}
	m.Filesystems[0] = machineFS(strings.Repeat("t", 37), t.TempDir())
	lm, err := launcher.HostResolver{}.Resolve(m, shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := launcher.BuildArgv(lm); err == nil || !strings.Contains(err.Error(), "machine.filesystems[0].name") {
		t.Fatalf("argv with a 37-byte tag: %v, want an error at machine.filesystems[0].name", err)
	}
}

// TestVirtiofsArgv: with a filesystem, the guest's RAM is a shared memfd the machine uses, and the
// vhost-user-fs device connects to the filesystem's socket in the run directory with its tag.
func TestVirtiofsArgv(t *testing.T) {
	m, err := translate.Machine(guestVMI(t), translate.Host{Emulation: true})
	if err != nil {
		t.Fatal(err)
	}
	m.Filesystems = []machine.Filesystem{machineFS("data", t.TempDir())}
	runDir := shortDir(t)
	lm, err := launcher.HostResolver{}.Resolve(m, runDir)
	if err != nil {
		t.Fatal(err)
	}
	argv, err := launcher.BuildArgv(lm)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.Join(argv, " ")
	for _, want := range []string{
		// 256 MiB and 8 KiB, as -m: under TCG the RAM is not a multiple of 256 KiB (cpu.go).
		"-m 262152K -object memory-backend-memfd,id=guest-ram,size=262152K,share=on",
		",memory-backend=guest-ram",
		"-chardev socket,id=chr-fs-data,path=" + runDir + "/fs0.sock",
		"-device vhost-user-fs-pci,id=fs-data,chardev=chr-fs-data,tag=data,bus=port-fs-data",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("argv lacks %q:\n%s", want, line)
		}
	}
	m.Filesystems = nil
	lm, _ = launcher.HostResolver{}.Resolve(m, runDir)
	if argv, _ := launcher.BuildArgv(lm); strings.Contains(strings.Join(argv, " "), "memory-backend") {
		t.Errorf("a machine without filesystems has a memory backend: %v", argv)
	}
}

// shortDir is a run directory short enough for socket paths.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "qvt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func machineFS(name, dir string) machine.Filesystem {
	return machine.Filesystem{Name: name, Kind: "persistentVolumeClaim", Dir: dir}
}

// TestVirtiofsUnprivilegedLauncher runs `qvirt-launcher run` as an unprivileged user (nobody, as
// the launcher pod's user is not root) with a claim shared as a filesystem: virtiofsd starts in
// its user namespace without any privilege, the guest's root writes a file into the share, and on
// the host the file belongs to the launcher's user.
func TestVirtiofsUnprivilegedLauncher(t *testing.T) {
	t.Parallel()
	u := newUnprivileged(t)
	share := u.open(t.TempDir())
	if err := os.Chown(share, u.uid, u.gid); err != nil {
		t.Fatal(err)
	}
	vmi := u.vmi(t)
	vmi.Spec.Domain.Devices.Disks, vmi.Spec.Volumes = nil, []v1alpha1.Volume{{Name: "data", VolumeSource: v1alpha1.VolumeSource{
		PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
	vmi.Spec.Domain.Devices.Filesystems = []v1alpha1.Filesystem{{Name: "data", Virtiofs: &v1alpha1.FilesystemVirtiofs{}}}
	m, err := translate.Machine(vmi, translate.Host{Emulation: true, Pod: &translate.PodVolumes{Claims: map[string]translate.Claim{"data": {CapacityBytes: 1 << 30}}}})
	if err != nil {
		t.Fatal(err)
	}
	m.Filesystems[0].Dir = share
	r := u.run(t, m)
	cmd, stdin, stdout, stderr := r.cmd, r.stdin, &r.stdout, &r.stderr
	r.waitReady(t)
	uid, gid := u.uid, u.gid
	_, _ = stdin.Write([]byte(`mkdir -p /mnt/data && mount -t virtiofs data /mnt/data && echo from-guest > /mnt/data/note && sync && echo "SHARED-$((40+2))"` + "\n"))
	waitFor(t, time.Minute, "the guest's write", func() bool { return strings.Contains(stdout.String(), "SHARED-42") })
	st, err := os.Stat(filepath.Join(share, "note"))
	if err != nil {
		t.Fatalf("the guest's file on the host: %v; stderr:\n%s", err, testutil.Tail(stderr.String(), 2000))
	}
	if sys := st.Sys().(*syscall.Stat_t); int(sys.Uid) != uid || int(sys.Gid) != gid {
		t.Errorf("the guest's file belongs to %d:%d on the host, want the launcher's %d:%d", sys.Uid, sys.Gid, uid, gid)
	}
	_, _ = stdin.Write([]byte("poweroff\n"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("qvirt-launcher run exited with %v; stderr:\n%s", err, testutil.Tail(stderr.String(), 2000))
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the guest did not power off; stdout tail:\n%s", testutil.Tail(stdout.String(), 500))
	}
}

// unprivileged runs `qvirt-launcher run` as an unprivileged user, as in a launcher pod: the test's
// own user, or nobody when the test runs as root.
type unprivileged struct {
	uid, gid int
	bin      string // the launcher, built for the test
	guest    string // the test guest's kernel and initrd
}

func newUnprivileged(t *testing.T) *unprivileged {
	t.Helper()
	const nobody = 65534
	u := &unprivileged{uid: os.Getuid(), gid: os.Getgid()}
	if u.uid == 0 {
		u.uid, u.gid = nobody, nobody
	}
	u.bin = filepath.Join(u.open(t.TempDir()), "qvirt-launcher")
	if out, err := exec.Command("go", "build", "-o", u.bin, "../cmd/qvirt-launcher").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	u.guest = u.open(t.TempDir())
	for _, f := range []string{"vmlinuz", "initrd.img"} {
		data, err := os.ReadFile(filepath.Join(guestDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(u.guest, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return u
}

// open lets the user reach dir: everything the launcher reads lies in such a directory
// (t.TempDir is the test's user's only, and so is its parent, the test's own directory).
func (u *unprivileged) open(dir string) string {
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			panic(err)
		}
	}
	return dir
}

// vmi is the test guest, booted from the copy the user can read.
func (u *unprivileged) vmi(t *testing.T) *v1alpha1.VirtualMachineInstance {
	vmi := guestVMI(t)
	vmi.Spec.Domain.Firmware.KernelBoot.Container.Image = "file://" + u.guest
	return vmi
}

type unprivilegedRun struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr testutil.SyncBuffer
}

// run starts `qvirt-launcher run -f` of m as the user; the test ends it.
func (u *unprivileged) run(t *testing.T, m *machine.Machine) *unprivilegedRun {
	t.Helper()
	desc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(u.open(t.TempDir()), "vm.json")
	if err := os.WriteFile(file, desc, 0o644); err != nil {
		t.Fatal(err)
	}
	r := &unprivilegedRun{cmd: exec.Command(u.bin, "run", "-f", file)}
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(u.uid), Gid: uint32(u.gid)}, Setpgid: true}
	r.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nonexistent", "TMPDIR=/tmp"}
	r.stdin, _ = r.cmd.StdinPipe()
	r.cmd.Stdout, r.cmd.Stderr = &r.stdout, &r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL); _ = r.cmd.Wait() })
	return r
}

// waitReady waits for the guest's banner on the console (the launcher's stdout).
func (r *unprivilegedRun) waitReady(t *testing.T) {
	t.Helper()
	waitFor(t, bootTimeout, "QVIRT-GUEST-READY on stdout", func() bool {
		return strings.Contains(r.stdout.String(), "QVIRT-GUEST-READY") || r.cmd.ProcessState != nil
	})
	if !strings.Contains(r.stdout.String(), "QVIRT-GUEST-READY") {
		t.Fatalf("no guest; stderr:\n%s", testutil.Tail(r.stderr.String(), 2000))
	}
	time.Sleep(500 * time.Millisecond)
}
