// Package testutil holds small helpers shared by tests across packages.
package testutil

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/launcher/podlayout"
)

// SyncBuffer is a bytes.Buffer safe to write from a process's output copier while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// PodSocketDir makes launcher pod podUID's sockets volume under podsDir, as a kubelet lays it out
// (podlayout.HostSocketDir), and returns where its files really are: a short directory the
// volume's path links to, since the volume's own path is too long for the sockets a launcher
// running outside a pod's mount namespace binds there.
func PodSocketDir(t testing.TB, podsDir string, podUID types.UID) string {
	t.Helper()
	real, err := os.MkdirTemp("", "qvp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(real) })
	vol := podlayout.HostSocketDir(podsDir, string(podUID))
	if err := os.MkdirAll(filepath.Dir(vol), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, vol); err != nil {
		t.Fatal(err)
	}
	return real
}

// FreePortPair is a TCP port that nobody listens on now, nor on the port above it (a component
// that also takes port+1: etcd's peer URL, the kubelet's health port); see FreePort.
func FreePortPair(t *testing.T) int {
	t.Helper()
	return FreePortRun(t, 2)
}

// FreePort is a TCP port that nobody listens on now, for a component (QEMU, a server under test)
// that binds it a moment later. It is below the kernel's ephemeral range, so no outgoing
// connection takes it as its local port before the component binds it (CI: a controller
// replica's probe port, taken for the run by a long-lived client connection, never became
// ready). Ports are not handed out twice in a process.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePortRun(t, 1)
}

// FreePortRun is the first of n free ports in a row (replicas that take a port each from a base).
func FreePortRun(t testing.TB, n int) int {
	t.Helper()
	lo, hi := belowEphemeral(t)
	if hi-lo < 1024 {
		return kernelPortRun(t, n)
	}
	freePorts.Lock()
	defer freePorts.Unlock()
	for range 10000 {
		port := lo + rand.IntN(hi-lo-n+2) // the run ends at hi at most
		if runFree(port, n) {
			give(port, n)
			return port
		}
	}
	t.Fatalf("no %d free TCP ports in a row in %d-%d", n, lo, hi)
	return 0
}

// give records the n ports from port as handed out; freePorts is locked.
func give(port, n int) {
	for i := range n {
		freePorts.given[port+i] = true
	}
}

// runFree reports whether none of the n ports from port was handed out, and each can be listened on.
func runFree(port, n int) bool {
	for i := range n {
		if freePorts.given[port+i] || !listenable(port+i) {
			return false
		}
	}
	return true
}

var freePorts = struct {
	sync.Mutex
	given map[int]bool
}{given: map[int]bool{}}

// belowEphemeral is the range of ports FreePort picks from: up to 16384 ports below
// net.ipv4.ip_local_port_range, and above 1024 (empty when the range starts below 2048).
func belowEphemeral(t testing.TB) (lo, hi int) {
	t.Helper()
	const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"
	data, err := os.ReadFile(rangeFile)
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		t.Fatalf("%s: %q: want two ports", rangeFile, data)
	}
	eph, err := strconv.Atoi(fields[0])
	if err != nil {
		t.Fatalf("%s: %q: want the first ephemeral port first", rangeFile, data)
	}
	return max(1024, eph-16384), eph - 2
}

// kernelPortRun is FreePortRun where the ephemeral range leaves no room below it: a port the
// kernel picks, with the n-1 ports above it free too.
func kernelPortRun(t testing.TB, n int) int {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		freePorts.Lock()
		ok := runFree(port, n)
		if ok {
			give(port, n)
		}
		freePorts.Unlock()
		if ok {
			return port
		}
	}
}

// listenable reports whether port can be listened on, on loopback and on every address.
func listenable(port int) bool {
	for _, host := range []string{"127.0.0.1", "0.0.0.0"} {
		l, err := net.Listen("tcp4", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// HTTPBody gets url until it answers 200 OK, for up to d, and returns the body without its
// surrounding white space.
func HTTPBody(t testing.TB, url string, d time.Duration) string {
	t.Helper()
	hc := http.Client{Timeout: 5 * time.Second}
	var body string
	Eventually(t, d, "GET "+url, func() bool {
		resp, err := hc.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = strings.TrimSpace(string(b))
		return resp.StatusCode == http.StatusOK
	})
	return body
}

// ObserveRequests is a rest.Config's Wrap that calls seen with each request a client sends, before
// it goes: to count or record what the client asks of kube-apiserver.
func ObserveRequests(seen func(*http.Request)) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return observer{seen: seen, next: rt}
	}
}

type observer struct {
	seen func(*http.Request)
	next http.RoundTripper
}

func (o observer) RoundTrip(req *http.Request) (*http.Response, error) {
	o.seen(req)
	return o.next.RoundTrip(req)
}
