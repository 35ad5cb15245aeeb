package qmp

import "context"

// MigrateOptions are migrate's arguments as QEMU 7.2 takes them. QEMU 8.2
// adds "channels" as an alternative to "uri", and 9.1 removes the block
// migration flags ("blk", "inc"), which qvirt does not use; probe with
// QueryQMPSchema before relying on either.
type MigrateOptions struct {
	URI    string `json:"uri"` // tcp:HOST:PORT, unix:PATH, fd:NAME, exec:CMD
	Resume bool   `json:"resume,omitempty"`
}

// Migrate starts an outgoing migration and returns at once; follow it with
// MIGRATION events (capability "events") or QueryMigrate.
func (m *Monitor) Migrate(ctx context.Context, opts MigrateOptions) error {
	return m.Call(ctx, "migrate", opts, nil)
}

// MigrateIncoming starts listening for an incoming migration on a QEMU
// started with -incoming defer. QEMU 7.2 requires uri.
func (m *Monitor) MigrateIncoming(ctx context.Context, uri string) error {
	args := struct {
		URI string `json:"uri"`
	}{uri}
	return m.Call(ctx, "migrate-incoming", args, nil)
}

// MigrateRecover makes an incoming migration in postcopy-paused (its link broke after the switch to
// post-copy) listen on uri for the source's resume (migrate with Resume).
// It runs out of band (QEMU allows it): the target's main loop may be blocked on a page that
// only the recovery brings.
func (m *Monitor) MigrateRecover(ctx context.Context, uri string) error {
	args := struct {
		URI string `json:"uri"`
	}{uri}
	_, err := m.ExecuteOOB(ctx, "migrate-recover", args)
	return err
}

// MigrateStartPostcopy switches the outgoing migration to post-copy at its next iteration (the
// capability postcopy-ram must be on at both ends): the target runs the guest and fetches the
// pages still on the source as it touches them.
func (m *Monitor) MigrateStartPostcopy(ctx context.Context) error {
	return m.Call(ctx, "migrate-start-postcopy", nil, nil)
}

// MigrateCancel cancels the outgoing migration.
func (m *Monitor) MigrateCancel(ctx context.Context) error {
	return m.Call(ctx, "migrate_cancel", nil, nil)
}

// MigrationCapability names a migration capability.
type MigrationCapability string

// Migration capabilities qvirt may set (QEMU 7.2 has more).
const (
	CapXBZRLE                MigrationCapability = "xbzrle"
	CapAutoConverge          MigrationCapability = "auto-converge"
	CapEvents                MigrationCapability = "events"
	CapPostcopyRAM           MigrationCapability = "postcopy-ram"
	CapReturnPath            MigrationCapability = "return-path"
	CapPauseBeforeSwitchover MigrationCapability = "pause-before-switchover"
	CapLateBlockActivate     MigrationCapability = "late-block-activate"
	CapMultifd               MigrationCapability = "multifd"
	CapZeroCopySend          MigrationCapability = "zero-copy-send"
)

// MigrationCapabilityStatus is one entry of migrate-set-capabilities.
type MigrationCapabilityStatus struct {
	Capability MigrationCapability `json:"capability"`
	State      bool                `json:"state"`
}

// MigrateSetCapabilities sets migration capabilities, on both ends, before
// migrating.
func (m *Monitor) MigrateSetCapabilities(ctx context.Context, caps []MigrationCapabilityStatus) error {
	args := struct {
		Capabilities []MigrationCapabilityStatus `json:"capabilities"`
	}{caps}
	return m.Call(ctx, "migrate-set-capabilities", args, nil)
}

