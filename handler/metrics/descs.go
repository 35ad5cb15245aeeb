package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/qvirt/qvirt/launcher/protocol"
)

// The series, named after KubeVirt's kubevirt_vmi_* with the prefix qvirt_.

// vmiLabels identify a VMI; every per-VMI series starts with them.
var vmiLabels = []string{"node", "namespace", "name"}

func vmiDesc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append(vmiLabels[:len(vmiLabels):len(vmiLabels)], extra...), nil)
}

var (
	phaseCountDesc = prometheus.NewDesc("qvirt_vmi_phase_count",
		"Number of VMIs on this node per phase (lower case: pending, scheduling, scheduled, running, succeeded, failed, unknown).",
		[]string{"node", "phase"}, nil)
	scrapeErrorsDesc = prometheus.NewDesc("qvirt_handler_scrape_errors_total",
		"VMIs left out of a scrape because their launcher did not answer in time, plus failed VMI lists.",
		nil, nil)

	cpuUsageDesc = vmiDesc("qvirt_vmi_cpu_usage_seconds_total",
		"Total CPU time of the VMI's QEMU process in all modes (vCPUs and emulator threads).")
	cpuUserDesc = vmiDesc("qvirt_vmi_cpu_user_usage_seconds_total",
		"CPU time of the VMI's QEMU process in user mode.")
	cpuSystemDesc = vmiDesc("qvirt_vmi_cpu_system_usage_seconds_total",
		"CPU time of the VMI's QEMU process in system mode.")
	vcpuSecondsDesc = vmiDesc("qvirt_vmi_vcpu_seconds_total",
		"CPU time of each vCPU's host thread (halted time not included). id is the vCPU index; state is always running.",
		"id", "state")
	memoryResidentDesc = vmiDesc("qvirt_vmi_memory_resident_bytes",
		"Resident set size of the VMI's QEMU process: guest RAM touched so far plus QEMU's own memory.")
)

type diskMetric struct {
	desc  *prometheus.Desc
	value func(*protocol.DiskStats) float64
}

func driveDesc(name, help string) *prometheus.Desc { return vmiDesc(name, help, "drive") }

// diskMetrics are per drive; drive is the disk's name in the VMI spec.
var diskMetrics = []diskMetric{
	{driveDesc("qvirt_vmi_storage_read_traffic_bytes_total", "Total bytes the guest read from the drive."),
		func(d *protocol.DiskStats) float64 { return float64(d.ReadBytes) }},
	{driveDesc("qvirt_vmi_storage_write_traffic_bytes_total", "Total bytes the guest wrote to the drive."),
		func(d *protocol.DiskStats) float64 { return float64(d.WriteBytes) }},
	{driveDesc("qvirt_vmi_storage_iops_read_total", "Total read operations on the drive."),
		func(d *protocol.DiskStats) float64 { return float64(d.ReadOps) }},
	{driveDesc("qvirt_vmi_storage_iops_write_total", "Total write operations on the drive."),
		func(d *protocol.DiskStats) float64 { return float64(d.WriteOps) }},
	{driveDesc("qvirt_vmi_storage_flush_requests_total", "Total flush requests on the drive."),
		func(d *protocol.DiskStats) float64 { return float64(d.FlushOps) }},
	{driveDesc("qvirt_vmi_storage_read_times_seconds_total", "Total time spent on the drive's read operations."),
		func(d *protocol.DiskStats) float64 { return d.ReadTime.Seconds() }},
	{driveDesc("qvirt_vmi_storage_write_times_seconds_total", "Total time spent on the drive's write operations."),
		func(d *protocol.DiskStats) float64 { return d.WriteTime.Seconds() }},
	{driveDesc("qvirt_vmi_storage_flush_times_seconds_total", "Total time spent on the drive's flush requests."),
		func(d *protocol.DiskStats) float64 { return d.FlushTime.Seconds() }},
}

type nicMetric struct {
	desc  *prometheus.Desc
	value func(*protocol.InterfaceStats) float64
}

func ifaceDesc(name, help string) *prometheus.Desc { return vmiDesc(name, help, "interface") }

// nicMetrics are per interface, in the guest's direction; interface is the spec's interface name.
var nicMetrics = []nicMetric{
	{ifaceDesc("qvirt_vmi_network_receive_bytes_total", "Total bytes the guest received on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.RxBytes) }},
	{ifaceDesc("qvirt_vmi_network_transmit_bytes_total", "Total bytes the guest transmitted on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.TxBytes) }},
	{ifaceDesc("qvirt_vmi_network_receive_packets_total", "Total packets the guest received on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.RxPackets) }},
	{ifaceDesc("qvirt_vmi_network_transmit_packets_total", "Total packets the guest transmitted on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.TxPackets) }},
	{ifaceDesc("qvirt_vmi_network_receive_errors_total", "Total receive errors on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.RxErrors) }},
	{ifaceDesc("qvirt_vmi_network_transmit_errors_total", "Total transmit errors on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.TxErrors) }},
	{ifaceDesc("qvirt_vmi_network_receive_packets_dropped_total", "Total packets for the guest dropped on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.RxDropped) }},
	{ifaceDesc("qvirt_vmi_network_transmit_packets_dropped_total", "Total packets from the guest dropped on the interface."),
		func(n *protocol.InterfaceStats) float64 { return float64(n.TxDropped) }},
}

func allDescs() []*prometheus.Desc {
	out := []*prometheus.Desc{phaseCountDesc, scrapeErrorsDesc, cpuUsageDesc, cpuUserDesc, cpuSystemDesc, vcpuSecondsDesc, memoryResidentDesc}
	for _, m := range diskMetrics {
		out = append(out, m.desc)
	}
	for _, m := range nicMetrics {
		out = append(out, m.desc)
	}
	return out
}
