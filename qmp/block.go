package qmp

import (
	"context"
	"fmt"

	gqmp "github.com/digitalocean/go-qemu/qmp"
)

// Block jobs and exports, as QEMU 7.2 names them: what storage migration over NBD takes (QEMU's
// tests/qemu-iotests/194 shows the sequence: the destination exports its disks with its NBD
// server, the source mirrors into them, then migrates). Checked against QEMU 7.2's
// query-qmp-schema (schema_test.go).

// Block job events.
const (
	// EventBlockJobReady: a mirror job has copied everything once and now keeps the target in
	// step with the source; block-job-cancel then ends it with the target a point-in-time copy.
	EventBlockJobReady = "BLOCK_JOB_READY"
	// EventBlockJobCompleted: a job ended; "error" is set when it failed.
	EventBlockJobCompleted = "BLOCK_JOB_COMPLETED"
	// EventBlockJobCancelled: a job was cancelled before it was ready (or forced).
	EventBlockJobCancelled = "BLOCK_JOB_CANCELLED"
	// EventBlockJobError: a job met an I/O error (what follows depends on its error policy).
	EventBlockJobError = "BLOCK_JOB_ERROR"
)

// NBDServerStart starts QEMU's NBD server on a unix socket at path, allowing at most
// maxConnections clients at once (0: unlimited). Exports are added with BlockExportAdd.
func (m *Monitor) NBDServerStart(ctx context.Context, path string, maxConnections uint32) error {
	type unixData struct {
		Path string `json:"path"`
	}
	type addr struct {
		Type string   `json:"type"`
		Data unixData `json:"data"`
	}
	args := struct {
		Addr           addr   `json:"addr"`
		MaxConnections uint32 `json:"max-connections,omitempty"`
	}{addr{Type: "unix", Data: unixData{Path: path}}, maxConnections}
	return m.Call(ctx, "nbd-server-start", args, nil)
}

// NBDServerStop stops the NBD server and removes its exports, those of BlockExportAdd included.
func (m *Monitor) NBDServerStop(ctx context.Context) error {
	return m.Call(ctx, "nbd-server-stop", nil, nil)
}

// BlockExportNBD is block-export-add's arguments for an NBD export of a node (QEMU 7.2:
// BlockExportOptions with type "nbd"). QEMU activates an exported node that an incoming
// migration has left inactive, so a migration target can take writes before the guest arrives.
type BlockExportNBD struct {
	ID       string `json:"id"`
	NodeName string `json:"node-name"`
	Writable bool   `json:"writable,omitempty"`
	// Name is the export's name for clients; the node name when empty.
	Name string `json:"name,omitempty"`
}

// MarshalJSON adds "type": "nbd".
func (e BlockExportNBD) MarshalJSON() ([]byte, error) {
	type plain BlockExportNBD
	return flatten(plain(e), map[string]any{"type": "nbd"})
}

// BlockExportAdd exports a block node.
func (m *Monitor) BlockExportAdd(ctx context.Context, e BlockExportNBD) error {
	return m.Call(ctx, "block-export-add", e, nil)
}

// NBDBlockdev is blockdev-add's arguments for an NBD client node reaching export on the NBD
// server listening on the unix socket path. QEMU connects when the node is added.
func NBDBlockdev(nodeName, path, export string) BlockdevOptions {
	return BlockdevOptions{Driver: "nbd", NodeName: nodeName, Props: map[string]any{
		"server": map[string]string{"type": "unix", "path": path},
		"export": export,
	}}
}

// Mirror sync modes (MirrorSyncMode).
const (
	// SyncFull copies the whole disk.
	SyncFull = "full"
	// SyncTop copies what the top image of the chain holds; the target must already have the
	// rest (the same backing image).
	SyncTop = "top"
)

// Mirror copy modes (MirrorCopyMode).
const (
	// CopyBackground copies in the background only: under heavy writes the job may not keep up.
	CopyBackground = "background"
	// CopyWriteBlocking also writes each guest write to the target before it completes, so the
	// target never falls behind once the job is ready.
	CopyWriteBlocking = "write-blocking"
)

// BlockdevMirror is blockdev-mirror's arguments (the members qvirt uses).
type BlockdevMirror struct {
	JobID  string `json:"job-id"`
	Device string `json:"device"` // the source node
	Target string `json:"target"` // an existing node
	Sync   string `json:"sync"`   // SyncFull, SyncTop
	// CopyMode is CopyBackground (QEMU's default) or CopyWriteBlocking.
	CopyMode string `json:"copy-mode,omitempty"`
	// Speed caps the copy in bytes per second; 0 is unlimited.
	Speed int64 `json:"speed,omitempty"`
}

