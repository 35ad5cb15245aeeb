package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/launcher/wire"
	"github.com/qvirt/qvirt/qmp"
)

// This file gathers the VM's resource counters for GET /v1/stats, which the node agent turns into
// qvirt_vmi_* metrics. Everything here is cheap enough for every scrape: two QMP queries that do
// not stop the vCPUs (query-blockstats each time, query-cpus-fast once per QEMU) and a few small
// /proc files. It uses
// only the standard library and golang.org/x/sys, which the launcher links already, so the
// launcher's memory stays where it was.

// Stats gathers the VM's counters. It fails with a ConflictError when no QEMU runs.
func (l *Launcher) Stats(ctx context.Context) (protocol.Stats, error) {
	p, err := l.process()
	if err != nil {
		return protocol.Stats{}, err
	}
	hotDisks, hotTaps := l.hotplugged()
	pid := p.Pid()
	st := protocol.Stats{Time: time.Now(), PID: pid}
	if st.CPU, err = readProcessCPU(procPath(pid, "stat")); err != nil {
		return protocol.Stats{}, err
	}
	if st.VCPUs, err = vcpuStats(ctx, p); err != nil {
		return protocol.Stats{}, err
	}
	if st.MemoryResidentBytes, err = readResident(procPath(pid, "status")); err != nil {
		return protocol.Stats{}, err
	}
	if st.Disks, err = diskStats(ctx, p.Monitor(), p.Machine(), hotDisks); err != nil {
		return protocol.Stats{}, err
	}
	if st.Interfaces, err = interfaceStats(p.Pid(), p.Machine().coldTaps(), hotTaps); err != nil {
		return protocol.Stats{}, err
	}
	return st, nil
}

// hotplugged are the names of the hotplugged disks and the taps of the hotplugged NICs by name.
func (l *Launcher) hotplugged() (disks []string, taps map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name := range l.hotplug {
		disks = append(disks, name)
	}
	taps = make(map[string]string, len(l.nics))
	for name, n := range l.nics {
		taps[name] = n.Tap
	}
	return disks, taps
}

func procPath(pid int, parts ...string) string {
	return "/proc/" + strconv.Itoa(pid) + "/" + strings.Join(parts, "/")
}

// vcpuThreads caches each QEMU's vCPU list (*Process → []qmp.CPUInfoFast): the vCPU threads live
// as long as QEMU does, since qvirt does not hot-plug vCPUs, and every QMP command waits for QEMU's
// main loop (1-10 ms measured here under TCG), so each scrape saves one. An entry goes when its
// QEMU exits.
var vcpuThreads sync.Map

func vcpuList(ctx context.Context, p *Process) ([]qmp.CPUInfoFast, error) {
	if v, ok := vcpuThreads.Load(p); ok {
		return v.([]qmp.CPUInfoFast), nil
	}
	cpus, err := p.Monitor().QueryCPUsFast(ctx)
	if err != nil {
		return nil, fmt.Errorf("query-cpus-fast: %w", err)
	}
	if _, loaded := vcpuThreads.LoadOrStore(p, cpus); !loaded {
		go func() {
			<-p.Done()
			vcpuThreads.Delete(p)
		}()
	}
	return cpus, nil
}

func vcpuStats(ctx context.Context, p *Process) ([]protocol.VCPUStats, error) {
	cpus, err := vcpuList(ctx, p)
	if err != nil {
		return nil, err
	}
	pid := p.Pid()
	out := make([]protocol.VCPUStats, 0, len(cpus))
	for _, c := range cpus {
		t, err := readProcessCPU(procPath(pid, "task", strconv.Itoa(c.ThreadID), "stat"))
		if err != nil {
			return nil, fmt.Errorf("vCPU %d: %w", c.CPUIndex, err)
		}
		out = append(out, protocol.VCPUStats{ID: c.CPUIndex, ThreadID: c.ThreadID, Time: t})
	}
	slices.SortFunc(out, func(a, b protocol.VCPUStats) int { return a.ID - b.ID })
	return out, nil
}

func diskStats(ctx context.Context, mon *qmp.Monitor, m *Machine, hotplugged []string) ([]protocol.DiskStats, error) {
	raw, err := mon.QueryBlockstats(ctx)
	if err != nil {
		return nil, fmt.Errorf("query-blockstats: %w", err)
	}
	byNode := map[string]qmp.BlockStats{}
	byDevice := map[string]qmp.BlockStats{}
	for _, s := range raw {
		if s.NodeName != "" {
			byNode[s.NodeName] = s
		}
		if id := qdevID(s.QDev); id != "" {
			byDevice[id] = s
		}
	}
	var out []protocol.DiskStats
	add := func(name string, hot bool) {
		s, ok := byNode[DriveNode(name)]
		if !ok {
			// An empty drive (a cdrom without media) has no node; its device still counts.
			if s, ok = byDevice[DiskDeviceID(name)]; !ok {
				return
			}
		}
		out = append(out, diskFromQMP(name, hot, s.Stats))
	}
	// Cold disks in the machine's order, then hot-plugged ones (those the machine started with on
	// a migration target among them) by name.
	for _, d := range m.Disks {
		if d.Port == "" {
			add(d.Name, false)
		}
	}
	slices.Sort(hotplugged)
	for _, name := range hotplugged {
		add(name, true)
	}
	return out, nil
}

