package testutil

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// hugepagesChildEnv makes this test binary a child of TestHugepagesAcrossProcesses.
const hugepagesChildEnv = "QVIRT_TEST_HUGEPAGES_CHILD"

// TestHugepagesAcrossProcesses changes the host's pool from several processes at once, as go test
// does when it runs the launcher's, the node agent's and local mode's packages side by side
// (without -p 1, or two runs on one machine): each change must land, and the pool must end as it
// began. A change read and written without a lock held across processes loses another's.
func TestHugepagesAcrossProcesses(t *testing.T) {
	if os.Getenv(hugepagesChildEnv) != "" {
		hugepagesChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Fatal("changing the host's pool of huge pages needs root")
	}
	// No other test holds pages meanwhile, so the pool must end as it began.
	unlock := lockReservations(t, true)
	defer unlock()
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
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHugepagesAcrossProcesses$", "-test.count=1")
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

// TestHugepagesWhileChildrenExit grows and shrinks the pool by 128 pages while this process's
// children keep exiting, as a test's QEMUs and launchers do: the kernel stops growing the pool
// when the writing thread has a signal pending (SIGCHLD here) and still reports the write as done
// (hugetlb's set_max_huge_pages: "Bail for signals"). A CI run's launcher test got 1 page of 128
// that way. Every grow must get all its pages.
func TestHugepagesWhileChildrenExit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("changing the host's pool of huge pages needs root")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_ = exec.Command("/bin/true").Run()
		}
	}()
	defer func() { cancel(); <-done }()
	for i := range 1000 {
		if err := addHugepages(128); err != nil {
			t.Fatalf("grow %d: %v", i, err)
		}
		if err := addHugepages(-128); err != nil {
			t.Fatalf("shrink %d: %v", i, err)
		}
	}
}
