package testutil

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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
	if err := addHugepages(n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := addHugepages(-n); err != nil {
			t.Error(err)
		}
	})
}

// addHugepages changes the pool by n under a lock held across test processes: go test runs the
// launcher's, the node agent's and local mode's packages side by side, and a read and write of
// the pool between another's read and write would lose that one's change. A pool the kernel
// cannot grow by n is put back as it was.
func addHugepages(n int) error {
	unlock, err := lockHost("hugepages")
	if err != nil {
		return err
	}
	defer unlock()
	before, err := readHugepages()
	if err != nil {
		return err
	}
	want := max(before+n, 0)
	if err := writeHugepages(want); err != nil {
		return err
	}
	got, err := readHugepages()
	if err != nil || n <= 0 || got >= want {
		return err
	}
	short := fmt.Errorf("%s: the kernel holds %d huge pages of the %d asked for", nrHugepages, got, want)
	return errors.Join(short, writeHugepages(before))
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
