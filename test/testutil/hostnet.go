package testutil

import (
	"fmt"
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
	unlock, err := LockHostNetworkNow()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
}

// LockHostNetworkNow takes the same lock for a caller without a test (a TestMain holding it for
// its package's shared fixture) and returns its release.
func LockHostNetworkNow() (func(), error) {
	return lockHost("hostnet", syscall.LOCK_EX)
}

// lockHost takes the lock named name, held across this machine's test processes (an flock, how
// LOCK_EX or LOCK_SH, on a file in the temporary directory; each call opens its own, so
// goroutines of one process exclude each other too), and returns its release.
func lockHost(name string, how int) (func(), error) {
	path := filepath.Join(os.TempDir(), "qvirt-test-"+name+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s lock: %w", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s lock: %w", name, err)
	}
	return func() { f.Close() }, nil
}
