package launcher

import (
	"bytes"
	"fmt"
	"time"
)

// The node's CPU and memory for the downward metrics, read from /proc/stat and /proc/meminfo by
// hand: prometheus/procfs compiles dozens of regular expressions when its package initialises,
// which cost every launcher about 1 ms of CPU and 96 KB of heap at start (GODEBUG=inittrace=1)
// whether or not its VM has a downwardMetrics device.

// hostCPU is the node's CPU count and the CPU time it spent busy: user, nice, system, irq,
// softirq and steal, as KubeVirt's TotalCPUTime counts it.
type hostCPU struct {
	CPUs int
	// BusySeconds is a float: a node's CPU time summed over all its CPUs outgrows a Duration's
	// 292 years within a few years of uptime on a large node.
	BusySeconds float64
}

// parseHostStat reads /proc/stat (proc(5)): the "cpu" line's fields, in clock ticks, and one
// "cpuN" line per online CPU.
func parseHostStat(data []byte, tick time.Duration) (hostCPU, error) {
	var h hostCPU
	seenTotal := false
	for line := range bytes.Lines(data) {
		name, rest := nextField(line)
		if !bytes.HasPrefix(name, []byte("cpu")) {
			continue
		}
		if len(name) > 3 {
			h.CPUs++
			continue
		}
		busy, err := busyTicks(rest)
		if err != nil {
			return hostCPU{}, fmt.Errorf("cpu line: %w", err)
		}
		h.BusySeconds, seenTotal = float64(busy)*tick.Seconds(), true
	}
	if !seenTotal {
		return hostCPU{}, fmt.Errorf("no cpu line")
	}
	return h, nil
}

// busyTicks sums the fields of a cpu line that are not idle time: 1 user, 2 nice, 3 system,
// 6 irq, 7 softirq and 8 steal (4 idle and 5 iowait are not; 9 and 10, guest time, are already
// in user and nice).
func busyTicks(fields []byte) (uint64, error) {
	var sum uint64
	for n := 1; n <= 8; n++ {
		var f []byte
		if f, fields = nextField(fields); f == nil {
			return 0, fmt.Errorf("%d fields, want at least 8", n-1)
		}
		v, ok := parseUint(f)
		if !ok {
			return 0, fmt.Errorf("field %d: %q is not a number", n, f)
		}
		if n != 4 && n != 5 {
			sum += v
		}
	}
	return sum, nil
}

// hostMemory is the node's memory from /proc/meminfo, in KiB.
type hostMemory struct {
	MemTotal, MemFree, SwapTotal, SwapFree uint64
}

// parseMeminfo reads the lines of /proc/meminfo that the downward metrics need ("MemFree:
// 1234 kB"). MemTotal and MemFree must be there; a /proc without the swap lines (a sandbox's, or a
// kernel built without swap) has no swap.
func parseMeminfo(data []byte) (hostMemory, error) {
	var m hostMemory
	// A line is read once: the first of a name counts, and its name leaves fields.
	fields := map[string]*uint64{"MemTotal:": &m.MemTotal, "MemFree:": &m.MemFree, "SwapTotal:": &m.SwapTotal, "SwapFree:": &m.SwapFree}
	for line := range bytes.Lines(data) {
		name, rest := nextField(line)
		dst, ok := fields[string(name)]
		if !ok {
			continue
		}
		value, _ := nextField(rest)
		if *dst, ok = parseUint(value); !ok {
			return hostMemory{}, fmt.Errorf("%s %q is not a number of KiB", name, value)
		}
		delete(fields, string(name))
	}
	for _, name := range []string{"MemTotal:", "MemFree:"} {
		if fields[name] != nil {
			return hostMemory{}, fmt.Errorf("no %s line", name)
		}
	}
	if m.MemFree > m.MemTotal || m.SwapFree > m.SwapTotal {
		return hostMemory{}, fmt.Errorf("more free than total (memory %d of %d KiB, swap %d of %d KiB)", m.MemFree, m.MemTotal, m.SwapFree, m.SwapTotal)
	}
	return m, nil
}

func readHostCPU() (h hostCPU, err error) {
	err = readProc("/proc/stat", func(data []byte) error {
		h, err = parseHostStat(data, clockTick())
		return err
	})
	return h, err
}

func readHostMemory() (m hostMemory, err error) {
	err = readProc("/proc/meminfo", func(data []byte) error {
		m, err = parseMeminfo(data)
		return err
	})
	return m, err
}
