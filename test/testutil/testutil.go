// Package testutil holds small helpers shared by tests across packages.
package testutil

import (
	"bytes"
	"io"
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

// FreePortPair is a TCP port on loopback that nobody listens on now, nor on the port above it
// (a component that also takes port+1: etcd's peer URL, the kubelet's health port).
func FreePortPair(t *testing.T) int {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+1))); err == nil {
			l2.Close()
			return port
		}
	}
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
