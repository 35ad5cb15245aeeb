package launcher

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func TestParseHostStat(t *testing.T) {
	stat := "cpu  100 5 50 1000 7 3 2 1 40 0\ncpu0 50 2 25 500 3 1 1 0 20 0\ncpu1 50 3 25 500 4 2 1 1 20 0\n" +
		"intr 12345 0 1\nctxt 99\nbtime 1700000000\nprocs_running 2\n"
	h, err := parseHostStat([]byte(stat), 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// user+nice+system+irq+softirq+steal = 100+5+50+3+2+1 ticks of 10 ms.
	if h.CPUs != 2 || math.Abs(h.BusySeconds-1.61) > 1e-9 {
		t.Errorf("got %d CPUs busy %vs, want 2 and 1.61s", h.CPUs, h.BusySeconds)
	}
	// Years of a large node's CPU time: more than a time.Duration holds.
	h, err = parseHostStat([]byte("cpu  10000000000000 0 0 0 0 0 0 0\n"), 10*time.Millisecond)
	if err != nil || h.BusySeconds != 1e11 {
		t.Errorf("1e13 ticks of 10 ms: %v s, %v; want 1e11 s", h.BusySeconds, err)
	}
	for _, bad := range []string{"", "intr 1\n", "cpu 1 2 3\n", "cpu 1 2 x 4 5 6 7 8\n"} {
		if _, err := parseHostStat([]byte(bad), time.Millisecond); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	info := "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   2000 kB\nSwapTotal:      8 kB\nSwapFree:       4 kB\n"
	m, err := parseMeminfo([]byte(info))
	if err != nil {
		t.Fatal(err)
	}
	if m != (hostMemory{MemTotal: 24000000, MemFree: 1000, SwapTotal: 8, SwapFree: 4}) {
		t.Errorf("got %+v", m)
	}
	// Without swap lines: no swap.
	if m, err := parseMeminfo([]byte("MemTotal: 10 kB\nMemFree: 5 kB\n")); err != nil || m != (hostMemory{MemTotal: 10, MemFree: 5}) {
		t.Errorf("a meminfo without swap lines: %+v, %v; want no swap", m, err)
	}
	if _, err := parseMeminfo([]byte(strings.Replace(info, "MemFree:        1000 kB\n", "", 1))); err == nil || !strings.Contains(err.Error(), "MemFree") {
		t.Errorf("a meminfo without MemFree: %v, want an error naming it", err)
	}
	if _, err := parseMeminfo([]byte(strings.Replace(info, "1000 kB", "lots kB", 1))); err == nil || !strings.Contains(err.Error(), "MemFree") {
		t.Errorf("a meminfo with a bad MemFree: %v, want an error naming it", err)
	}
}

// The node's own files parse.
func TestReadHostProc(t *testing.T) {
	h, err := readHostCPU()
	if err != nil || h.CPUs < 1 || h.BusySeconds <= 0 {
		t.Errorf("readHostCPU: %+v %v", h, err)
	}
	m, err := readHostMemory()
	if err != nil || m.MemTotal == 0 || m.MemFree > m.MemTotal {
		t.Errorf("readHostMemory: %+v %v", m, err)
	}
}

func FuzzParseHostProc(f *testing.F) {
	f.Add([]byte("cpu  100 5 50 1000 7 3 2 1 40 0\ncpu0 50 2 25 500 3 1 1 0 20 0\n"))
	f.Add([]byte("MemTotal: 1 kB\nMemFree: 1 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, err := parseHostStat(data, time.Millisecond); err == nil {
			if !bytes.Contains(data, []byte("cpu")) || h.CPUs < 0 || h.BusySeconds < 0 {
				t.Errorf("%+v from %q", h, data)
			}
		}
		m, err := parseMeminfo(data)
		if err != nil {
			return
		}
		if m.MemFree > m.MemTotal || m.SwapFree > m.SwapTotal {
			t.Errorf("%+v: more free than total", m)
		}
		// What it read, written out again, reads back the same.
		again := fmt.Sprintf("MemTotal: %d kB\nMemFree: %d kB\nSwapTotal: %d kB\nSwapFree: %d kB\n", m.MemTotal, m.MemFree, m.SwapTotal, m.SwapFree)
		if m2, err := parseMeminfo([]byte(again)); err != nil || m2 != m {
			t.Errorf("%+v written out reads back as %+v, %v", m, m2, err)
		}
	})
}
