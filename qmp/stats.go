package qmp

import "context"

// CPUInfoFast is one vCPU in query-cpus-fast's reply (QEMU 7.2 schema: CpuInfoFast). Unlike the
// removed query-cpus it does not interrupt the vCPUs, so it is safe to call on every scrape.
type CPUInfoFast struct {
	// CPUIndex is the vCPU's index, from 0.
	CPUIndex int `json:"cpu-index"`
	// QOMPath is the vCPU object's path, e.g. /machine/unattached/device[0].
	QOMPath string `json:"qom-path"`
	// ThreadID is the host thread (a tid in QEMU's pid's task list) running this vCPU. Under
	// single-threaded TCG every vCPU reports the same thread.
	ThreadID int `json:"thread-id"`
	// Target is the guest architecture, e.g. x86_64.
	Target string `json:"target"`
}

// QueryCPUsFast lists the vCPUs and the host threads that run them.
func (m *Monitor) QueryCPUsFast(ctx context.Context) ([]CPUInfoFast, error) {
	var cpus []CPUInfoFast
	err := m.Call(ctx, "query-cpus-fast", nil, &cpus)
	return cpus, err
}

// BlockStats is one block backend in query-blockstats's reply (QEMU 7.2 schema: BlockStats),
// limited to what qvirt reads. QEMU lists one entry per block backend, i.e. per attached drive.
type BlockStats struct {
	// Device is the legacy drive name; empty for drives created with -blockdev/blockdev-add.
	Device string `json:"device,omitempty"`
	// QDev is the attached device's id ("disk-x") or, when the backend sits on a child of the
	// device (virtio-blk-pci's virtio-backend), that child's QOM path
	// ("/machine/peripheral/disk-x/virtio-backend").
	QDev string `json:"qdev,omitempty"`
	// NodeName is the backend's root block node; absent for an empty drive (a cdrom without media).
	NodeName string           `json:"node-name,omitempty"`
	Stats    BlockDeviceStats `json:"stats"`
}

// BlockDeviceStats are a drive's cumulative I/O counters since QEMU started (QEMU 7.2 schema:
// BlockDeviceStats, a subset). Times are the summed latencies of completed requests.
type BlockDeviceStats struct {
	RdBytes          int64 `json:"rd_bytes"`
	WrBytes          int64 `json:"wr_bytes"`
	RdOperations     int64 `json:"rd_operations"`
	WrOperations     int64 `json:"wr_operations"`
	FlushOperations  int64 `json:"flush_operations"`
	RdTotalTimeNs    int64 `json:"rd_total_time_ns"`
	WrTotalTimeNs    int64 `json:"wr_total_time_ns"`
	FlushTotalTimeNs int64 `json:"flush_total_time_ns"`
}

// QueryBlockstats returns the I/O counters of every attached drive.
func (m *Monitor) QueryBlockstats(ctx context.Context) ([]BlockStats, error) {
	var stats []BlockStats
	err := m.Call(ctx, "query-blockstats", nil, &stats)
	return stats, err
}

// HotpluggableCPU is one entry of query-hotpluggable-cpus (QEMU 7.2 schema: HotpluggableCPU): a
// place in the machine's topology (maxcpus of them) and, once a vCPU is there, its QOM path.
type HotpluggableCPU struct {
	// Type is the CPU device's driver, e.g. qemu64-x86_64-cpu.
	Type       string `json:"type"`
	VCPUsCount int    `json:"vcpus-count"`
	// Props are the place's topology properties (socket-id, core-id, thread-id), which device_add
	// takes as they are.
	Props map[string]any `json:"props"`
	// QOMPath is empty for a place without a vCPU.
	QOMPath string `json:"qom-path,omitempty"`
}

// QueryHotpluggableCPUs lists every place for a vCPU, plugged or not.
func (m *Monitor) QueryHotpluggableCPUs(ctx context.Context) ([]HotpluggableCPU, error) {
	var cpus []HotpluggableCPU
	err := m.Call(ctx, "query-hotpluggable-cpus", nil, &cpus)
	return cpus, err
}
