package launcher

import (
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
	if h.CPUs != 2 || h.Busy != 1610*time.Millisecond {
		t.Errorf("got %d CPUs busy %v, want 2 and 1.61s", h.CPUs, h.Busy)
	}
	for _, bad := range []string{"", "intr 1\n", "cpu 1 2 3\n", "cpu 1 2 x 4 5 6 7 8\n"} {
		if _, err := parseHostStat([]byte(bad), time.Millisecond); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseMeminfo(t *testing.T) {
	info := "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   2000 kB\nSwapTotal:      0 kB\nSwapFree:       0 kB\n"
	m, err := parseMeminfo([]byte(info))
	if err != nil {
		t.Fatal(err)
	}
	if m != (hostMemory{MemTotal: 24000000, MemFree: 1000}) {
		t.Errorf("got %+v", m)
	}
	if _, err := parseMeminfo([]byte(strings.Replace(info, "SwapFree:       0 kB\n", "", 1))); err == nil || !strings.Contains(err.Error(), "SwapFree") {
		t.Errorf("a meminfo without SwapFree: %v, want an error naming it", err)
	}
	if _, err := parseMeminfo([]byte(strings.Replace(info, "1000 kB", "lots kB", 1))); err == nil || !strings.Contains(err.Error(), "MemFree") {
		t.Errorf("a meminfo with a bad MemFree: %v, want an error naming it", err)
	}
}

// The node's own files parse.
func TestReadHostProc(t *testing.T) {
	h, err := readHostCPU()
	if err != nil || h.CPUs < 1 || h.Busy <= 0 {
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
		if h, err := parseHostStat(data, time.Millisecond); err == nil && (h.CPUs < 0 || h.CPUs > len(data)) {
			t.Errorf("%d CPUs from %d bytes", h.CPUs, len(data))
		}
		_, _ = parseMeminfo(data)
	})
}
