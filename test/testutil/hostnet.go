package testutil

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// LockHostNetwork serialises, across test packages (go test runs them in parallel), the tests
// that change or assert the root network namespace's settings: the virtual nodes' CNI bridge
// plugin turns the host's ip_forward on while they run, and netsetup's tests check that netsetup
// never touches it. The lock is released when the test ends.
func LockHostNetwork(t testing.TB) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "qvirt-test-hostnet.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("host network lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("host network lock: %v", err)
	}
	t.Cleanup(func() { f.Close() })
}
