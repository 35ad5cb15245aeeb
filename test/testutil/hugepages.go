package testutil

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// nrHugepages is the size of the host's pool of 2 MiB pages.
const nrHugepages = "/proc/sys/vm/nr_hugepages"

// ReserveHugepages adds n 2 MiB pages to the host's pool for the test, and takes as many back
// when it ends (after its launchers' QEMUs, whose cleanups run first). Both are relative to the
// pool as it is then, so tests that overlap, in this process or another, leave the pool as they
// found it.
func ReserveHugepages(t *testing.T, n int) {
	t.Helper()
	t.Cleanup(lockReservations(t, false))
	if err := addHugepages(n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := addHugepages(-n); err != nil {
			t.Error(err)
		}
	})
}

// lockReservations is held, shared, by every test that holds pages of the pool, in any process,
// and exclusively by a test that needs the pool to itself; it returns the release.
func lockReservations(t *testing.T, exclusive bool) func() {
	t.Helper()
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	unlock, err := lockHost("hugepages-reserved", how)
	if err != nil {
		t.Fatal(err)
	}
	return unlock
}

// addHugepages changes the pool by n under a lock held across test processes: go test runs
// packages side by side unless told -p 1, and a read and write of the pool between another's read
// and write would lose that one's change. The kernel stops growing the pool when the writing
// thread has a signal pending (hugetlb's set_max_huge_pages: "Bail for signals"; here the SIGCHLD
// of a test's QEMU or launcher exiting) and reports the write as done all the same, so the write
// is repeated while each one adds pages. A pool the kernel cannot grow by n is put back as it was.
func addHugepages(n int) error {
	unlock, err := lockHost("hugepages", syscall.LOCK_EX)
	if err != nil {
		return err
	}
	defer unlock()
	before, err := readHugepages()
	if err != nil {
		return err
	}
	want := max(before+n, 0)
	for got := before; ; {
		if err := writeHugepages(want); err != nil {
			return errors.Join(err, writeHugepages(before))
		}
		last := got
		if got, err = readHugepages(); err != nil {
			return errors.Join(err, writeHugepages(before))
		}
		if n <= 0 || got >= want {
			return nil
		}
		if got <= last {
			short := fmt.Errorf("%s: the kernel holds %d huge pages of the %d asked for (%d before)", nrHugepages, got, want, before)
			return errors.Join(short, writeHugepages(before))
		}
	}
}

func readHugepages() (int, error) {
	data, err := os.ReadFile(nrHugepages)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", nrHugepages, err)
	}
	return n, nil
}

func writeHugepages(n int) error {
	return os.WriteFile(nrHugepages, []byte(strconv.Itoa(n)), 0o644)
}
