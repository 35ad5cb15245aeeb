package qmp_test

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/qvirt/qvirt/qmp"
	"github.com/qvirt/qvirt/qmp/qmptest"
)

func ptr[T any](v T) *T { return &v }

// TestCommandArguments pins the wire form of every typed command: the
// command name and the exact argument object QEMU 7.2 expects.
func TestCommandArguments(t *testing.T) {
	tests := []struct {
		name     string
		call     func(ctx context.Context, m *qmp.Monitor) error
		wantCmd  string
		wantArgs string // "" for no arguments member
	}{
		{"cont", func(ctx context.Context, m *qmp.Monitor) error { return m.Cont(ctx) }, "cont", ""},
		{"stop", func(ctx context.Context, m *qmp.Monitor) error { return m.Stop(ctx) }, "stop", ""},
		{"powerdown", func(ctx context.Context, m *qmp.Monitor) error { return m.SystemPowerdown(ctx) }, "system_powerdown", ""},
		{"reset", func(ctx context.Context, m *qmp.Monitor) error { return m.SystemReset(ctx) }, "system_reset", ""},
		{"quit", func(ctx context.Context, m *qmp.Monitor) error { return m.Quit(ctx) }, "quit", ""},
		{
			"blockdev-add typed",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.BlockdevAdd(ctx, qmp.BlockdevOptions{
					Driver: "qcow2", NodeName: "disk0", ReadOnly: ptr(false), Cache: &qmp.BlockdevCache{Direct: ptr(true)},
					File:  qmp.BlockdevOptions{Driver: "file", NodeName: "disk0-file", Filename: "/var/lib/disk.qcow2"},
					Props: map[string]any{"lazy-refcounts": true},
				})
			},
			"blockdev-add",
			`{"cache":{"direct":true},"driver":"qcow2","file":{"driver":"file","filename":"/var/lib/disk.qcow2","node-name":"disk0-file"},"lazy-refcounts":true,"node-name":"disk0","read-only":false}`,
		},
		{
			"blockdev-add map",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.BlockdevAdd(ctx, map[string]any{"driver": "null-co", "node-name": "null0", "size": 1 << 20})
			},
			"blockdev-add", `{"driver":"null-co","node-name":"null0","size":1048576}`,
		},
		{"blockdev-del", func(ctx context.Context, m *qmp.Monitor) error { return m.BlockdevDel(ctx, "null0") }, "blockdev-del", `{"node-name":"null0"}`},
		{
			"device_add",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.DeviceAdd(ctx, qmp.Device{Driver: "virtio-blk-pci", ID: "disk0", Bus: "rp1", Props: map[string]any{"drive": "null0", "serial": "abc"}})
			},
			"device_add", `{"bus":"rp1","driver":"virtio-blk-pci","drive":"null0","id":"disk0","serial":"abc"}`,
		},
		{"device_del", func(ctx context.Context, m *qmp.Monitor) error { return m.DeviceDel(ctx, "disk0") }, "device_del", `{"id":"disk0"}`},
		{
			"netdev_add tap by name",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.NetdevAddTap(ctx, qmp.NetdevTap{ID: "net0", Ifname: "tap0", VNetHdr: ptr(true)})
			},
			"netdev_add", `{"downscript":"no","id":"net0","ifname":"tap0","script":"no","type":"tap","vnet_hdr":true}`,
		},
		{
			"netdev_add tap by fd",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.NetdevAddTap(ctx, qmp.NetdevTap{ID: "net0", FD: "tapfd0"})
			},
			"netdev_add", `{"fd":"tapfd0","id":"net0","type":"tap"}`,
		},
		{"netdev_del", func(ctx context.Context, m *qmp.Monitor) error { return m.NetdevDel(ctx, "net0") }, "netdev_del", `{"id":"net0"}`},
		{
			"migrate",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.Migrate(ctx, qmp.MigrateOptions{URI: "unix:/run/mig.sock"})
			},
			"migrate", `{"uri":"unix:/run/mig.sock"}`,
		},
		{"migrate-incoming", func(ctx context.Context, m *qmp.Monitor) error { return m.MigrateIncoming(ctx, "tcp:0:4444") }, "migrate-incoming", `{"uri":"tcp:0:4444"}`},
		{"migrate_cancel", func(ctx context.Context, m *qmp.Monitor) error { return m.MigrateCancel(ctx) }, "migrate_cancel", ""},
		{
			"migrate-set-capabilities",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.MigrateSetCapabilities(ctx, []qmp.MigrationCapabilityStatus{{Capability: qmp.CapEvents, State: true}, {Capability: qmp.CapXBZRLE}})
			},
			"migrate-set-capabilities", `{"capabilities":[{"capability":"events","state":true},{"capability":"xbzrle","state":false}]}`,
		},
		{
			"migrate-set-parameters",
			func(ctx context.Context, m *qmp.Monitor) error {
				return m.MigrateSetParameters(ctx, qmp.MigrateParameters{MaxBandwidth: ptr(int64(0)), DowntimeLimit: ptr(int64(300))})
			},
			"migrate-set-parameters", `{"downtime-limit":300,"max-bandwidth":0}`,
		},
		{"closefd", func(ctx context.Context, m *qmp.Monitor) error { return m.CloseFD(ctx, "tap0") }, "closefd", `{"fdname":"tap0"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, c := connect(t)
			got := make(chan qmptest.Request, 1)
			serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
				got <- req
				return c.Reply(req, struct{}{})
			})
			if err := tt.call(testContext(t), m); err != nil {
				t.Fatal(err)
			}
			req := receive(t, got)
			if req.Execute != tt.wantCmd {
				t.Errorf("sent %q, want %q", req.Execute, tt.wantCmd)
			}
			assertJSON(t, req.Arguments, tt.wantArgs)
		})
	}
}

func assertJSON(t *testing.T, got json.RawMessage, want string) {
	t.Helper()
	if want == "" {
		if got != nil {
			t.Errorf("arguments %s, want none", got)
		}
		return
	}
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("arguments %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("bad expectation %s: %v", want, err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("arguments\n got %s\nwant %s", got, want)
	}
}

func TestDuplicatePropertyIsRejected(t *testing.T) {
	m, _ := connect(t)
	err := m.DeviceAdd(testContext(t), qmp.Device{Driver: "virtio-net-pci", ID: "nic0", Props: map[string]any{"id": "other"}})
	if err == nil {
		t.Fatal("DeviceAdd with id in Props succeeded")
	}
}

func TestQueryReplies(t *testing.T) {
	replies := map[string]string{
		"query-status":          `{"status": "prelaunch", "singlestep": false, "running": false}`,
		"query-version":         `{"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7+deb12u18+b3"}`,
		"query-migrate":         `{"status": "completed", "setup-time": 3, "downtime": 12, "total-time": 260, "ram": {"transferred": 1000, "remaining": 0, "total": 67108864, "mbps": 812.5, "duplicate": 16000, "normal": 100, "normal-bytes": 409600, "dirty-sync-count": 3, "page-size": 4096}}`,
		"human-monitor-command": `"QEMU 7.2.22\r\n"`,
	}
	m, c := connect(t)
	serve(t, c, func(c *qmptest.Conn, req qmptest.Request) error {
		return c.Reply(req, json.RawMessage(replies[req.Execute]))
	})
	ctx := testContext(t)

	st, err := m.QueryStatus(ctx)
	if err != nil || st != (qmp.StatusInfo{Running: false, Status: qmp.StatePrelaunch}) {
		t.Errorf("QueryStatus = %+v, %v", st, err)
	}
	v, err := m.QueryVersion(ctx)
	if err != nil || v.String() != "7.2.22" {
		t.Errorf("QueryVersion = %s, %v", v, err)
	}
	mi, err := m.QueryMigrate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if mi.Status != qmp.MigrationCompleted || mi.TotalTime != 260 || mi.Downtime != 12 || mi.SetupTime != 3 ||
		mi.RAM == nil || mi.RAM.Total != 67108864 || mi.RAM.Transferred != 1000 || mi.RAM.Mbps != 812.5 {
		t.Errorf("QueryMigrate = %+v (ram %+v)", mi, mi.RAM)
	}
	out, err := m.HumanMonitorCommand(ctx, "info version")
	if err != nil || out != "QEMU 7.2.22\r\n" {
		t.Errorf("HumanMonitorCommand = %q, %v", out, err)
	}
}
