package launcher

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
)

// The cleanup of an ending launcher pod removes its own files and the directory, but leaves the
// files of a newer launcher pod of the same VMI (which replaced the command socket and started a
// QEMU of its own) and so the directory.
func TestOwnedFilesLeaveANewerPodsFiles(t *testing.T) {
	dir := Dir(filepath.Join(t.TempDir(), "uid"))
	if err := os.MkdirAll(string(dir), 0o750); err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		ln, err := Listen(dir.Command())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln
	}
	write := func(path string) {
		if err := os.WriteFile(path, []byte("1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	old := ownedFiles{}
	listen()
	write(dir.PIDFile())
	old.record(dir.Command(), dir.PIDFile(), dir.QMP()) // no QMP socket: nothing to record
	// A newer pod takes over the command socket; the old pod's QEMU pid file is still there.
	listen()
	if err := old.remove(string(dir)); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := os.Stat(dir.Command()); err != nil {
		t.Errorf("the newer pod's command socket is gone: %v", err)
	}
	if _, err := os.Stat(dir.PIDFile()); err == nil {
		t.Error("the old pod's pid file is still there")
	}

	// The newer pod ends alone: everything goes.
	newer := ownedFiles{}
	newer.record(dir.Command())
	if err := newer.remove(string(dir)); err != nil {
		t.Fatalf("remove: %v", err)
	}
	if _, err := os.Stat(string(dir)); !os.IsNotExist(err) {
		t.Errorf("the socket directory is still there: %v", err)
	}
}

// A launcher pod runs the machine it was made for, on the accelerator its flags say, and tells the
// node agent which protocol versions it speaks.
func TestPodResolverAndInfo(t *testing.T) {
	const uid = "0f8fad5b-d9cb-469f-a165-70867728950e"
	res := podResolver{uid: uid, emulation: true}
	for _, tc := range []struct {
		name  string
		m     machine.Machine
		field string
	}{
		{"another VMI", machine.Machine{UID: "6a1c6d35-6a0e-4b9b-9d3a-0123456789ab", Accel: machine.AccelTCG}, "machine.uid"},
		{"KVM in an emulation pod", machine.Machine{UID: uid, Accel: machine.AccelKVM}, "machine.accel"},
	} {
		_, err := res.Resolve(&tc.m, t.TempDir())
		var fe *machine.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: want an error at %s, got %v", tc.name, tc.field, err)
		}
	}
	if _, err := res.Resolve(&machine.Machine{UID: uid, Accel: machine.AccelTCG}, t.TempDir()); err != nil {
		t.Errorf("its own machine: %v", err)
	}

	sock := filepath.Join(t.TempDir(), SocketName)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = Serve(ctx, sock, New(t.TempDir(), res, Options{}), logr.Discard()) }()
	c := NewClient(sock)
	defer c.Close()
	var info machine.Info
	var err error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if info, err = c.Info(ctx); err == nil {
			break
		}
	}
	if err != nil || !slices.Equal(info.Protocols, []string{machine.Protocol}) {
		t.Fatalf("info %+v, %v; want protocols [%s]", info, err, machine.Protocol)
	}
}

// A launcher pod refuses file:// images, kernel and containerDisk alike: in a cluster such a
// reference names a path on the node, which the tenant does not own. Only the test-only
// host.FileImagesInPod (flag --allow-file-images, which the pod renderer never sets) lets them through.
func TestPodResolverRefusesFileImages(t *testing.T) {
	const uid = "0f8fad5b-d9cb-469f-a165-70867728950e"
	img := t.TempDir()
	if err := os.WriteFile(filepath.Join(img, "vmlinuz"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := machine.ImageRef{Ref: "file://" + img}
	kernel := machine.Machine{UID: uid, Accel: machine.AccelTCG, Kernel: &machine.KernelBoot{Image: file, KernelPath: "/vmlinuz"}}
	disk := machine.Disk{Name: "root", Source: machine.Source{Container: &machine.Container{Image: file, Path: "/vmlinuz"}}}

	refusing := podResolver{uid: uid, emulation: true}
	_, err := refusing.Resolve(&kernel, t.TempDir())
	var fe *machine.FieldError
	if !errors.As(err, &fe) || fe.Field != "machine.kernel.image.ref" || !strings.Contains(fe.Error(), "file://") {
		t.Errorf("kernel from a file:// image: want an error at machine.kernel.image.ref naming file://, got %v", err)
	}
	_, fe = refusing.ResolveDisk(&disk, t.TempDir(), machinePath.Child("disks").Index(0))
	if fe == nil || fe.Field != "machine.disks[0].source.container.image.ref" {
		t.Errorf("containerDisk from a file:// image: want an error at machine.disks[0].source.container.image.ref, got %v", fe)
	}

	allowing := podResolver{host: HostResolver{FileImagesInPod: true}, uid: uid, emulation: true}
	if _, err := allowing.Resolve(&kernel, t.TempDir()); err != nil {
		t.Errorf("with FileImagesInPod: %v", err)
	}
}

// TestTerminationMessageSaysTerminated: the pod's termination message tells a guest the launcher
// stopped because it was told to (SIGTERM, as after a liveness kill) from one that ended by itself,
// so that the VMI reconciler can fail the instance when the node agent missed the launcher's status.
func TestTerminationMessageSaysTerminated(t *testing.T) {
	exit := protocol.Exit{Reason: protocol.ExitGuestShutdown}
	if got, want := terminationMessage(exit, true), podlayout.TerminatedMessagePrefix+"guest shutdown"; got != want {
		t.Errorf("terminated: %q, want %q", got, want)
	}
	killed := protocol.Exit{Reason: protocol.ExitKilled, Detail: "signal killed"}
	if got, want := terminationMessage(killed, false), "killed: signal killed"; got != want {
		t.Errorf("ended by itself: %q, want %q", got, want)
	}
}