// BlockdevMirror starts a mirror job and returns at once; follow it with the BLOCK_JOB_* events
// or QueryBlockJobs.
func (m *Monitor) BlockdevMirror(ctx context.Context, args BlockdevMirror) error {
	return m.Call(ctx, "blockdev-mirror", args, nil)
}

// BlockJobCancel ends a block job. A mirror that is ready ends with BLOCK_JOB_COMPLETED once its
// target holds a copy of the source as of the cancel (unless force); before that, and with force,
// it ends at once with BLOCK_JOB_CANCELLED and the target is not a copy.
func (m *Monitor) BlockJobCancel(ctx context.Context, job string, force bool) error {
	args := struct {
		Device string `json:"device"`
		Force  bool   `json:"force,omitempty"`
	}{job, force}
	return m.Call(ctx, "block-job-cancel", args, nil)
}

// YankBlockNodes shuts down the connections of the NBD client nodes named (QEMU's yank): their
// requests in flight fail at once, so a job stuck on a peer that stopped answering ends, which
// block-job-cancel alone does not make it do.
func (m *Monitor) YankBlockNodes(ctx context.Context, nodes ...string) error {
	type instance struct {
		Type     string `json:"type"`
		NodeName string `json:"node-name"`
	}
	args := struct {
		Instances []instance `json:"instances"`
	}{}
	for _, n := range nodes {
		args.Instances = append(args.Instances, instance{Type: "block-node", NodeName: n})
	}
	return m.Call(ctx, "yank", args, nil)
}

// BlockJobInfo is an entry of query-block-jobs. Len and Offset are the job's progress in bytes
// (Len grows when the guest writes behind the copy).
type BlockJobInfo struct {
	Type   string `json:"type"`
	Device string `json:"device"` // the job's id
	Len    int64  `json:"len"`
	Offset int64  `json:"offset"`
	Busy   bool   `json:"busy"`
	Paused bool   `json:"paused"`
	Speed  int64  `json:"speed"`
	Ready  bool   `json:"ready"`
	Status string `json:"status"` // JobStatus: running, ready, concluded, ...
	Error  string `json:"error,omitempty"`
}

// QueryBlockJobs lists the block jobs.
func (m *Monitor) QueryBlockJobs(ctx context.Context) ([]BlockJobInfo, error) {
	var jobs []BlockJobInfo
	err := m.Call(ctx, "query-block-jobs", nil, &jobs)
	return jobs, err
}

// MigrateContinue lets a migration paused in state (MigrationPreSwitchover, with the
// pause-before-switchover capability) go on.
func (m *Monitor) MigrateContinue(ctx context.Context, state MigrationStatus) error {
	args := struct {
		State MigrationStatus `json:"state"`
	}{state}
	return m.Call(ctx, "migrate-continue", args, nil)
}

// BlockJobEnd is how a block job ended, from its BLOCK_JOB_COMPLETED or BLOCK_JOB_CANCELLED event.
type BlockJobEnd struct {
	Job       string
	Cancelled bool
	// Error is QEMU's message for a job that failed; "" when it did not.
	Error       string
	Len, Offset int64
}

// ParseBlockJobEnd reads a BLOCK_JOB_COMPLETED or BLOCK_JOB_CANCELLED event.
func ParseBlockJobEnd(ev gqmp.Event) (BlockJobEnd, error) {
	if ev.Event != EventBlockJobCompleted && ev.Event != EventBlockJobCancelled {
		return BlockJobEnd{}, fmt.Errorf("event %s does not end a block job", ev.Event)
	}
	job, ok := ev.Data["device"].(string)
	if !ok {
		return BlockJobEnd{}, fmt.Errorf("%s event without a device: %v", ev.Event, ev.Data)
	}
	end := BlockJobEnd{Job: job, Cancelled: ev.Event == EventBlockJobCancelled}
	end.Error, _ = ev.Data["error"].(string)
	if n, ok := ev.Data["len"].(float64); ok {
		end.Len = int64(n)
	}
	if n, ok := ev.Data["offset"].(float64); ok {
		end.Offset = int64(n)
	}
	return end, nil
}

// IsBlockJobEnd matches the event that ends job (for NewWaiter with name "").
func IsBlockJobEnd(job string) func(gqmp.Event) bool {
	return func(ev gqmp.Event) bool {
		return (ev.Event == EventBlockJobCompleted || ev.Event == EventBlockJobCancelled) && ev.Data["device"] == job
	}
}

// IsBlockJob matches an event of job (for NewWaiter with an event name).
func IsBlockJob(job string) func(gqmp.Event) bool {
	return func(ev gqmp.Event) bool { return ev.Data["device"] == job }
}
