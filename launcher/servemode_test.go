package launcher

import (
	"net"
	"os"
	"path/filepath"
	"testing"
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
