package launcher

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDirWatchReportsCreations: a socket bound in the directory (as QEMU binds its monitor) and a
// file moved into it wake the watcher; nothing else does.
func TestDirWatchReportsCreations(t *testing.T) {
	dir := t.TempDir()
	w, err := watchCreates(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	select {
	case <-w.created:
		t.Fatal("a creation was reported before any")
	case <-time.After(50 * time.Millisecond):
	}
	ln, err := net.Listen("unix", filepath.Join(dir, "qmp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	expectCreated(t, w, "binding a socket")
	other := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(other, filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	expectCreated(t, w, "moving a file in")
	if _, err := watchCreates(filepath.Join(dir, "missing")); err == nil {
		t.Error("watching a missing directory: no error")
	}
}

func expectCreated(t *testing.T, w *dirWatch, what string) {
	t.Helper()
	select {
	case <-w.created:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s was not reported", what)
	}
}
