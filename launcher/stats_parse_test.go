package launcher

import (
	"os"
	"strconv"
	"testing"
	"time"
)

const netDevSample = `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
tap-a1b2:  5120      40    1    2    0     0          0         0   998877     900    3    4    0     0       0          0
`

func TestParseNetDev(t *testing.T) {
	got, err := parseNetDev([]byte(netDevSample))
	if err != nil {
		t.Fatal(err)
	}
	want := linkCounters{RxBytes: 5120, RxPackets: 40, RxErrors: 1, RxDropped: 2, TxBytes: 998877, TxPackets: 900, TxErrors: 3, TxDropped: 4}
	if got["tap-a1b2"] != want || got["lo"].RxBytes != 1000 || len(got) != 2 {
		t.Fatalf("parsed %+v", got)
	}
	for _, bad := range []string{
		"h1\nh2\nnocolon 1 2 3\n",
		"h1\nh2\neth0: 1 2 3\n",
		"h1\nh2\neth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 x\n",
	} {
		if _, err := parseNetDev([]byte(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
	// This process's own table parses.
	data, err := os.ReadFile("/proc/self/net/dev")
	if err != nil {
		t.Fatal(err)
	}
	if own, err := parseNetDev(data); err != nil || len(own) == 0 {
		t.Fatalf("/proc/self/net/dev: %v (%d devices)", err, len(own))
	}
}

func TestParseStatTimes(t *testing.T) {
	// A command name with spaces and a ')' must not shift the fields.
	line := "4242 (qemu) (cpu 0) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 3 0 100 0 0\n"
	u, s, err := parseStatTimes([]byte(line))
	if err != nil || u != 1234 || s != 567 {
		t.Fatalf("utime %d stime %d err %v, want 1234 567", u, s, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 u 3"} {
		if _, _, err := parseStatTimes([]byte(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
	// This process's own line parses, and the tick is USER_HZ.
	if _, err := readProcessCPU("/proc/" + strconv.Itoa(os.Getpid()) + "/stat"); err != nil {
		t.Fatal(err)
	}
	if clockTick() != 10*time.Millisecond {
		t.Errorf("clock tick %s, want 10ms (USER_HZ 100)", clockTick())
	}
}

func TestParseVmRSS(t *testing.T) {
	rss, err := parseVmRSS([]byte("Name:\tqemu\nVmHWM:\t  2000 kB\nVmRSS:\t  1536 kB\n"))
	if err != nil || rss != 1536<<10 {
		t.Fatalf("rss %d err %v, want %d", rss, err, 1536<<10)
	}
	for _, bad := range []string{"Name:\tkthreadd\n", "VmRSS:\t12 MB\n", "VmRSS:\t-1 kB\n"} {
		if _, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
}

func TestQdevID(t *testing.T) {
	for in, want := range map[string]string{
		"/machine/peripheral/disk-data/virtio-backend": "disk-data",
		"disk-root":                         "disk-root",
		"/machine/unattached/device[3]/foo": "",
		"":                                  "",
	} {
		if got := qdevID(in); got != want {
			t.Errorf("qdevID(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzStatsParsers feeds the same bytes to the three /proc parsers: none may panic, and what they
// return must be well formed.
func FuzzStatsParsers(f *testing.F) {
	f.Add([]byte(netDevSample))
	f.Add([]byte("4242 (qemu) (cpu 0) S 1 4242 4242 0 -1 4194560 100 0 0 0 1234 567 0 0 20 0 3 0 100 0 0\n"))
	f.Add([]byte("VmRSS:\t  1536 kB\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if devs, err := parseNetDev(data); err != nil && devs != nil {
			t.Fatalf("parseNetDev returned devices with error %v", err)
		}
		_, _, _ = parseStatTimes(data)
		if rss, err := parseVmRSS(data); err == nil && (rss < 0 || rss%1024 != 0) {
			t.Fatalf("VmRSS %d bytes from %q", rss, data)
		}
	})
}
