package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// hugepagesChildEnv makes this test binary a child of TestHugepagesAcrossProcesses.
const hugepagesChildEnv = "QVIRT_TEST_HUGEPAGES_CHILD"

// TestHugepagesAcrossProcesses changes the host's pool from several processes at once, as go test
// does when it runs the launcher's, the node agent's and local mode's packages side by side: each
// change must land, and the pool must end as it began. A change read and written without a lock
// held across processes loses another's (one CI run's launcher asked for 128 pages and read 1).
func TestHugepagesAcrossProcesses(t *testing.T) {
	if os.Getenv(hugepagesChildEnv) != "" {
		hugepagesChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal("changing the host's pool of huge pages needs root")
	}
	before, err := readHugepages()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHugepagesAcrossProcesses$", "-test.count=1")
			cmd.Env = append(os.Environ(), hugepagesChildEnv+"=1")
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("child %d: %w: %s", i, err, out)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if after, err := readHugepages(); err != nil || after != before {
		t.Errorf("the pool holds %d pages after the children, %d before (%v)", after, before, err)
	}
}

// hugepagesChild adds one page and takes it back, many times.
func hugepagesChild(t *testing.T) {
	for range 200 {
		if err := addHugepages(1); err != nil {
			t.Fatal(err)
		}
		if err := addHugepages(-1); err != nil {
			t.Fatal(err)
		}
	}
}