// MigrateParameters are the migrate-set-parameters members qvirt sets; nil
// leaves a parameter unchanged. Units are QEMU's: bytes per second,
// milliseconds, percent.
type MigrateParameters struct {
	MaxBandwidth         *int64  `json:"max-bandwidth,omitempty"`
	DowntimeLimit        *int64  `json:"downtime-limit,omitempty"`
	MaxPostcopyBandwidth *int64  `json:"max-postcopy-bandwidth,omitempty"`
	MultifdChannels      *int64  `json:"multifd-channels,omitempty"`
	MultifdCompression   *string `json:"multifd-compression,omitempty"`
	XBZRLECacheSize      *int64  `json:"xbzrle-cache-size,omitempty"`
	CPUThrottleInitial   *int64  `json:"cpu-throttle-initial,omitempty"`
	CPUThrottleIncrement *int64  `json:"cpu-throttle-increment,omitempty"`
	MaxCPUThrottle       *int64  `json:"max-cpu-throttle,omitempty"`
	TLSCreds             *string `json:"tls-creds,omitempty"`
	TLSHostname          *string `json:"tls-hostname,omitempty"`
}

// MigrateSetParameters sets migration parameters.
func (m *Monitor) MigrateSetParameters(ctx context.Context, p MigrateParameters) error {
	return m.Call(ctx, "migrate-set-parameters", p, nil)
}

// MigrationStatus is the state of a migration.
type MigrationStatus string

// Migration states of QEMU 7.2.
const (
	MigrationNone           MigrationStatus = "none"
	MigrationSetup          MigrationStatus = "setup"
	MigrationCancelling     MigrationStatus = "cancelling"
	MigrationCancelled      MigrationStatus = "cancelled"
	MigrationActive         MigrationStatus = "active"
	MigrationPostcopyActive MigrationStatus = "postcopy-active"
	MigrationPostcopyPaused MigrationStatus = "postcopy-paused"
	MigrationCompleted      MigrationStatus = "completed"
	MigrationFailed         MigrationStatus = "failed"
	MigrationPreSwitchover  MigrationStatus = "pre-switchover"
	MigrationDevice         MigrationStatus = "device"
	MigrationWaitUnplug     MigrationStatus = "wait-unplug"
)

// MigrationInfo is query-migrate's reply. Members QEMU leaves out, which
// depends on the state, are zero. Times are in milliseconds.
type MigrationInfo struct {
	Status           MigrationStatus `json:"status"`
	RAM              *MigrationStats `json:"ram,omitempty"`
	TotalTime        int64           `json:"total-time"`
	ExpectedDowntime int64           `json:"expected-downtime"`
	Downtime         int64           `json:"downtime"`
	SetupTime        int64           `json:"setup-time"`
	CPUThrottle      int64           `json:"cpu-throttle-percentage"`
	ErrorDesc        string          `json:"error-desc"`
	BlockedReasons   []string        `json:"blocked-reasons"`
}

// MigrationStats is the "ram" member of query-migrate. Byte counts are in
// bytes, Mbps in megabits per second.
type MigrationStats struct {
	Transferred    int64   `json:"transferred"`
	Remaining      int64   `json:"remaining"`
	Total          int64   `json:"total"`
	Duplicate      int64   `json:"duplicate"`
	Normal         int64   `json:"normal"`
	NormalBytes    int64   `json:"normal-bytes"`
	DirtyPagesRate int64   `json:"dirty-pages-rate"`
	Mbps           float64 `json:"mbps"`
	DirtySyncCount int64   `json:"dirty-sync-count"`
	PageSize       int64   `json:"page-size"`
	PagesPerSecond int64   `json:"pages-per-second"`
	PrecopyBytes   int64   `json:"precopy-bytes"`
	DowntimeBytes  int64   `json:"downtime-bytes"`
	PostcopyBytes  int64   `json:"postcopy-bytes"`
	MultifdBytes   int64   `json:"multifd-bytes"`
}

// QueryMigrate reports the progress of the current or last migration.
func (m *Monitor) QueryMigrate(ctx context.Context) (MigrationInfo, error) {
	var info MigrationInfo
	err := m.Call(ctx, "query-migrate", nil, &info)
	return info, err
}
