package testutil

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// nrHugepages is the size of the host's pool of 2 MiB pages.
const nrHugepages = "/proc/sys/vm/nr_hugepages"

// hugepagesMu orders this process's changes to the pool, each read and written as one step.
var hugepagesMu sync.Mutex

// ReserveHugepages adds n 2 MiB pages to the host's pool for the test, and takes as many back
// when it ends (after its launchers' QEMUs, whose cleanups run first). Both are relative to the
// pool as it is then, so tests that overlap leave the pool as they found it.
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

func addHugepages(n int) error {
	hugepagesMu.Lock()
	defer hugepagesMu.Unlock()
	read := func() (int, error) {
		data, err := os.ReadFile(nrHugepages)
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(data)))
	}
	before, err := read()
	if err != nil {
		return err
	}
	want := max(before+n, 0)
	if err := os.WriteFile(nrHugepages, []byte(strconv.Itoa(want)), 0o644); err != nil {
		return err
	}
	if got, err := read(); err != nil || (n > 0 && got < want) {
		return fmt.Errorf("the kernel holds %d huge pages of the %d asked for (%v)", got, want, err)
	}
	return nil
}