// qdevID is the device id in query-blockstats's qdev: the id itself, or the id in a QOM path
// below /machine/peripheral/ (virtio-blk-pci attaches its drive to a child object).
func qdevID(qdev string) string {
	rest, ok := strings.CutPrefix(qdev, "/machine/peripheral/")
	if !ok {
		if strings.HasPrefix(qdev, "/") {
			return ""
		}
		return qdev
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

func diskFromQMP(name string, hot bool, s qmp.BlockDeviceStats) protocol.DiskStats {
	return protocol.DiskStats{
		Name: name, Hotplugged: hot,
		ReadBytes: s.RdBytes, WriteBytes: s.WrBytes,
		ReadOps: s.RdOperations, WriteOps: s.WrOperations, FlushOps: s.FlushOperations,
		ReadTime: time.Duration(s.RdTotalTimeNs), WriteTime: time.Duration(s.WrTotalTimeNs),
		FlushTime: time.Duration(s.FlushTotalTimeNs),
	}
}

// interfaceStats reads each tap's counters in QEMU's network namespace (qemuPID's), which is the
// pod's and the one QEMU opened its taps in. /proc/PID/net/dev is read rather than
// /sys/class/net, whose view is the namespace of whoever mounted sysfs, not the reader's; and
// QEMU's rather than /proc/self's, whose view is the launcher's main thread's.
func interfaceStats(qemuPID int, taps, hotTaps map[string]string) ([]protocol.InterfaceStats, error) {
	if len(taps)+len(hotTaps) == 0 {
		return nil, nil
	}
	var counters map[string]linkCounters
	err := readProc(fmt.Sprintf("/proc/%d/net/dev", qemuPID), func(data []byte) (err error) {
		counters, err = parseNetDev(data)
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []protocol.InterfaceStats
	add := func(all map[string]string, hot bool) {
		for _, name := range slices.Sorted(maps.Keys(all)) {
			c, ok := counters[all[name]]
			if !ok {
				continue // the tap is gone: the node agent is tearing the NIC down
			}
			out = append(out, protocol.InterfaceStats{
				Name: name, Tap: all[name], Hotplugged: hot,
				RxBytes: c.TxBytes, RxPackets: c.TxPackets, RxErrors: c.TxErrors, RxDropped: c.TxDropped,
				TxBytes: c.RxBytes, TxPackets: c.RxPackets, TxErrors: c.RxErrors, TxDropped: c.RxDropped,
			})
		}
	}
	add(taps, false)
	add(hotTaps, true)
	return out, nil
}

// linkCounters are a network device's counters as the host sees them (a row of /proc/net/dev).
type linkCounters struct {
	RxBytes, RxPackets, RxErrors, RxDropped uint64
	TxBytes, TxPackets, TxErrors, TxDropped uint64
}

// The /proc parsers below allocate nothing per line or field: the launcher answers a scrape every
// few seconds for its whole life, and its garbage is resident memory until the next GC.

// parseNetDev parses /proc/net/dev: two header lines, then one line per device,
// "name: rx_bytes rx_packets rx_errs rx_drop fifo frame compressed multicast tx_bytes tx_packets
// tx_errs tx_drop fifo colls carrier compressed".
func parseNetDev(data []byte) (map[string]linkCounters, error) {
	out := map[string]linkCounters{}
	line := 0
	for l := range bytes.Lines(data) {
		if line++; line <= 2 {
			continue
		}
		name, rest, ok := bytes.Cut(l, []byte(":"))
		if !ok {
			return nil, fmt.Errorf("line %d: no device name", line)
		}
		var v [16]uint64
		for i := range v {
			var f []byte
			if f, rest = nextField(rest); f == nil {
				return nil, fmt.Errorf("line %d: %d counters, want 16", line, i)
			}
			n, ok := parseUint(f)
			if !ok {
				return nil, fmt.Errorf("line %d: counter %d: %q is not a number", line, i+1, f)
			}
			v[i] = n
		}
		out[string(bytes.TrimSpace(name))] = linkCounters{
			RxBytes: v[0], RxPackets: v[1], RxErrors: v[2], RxDropped: v[3],
			TxBytes: v[8], TxPackets: v[9], TxErrors: v[10], TxDropped: v[11],
		}
	}
	return out, nil
}

func readProcessCPU(path string) (protocol.CPUTime, error) {
	var utime, stime uint64
	err := readProc(path, func(data []byte) (err error) {
		utime, stime, err = parseStatTimes(data)
		return err
	})
	if err != nil {
		return protocol.CPUTime{}, err
	}
	tick := clockTick()
	return protocol.CPUTime{User: time.Duration(utime) * tick, System: time.Duration(stime) * tick}, nil
}

// parseStatTimes returns utime and stime, in clock ticks, from a /proc/<pid>/stat or
// /proc/<pid>/task/<tid>/stat line: fields 14 and 15 (proc(5)). The command name in field 2 is in
// parentheses and may itself hold spaces and parentheses, so fields are counted after the last ')'.
func parseStatTimes(data []byte) (utime, stime uint64, err error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, 0, errors.New("no command name")
	}
	rest := data[end+1:]
	var f []byte
	for n := 3; n <= 15; n++ {
		if f, rest = nextField(rest); f == nil {
			return 0, 0, fmt.Errorf("%d fields, want at least 15", n-1)
		}
		var ok bool
		switch n {
		case 14:
			utime, ok = parseUint(f)
		case 15:
			stime, ok = parseUint(f)
		default:
			continue
		}
		if !ok {
			return 0, 0, fmt.Errorf("field %d: %q is not a number", n, f)
		}
	}
	return utime, stime, nil
}

func readResident(path string) (int64, error) {
	var rss int64
	err := readProc(path, func(data []byte) (err error) {
		rss, err = parseVmRSS(data)
		return err
	})
	return rss, err
}

// parseVmRSS returns the VmRSS line of /proc/<pid>/status in bytes ("VmRSS:   12345 kB").
func parseVmRSS(data []byte) (int64, error) {
	for l := range bytes.Lines(data) {
		rest, ok := bytes.CutPrefix(l, []byte("VmRSS:"))
		if !ok {
			continue
		}
		num, rest := nextField(rest)
		unit, rest := nextField(rest)
		extra, _ := nextField(rest)
		kb, ok := parseUint(num)
		if !ok || string(unit) != "kB" || extra != nil || kb > 1<<43 {
			return 0, fmt.Errorf("VmRSS %q: want a number of kB", bytes.TrimSpace(l))
		}
		return int64(kb) << 10, nil
	}
	return 0, errors.New("no VmRSS line (a kernel thread or a zombie)")
}

// nextField returns the first run of non-blank bytes in b and what follows it; field is nil when
// b holds none.
func nextField(b []byte) (field, rest []byte) {
	i := 0
	for i < len(b) && isBlank(b[i]) {
		i++
	}
	j := i
	for j < len(b) && !isBlank(b[j]) {
		j++
	}
	if i == j {
		return nil, nil
	}
	return b[i:j], b[j:]
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// parseUint parses decimal digits; it fails on anything else, on nothing and on overflow.
func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// procBufs recycles the buffers /proc files are read into: they report size 0, so os.ReadFile
// would grow a fresh buffer for each.
var procBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// readProc reads the small file path into a pooled buffer and hands it to parse, which must not
// keep it.
func readProc(path string, parse func([]byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	bp := procBufs.Get().(*[]byte)
	defer procBufs.Put(bp)
	buf := (*bp)[:0]
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := f.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
	}
	*bp = buf[:0]
	if err := parse(buf); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// atClkTck is AT_CLKTCK from linux/auxvec.h: the auxiliary vector entry giving USER_HZ.
const atClkTck = 17

var clockTick = sync.OnceValue(func() time.Duration {
	// The kernel tells every process its USER_HZ in the auxiliary vector (what sysconf(_SC_CLK_TCK)
	// reads in C); 100 is the fixed value on all architectures Go supports, should it be missing.
	if auxv, err := unix.Auxv(); err == nil {
		for _, kv := range auxv {
			if kv[0] == atClkTck && kv[1] > 0 {
				return time.Second / time.Duration(kv[1])
			}
		}
	}
	return time.Second / 100
})

// stats serves GET /v1/stats.
func (s *server) stats(w *wire.ResponseWriter, r *wire.Request) {
	st, err := s.l.Stats(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, wire.StatusOK, st)
}

// Stats returns the VM's counters; an APIError with status 409 when no QEMU runs.
func (c *Client) Stats(ctx context.Context) (protocol.Stats, error) {
	var st protocol.Stats
	return st, c.do(ctx, "GET", "/v1/stats", nil, &st)
}

// coldTaps are the taps of the NICs QEMU started with but not as hot-plugged ones, by NIC name.
func (m *Machine) coldTaps() map[string]string {
	taps := map[string]string{}
	for _, n := range m.NICs {
		if n.Port == "" {
			taps[n.Name] = n.Tap
		}
	}
	return taps
}
