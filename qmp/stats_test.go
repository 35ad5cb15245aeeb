package qmp_test

import (
	"os"
	"strconv"
	"testing"
)

// TestQEMUStatsQueries checks the typed stats queries against a real QEMU: the vCPU threads are
// QEMU's own tasks, and a blockdev-attached drive is found by its node name and device id.
func TestQEMUStatsQueries(t *testing.T) {
	m, p := startQEMU(t, qemuConfig{args: []string{
		"-smp", "2",
		"-blockdev", "driver=null-co,node-name=drive-data,size=1048576",
		"-device", "pcie-root-port,id=rp0,bus=pcie.0,chassis=1",
		"-device", "virtio-blk-pci,id=disk-data,bus=rp0,drive=drive-data",
	}})
	ctx := testContext(t)

	cpus, err := m.QueryCPUsFast(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) != 2 {
		t.Fatalf("query-cpus-fast listed %d vCPUs, want 2: %+v", len(cpus), cpus)
	}
	for i, c := range cpus {
		if c.CPUIndex != i || c.ThreadID <= 0 || c.Target != "x86_64" {
			t.Errorf("vCPU %d: %+v", i, c)
		}
		task := "/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/task/" + strconv.Itoa(c.ThreadID)
		if _, err := os.Stat(task); err != nil {
			t.Errorf("vCPU %d's thread is not a task of QEMU: %v", i, err)
		}
	}

	stats, err := m.QueryBlockstats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 {
		t.Fatalf("query-blockstats listed %d drives, want 1: %+v", len(stats), stats)
	}
	s := stats[0]
	if s.NodeName != "drive-data" || s.QDev != "/machine/peripheral/disk-data/virtio-backend" || s.Device != "" {
		t.Errorf("drive identified as node %q qdev %q device %q", s.NodeName, s.QDev, s.Device)
	}
	if s.Stats.RdBytes != 0 || s.Stats.WrOperations != 0 {
		t.Errorf("a drive nobody used has counters: %+v", s.Stats)
	}
}
