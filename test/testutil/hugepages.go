package testutil

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// nrHugepages is the size of the host's pool of 2 MiB pages.
const nrHugepages = "/proc/sys/vm/nr_hugepages"

// ReserveHugepages adds n 2 MiB pages to the host's pool for the test, and takes them back when it
// ends (after its launchers' QEMUs, whose cleanups run first).
func ReserveHugepages(t *testing.T, n int) {
	t.Helper()
	data, err := os.ReadFile(nrHugepages)
	if err != nil {
		t.Fatal(err)
	}
	before, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	set := func(v int) {
		if err := os.WriteFile(nrHugepages, []byte(strconv.Itoa(v)), 0o644); err != nil {
			t.Errorf("set %s to %d: %v", nrHugepages, v, err)
		}
	}
	t.Cleanup(func() { set(before) })
	set(before + n)
	data, _ = os.ReadFile(nrHugepages)
	if got, _ := strconv.Atoi(strings.TrimSpace(string(data))); got < before+n {
		t.Fatalf("the kernel reserved %d huge pages of the %d asked for", got, before+n)
	}
}
