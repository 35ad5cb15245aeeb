package guestagent

import (
	"context"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// realInterfaces is the test guest's guest-network-get-interfaces reply with one NIC (qemu-ga 7.2).
const realInterfaces = `{"return": [{"name": "lo", "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "127.0.0.1", "prefix": 8}, {"ip-address-type": "ipv6", "ip-address": "::1", "prefix": 128}], "statistics": {"tx-packets": 0, "tx-errs": 0, "rx-bytes": 0, "rx-dropped": 0, "rx-packets": 0, "rx-errs": 0, "tx-bytes": 0, "tx-dropped": 0}, "hardware-address": "00:00:00:00:00:00"}, {"name": "eth0", "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "10.213.81.2", "prefix": 30}, {"ip-address-type": "ipv6", "ip-address": "fe80::ff:feaa:bb81", "prefix": 64}], "statistics": {"tx-packets": 12, "tx-errs": 0, "rx-bytes": 1180, "rx-dropped": 0, "rx-packets": 4, "rx-errs": 0, "tx-bytes": 1836, "tx-dropped": 0}, "hardware-address": "02:00:00:aa:bb:81"}]}` + "\n"

// BenchmarkInterfacesPoll is the launcher's side of one poll of a connected agent (what it does
// every AgentPollInterval): one guest-network-get-interfaces round trip over a unix socket to a
// fake agent answering the test guest's reply. It reports the launcher process's CPU time per
// poll (user+system, the fake agent's share included, so an upper bound).
func BenchmarkInterfacesPoll(b *testing.B) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		b.Fatal(err)
	}
	host, _ := net.FileConn(fdFile(fds[0], "host"))
	guest, _ := net.FileConn(fdFile(fds[1], "guest"))
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := guest.Read(buf); err != nil {
				return
			}
			if _, err := guest.Write([]byte(realInterfaces)); err != nil {
				return
			}
		}
	}()
	c := New(host)
	defer c.Close()
	ctx := context.Background()
	var before, after syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	b.ResetTimer()
	for range b.N {
		ifs, err := c.Interfaces(ctx)
		if err != nil || len(ifs) != 2 {
			b.Fatalf("%v %v", ifs, err)
		}
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/poll")
}

func fdFile(fd int, name string) *os.File { return os.NewFile(uintptr(fd), name) }

// BenchmarkDecodeInterfaces is the decoding part of a poll: the reply line to the launcher's
// interfaces, for the test guest's reply (guest) and for a guest that lists MaxItems*4 interfaces
// (over-cap), of which MaxItems are decoded.
func BenchmarkDecodeInterfaces(b *testing.B) {
	many := `{"return": [` + strings.Repeat(`{"name": "eth0", "ip-addresses": [{"ip-address-type": "ipv4", "ip-address": "10.0.0.1", "prefix": 8}], "hardware-address": "02:00:00:aa:bb:81"},`, 4*MaxItems-1) +
		`{"name": "eth1"}]}`
	for _, c := range []struct{ name, line string }{{"guest", realInterfaces}, {"over-cap", many}} {
		b.Run(c.name, func(b *testing.B) {
			line := []byte(c.line)
			b.ReportAllocs()
			for range b.N {
				raw, err := ParseReply(line)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := DecodeInterfaces(raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
