package launcher

import (
	"bufio"
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/procfs"
)

// The downward metrics server: KubeVirt's downwardMetrics device, vhostmd's virtio transport. The
// guest writes "GET /metrics/XML" and a blank line on the port org.github.vhostmd.1 (channel.go)
// and reads the metrics document, also ended by a blank line: its node's name, CPUs, CPU time and
// free memory, and its own CPU time and sizes, as vm-dump-metrics reads them. The guest's bytes
// are untrusted: a request is read up to maxMetricsRequest bytes, and the document is built at
// most once per metricsMinInterval however often the guest asks.

const (
	metricsRequest     = "GET /metrics/XML"
	maxMetricsRequest  = 256
	metricsMinInterval = time.Second
	// metricsRedial is how long the server waits before connecting again to QEMU's end of the
	// port, when it could not or its connection ended while QEMU runs.
	metricsRedial = time.Second
)

// serveDownwardMetrics answers the guest's metrics requests until QEMU exits.
func (l *Launcher) serveDownwardMetrics(p *Process) {
	socket := Dir(p.Machine().RunDir).DownwardMetrics()
	var cache metricsCache
	for {
		if conn, err := net.Dial("unix", socket); err == nil {
			err := serveMetrics(conn, func() ([]byte, error) { return cache.get(p) })
			l.opts.Log.V(1).Info("downward metrics connection ended", "err", err.Error())
			_ = conn.Close()
		}
		select {
		case <-p.Done():
			return
		case <-time.After(metricsRedial):
		}
	}
}

// serveMetrics reads requests from conn, each ended by a blank line, and writes doc's answer to
// each metrics request; other requests, and lines too long to be one, are dropped. It returns
// when conn fails or ends (io.EOF).
func serveMetrics(conn io.ReadWriter, doc func() ([]byte, error)) error {
	r := bufio.NewReaderSize(conn, maxMetricsRequest)
	var req []byte
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			req = req[:0] // junk: no request is this long
			continue
		}
		if err != nil {
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) > 0 {
			if len(req)+len(line) > maxMetricsRequest {
				req = req[:0]
			}
			req = append(req, line...)
			continue
		}
		// A blank line ends the request.
		if string(bytes.TrimSpace(req)) == metricsRequest {
			answer, err := doc()
			if err != nil {
				return fmt.Errorf("downward metrics: %w", err)
			}
			if _, err := conn.Write(append(answer, "\n\n"...)); err != nil {
				return err
			}
		}
		req = req[:0]
	}
}

// metricsCache keeps the last metrics document for metricsMinInterval.
type metricsCache struct {
	at  time.Time
	doc []byte
}

func (c *metricsCache) get(p *Process) ([]byte, error) {
	if c.doc != nil && time.Since(c.at) < metricsMinInterval {
		return c.doc, nil
	}
	doc, err := metricsDocument(p)
	if err != nil {
		return nil, err
	}
	c.at, c.doc = time.Now(), doc
	return doc, nil
}

// vhostmd's document: <metrics><metric type= context= [unit=]><name/><value/></metric>...
type metricsXML struct {
	XMLName xml.Name    `xml:"metrics"`
	Metrics []metricXML `xml:"metric"`
}

type metricXML struct {
	Type    string `xml:"type,attr"`
	Context string `xml:"context,attr"`
	Unit    string `xml:"unit,attr,omitempty"`
	Name    string `xml:"name"`
	Value   string `xml:"value"`
}

// metricsDocument measures the node (from /proc, which the launcher's pod shares with its node)
// and the guest (QEMU's CPU time, the machine's sizes).
func metricsDocument(p *Process) ([]byte, error) {
	fs, err := procfs.NewFS("/proc")
	if err != nil {
		return nil, err
	}
	stat, err := fs.Stat()
	if err != nil {
		return nil, fmt.Errorf("read /proc/stat: %w", err)
	}
	mem, err := fs.Meminfo()
	if err != nil {
		return nil, fmt.Errorf("read /proc/meminfo: %w", err)
	}
	qemu, err := readProcessCPU(procPath(p.Pid(), "stat"))
	if err != nil {
		return nil, fmt.Errorf("read QEMU's CPU time: %w", err)
	}
	m := p.Machine()
	host := func(typ, unit, name, value string) metricXML {
		return metricXML{Type: typ, Context: "host", Unit: unit, Name: name, Value: value}
	}
	vm := func(typ, unit, name, value string) metricXML {
		return metricXML{Type: typ, Context: "vm", Unit: unit, Name: name, Value: value}
	}
	c := stat.CPUTotal
	hostCPU := c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	doc := metricsXML{Metrics: []metricXML{
		host("string", "", "HostName", m.DownwardMetrics.NodeName),
		host("string", "", "HostSystemInfo", "linux"),
		host("string", "", "VirtualizationVendor", "qvirt.io"),
		host("string", "", "VirtProductInfo", "qvirt"),
		host("uint32", "", "NumberOfPhysicalCPUs", u(uint64(len(stat.CPU)))),
		host("real64", "s", "TotalCPUTime", f(hostCPU)),
		host("uint64", "KiB", "FreePhysicalMemory", u(deref(mem.MemFree))),
		host("uint64", "KiB", "FreeVirtualMemory", u(deref(mem.MemFree)+deref(mem.SwapFree))),
		host("uint64", "KiB", "UsedVirtualMemory", u(deref(mem.MemTotal)-deref(mem.MemFree)+deref(mem.SwapTotal)-deref(mem.SwapFree))),
		host("uint64", "s", "Time", u(uint64(time.Now().Unix()))),
		vm("real64", "s", "TotalCPUTime", f(qemu.Total().Seconds())),
		vm("real64", "", "ResourceProcessorLimit", u(uint64(m.CPU.VCPUs))),
		vm("uint64", "MiB", "PhysicalMemoryAllocatedToVirtualSystem", u(uint64(m.MemoryMiB))),
		vm("uint64", "MiB", "ResourceMemoryLimit", u(uint64(m.MemoryMiB))),
	}}
	return xml.MarshalIndent(doc, "", "  ")
}

func deref(v *uint64) uint64 {
	if v == nil {
		return 0
	}
	return *v
}
