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
)

// The downward metrics server: KubeVirt's downwardMetrics device, vhostmd's virtio transport. The
// guest writes "GET /metrics/XML" and a blank line on the port org.github.vhostmd.1 (channel.go)
// and reads the metrics document, also ended by a blank line: its node's name, CPUs, CPU time and
// free memory, and its own CPU time and sizes, as vm-dump-metrics reads them. The guest's bytes
// are untrusted: a request is read up to maxMetricsRequest bytes (a longer line is dropped whole),
// the answers are paced (metricsAnswerInterval), and the document is built at most once per
// metricsMinInterval however often the guest asks.

const (
	metricsRequest     = "GET /metrics/XML"
	maxMetricsRequest  = 256
	metricsMinInterval = time.Second
	// metricsAnswerInterval paces the answers: a guest asking in a loop gets ten a second.
	metricsAnswerInterval = 100 * time.Millisecond
	// metricsRedial is how long the server waits before connecting again to QEMU's end of the
	// port, when it could not or its connection ended while QEMU runs.
	metricsRedial = time.Second
)

// serveDownwardMetrics answers the guest's metrics requests until QEMU exits.
func (l *Launcher) serveDownwardMetrics(p *Process) {
	socket := Dir(p.Machine().RunDir).DownwardMetrics()
	log := l.opts.Log.WithValues("socket", socket)
	cache := metricsCache{build: func() ([]byte, error) { return metricsDocument(p) }}
	dialFailed := false
	for {
		conn, err := net.Dial("unix", socket)
		switch {
		case err != nil && !dialFailed:
			// Once per run of failures: QEMU serves the socket for as long as it runs.
			log.Error(err, "cannot reach the downward metrics port; retrying")
			dialFailed = true
		case err == nil:
			dialFailed = false
			err := serveMetrics(conn, cache.get, metricsAnswerInterval, func(err error) {
				log.Error(err, "downward metrics: no answer to the guest's request")
			})
			log.V(1).Info("downward metrics connection ended", "err", err.Error())
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
// each metrics request, at most one answer per interval (a later one waits); other requests, and
// lines too long to be part of one, are dropped. A document doc cannot build is reported to
// failed and the request goes unanswered. It returns when conn fails or ends (io.EOF).
func serveMetrics(conn io.ReadWriter, doc func() ([]byte, error), interval time.Duration, failed func(error)) error {
	r := bufio.NewReaderSize(conn, maxMetricsRequest)
	var req []byte
	discarding := false // the rest of an overlong line
	var next time.Time
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			req, discarding = req[:0], true
			continue
		}
		if err != nil {
			return err
		}
		if discarding {
			discarding = false
			continue
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
		asked := string(bytes.TrimSpace(req)) == metricsRequest
		req = req[:0]
		if !asked {
			continue
		}
		time.Sleep(time.Until(next))
		next = time.Now().Add(interval)
		answer, err := doc()
		if err != nil {
			failed(err)
			continue
		}
		if _, err := conn.Write(append(answer, "\n\n"...)); err != nil {
			return err
		}
	}
}

// metricsCache keeps the last document build made for metricsMinInterval.
type metricsCache struct {
	build func() ([]byte, error)
	at    time.Time
	doc   []byte
}

func (c *metricsCache) get() ([]byte, error) {
	if c.doc != nil && time.Since(c.at) < metricsMinInterval {
		return c.doc, nil
	}
	doc, err := c.build()
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
// and the guest (QEMU's CPU time, its vCPUs and memory as plugged so far).
func metricsDocument(p *Process) ([]byte, error) {
	cpu, err := readHostCPU()
	if err != nil {
		return nil, fmt.Errorf("read the node's CPU time: %w", err)
	}
	mem, err := readHostMemory()
	if err != nil {
		return nil, fmt.Errorf("read the node's memory: %w", err)
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
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	doc := metricsXML{Metrics: []metricXML{
		host("string", "", "HostName", m.DownwardMetrics.NodeName),
		host("string", "", "HostSystemInfo", "linux"),
		host("string", "", "VirtualizationVendor", "qvirt.io"),
		host("string", "", "VirtProductInfo", "qvirt"),
		host("uint32", "", "NumberOfPhysicalCPUs", u(uint64(cpu.CPUs))),
		host("real64", "s", "TotalCPUTime", f(cpu.BusySeconds)),
		host("uint64", "KiB", "FreePhysicalMemory", u(mem.MemFree)),
		host("uint64", "KiB", "FreeVirtualMemory", u(mem.MemFree+mem.SwapFree)),
		host("uint64", "KiB", "UsedVirtualMemory", u(mem.MemTotal-mem.MemFree+mem.SwapTotal-mem.SwapFree)),
		host("uint64", "s", "Time", u(uint64(time.Now().Unix()))),
		vm("real64", "s", "TotalCPUTime", f(qemu.Total().Seconds())),
		vm("real64", "", "ResourceProcessorLimit", u(uint64(p.Sockets()*m.CPU.Cores*m.CPU.Threads))),
		vm("uint64", "MiB", "PhysicalMemoryAllocatedToVirtualSystem", u(uint64(m.MemoryMiB+p.memPlugged.Load()))),
		vm("uint64", "MiB", "ResourceMemoryLimit", u(uint64(m.MemoryMiB+p.memRequested.Load()))),
	}}
	return xml.MarshalIndent(doc, "", "  ")
}
