package provider

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/qvirt/qvirt/test/testutil"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestCleanupAfterCrash leaves what a crashed run leaves (a pod's namespace attached by CNI with
// its veth and IP reservation, its process with a pid file, the bridge, ip_forward changed) and
// checks that Cleanup removes all of it.
func TestCleanupAfterCrash(t *testing.T) {
	testutil.LockHostNetwork(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cacheDir, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	binDir, err := BuildCNIPlugins(ctx, filepath.Join(cacheDir, "qvirt", "cni"))
	if err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(t.TempDir(), "node")
	opts := Options{NodeName: "crashed", Config: &rest.Config{}, StateDir: stateDir, PodCIDR: "10.231.9.0/24",
		Bridge: "qvt-test-crash", CNIBinDir: binDir, InitBinary: "/nonexistent/qvirt-pod-init", Log: logr.Discard()}
	if err := opts.validate(); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{netnsDir, podsDir, ipamDir, cniCacheDir} {
		if err := os.MkdirAll(filepath.Join(stateDir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(stateDir, bridgeFile), []byte(opts.Bridge), 0o644); err != nil {
		t.Fatal(err)
	}
	// The bridge plugin turns ip_forward on; the crashed run had recorded the value before.
	origForward, err := os.ReadFile(ipForwardPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, ipForwardOld), origForward, 0o644); err != nil {
		t.Fatal(err)
	}
	net, err := newNetwork(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := net.ensureBridge(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeBridge(opts.Bridge) })
	nsPath, ip, err := net.add(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "pod-uid-1"}})
	if err != nil {
		t.Fatal(err)
	}
	// The pod's process, started in its sandbox like a container.
	cmd := exec.Command("/bin/busybox", "sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := (sandbox{netns: nsPath, hostname: "crashed-pod"}).start(cmd); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	if err := os.MkdirAll(filepath.Join(stateDir, podsDir, "pod-uid-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writePidFile(filepath.Join(stateDir, podsDir, "pod-uid-1", "main.pid"), cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	veths := bridgeVeths(t, opts.Bridge)
	if len(veths) != 1 {
		t.Fatalf("veths on the bridge after CNI ADD: %v, want one", veths)
	}
	if ipamEntries(t, stateDir) == 0 {
		t.Fatalf("no IPAM reservation for %s after CNI ADD", ip)
	}

	if err := Cleanup(stateDir); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Error("the crashed pod's process still runs after Cleanup")
	}
	if _, err := netlink.LinkByName(opts.Bridge); err == nil {
		t.Errorf("bridge %s still exists", opts.Bridge)
	}
	for _, v := range veths {
		if _, err := netlink.LinkByName(v); err == nil {
			t.Errorf("veth %s still exists", v)
		}
	}
	if _, err := os.Stat(nsPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns %s still exists (%v)", nsPath, err)
	}
	if ipamEntries(t, stateDir) != 0 {
		t.Error("IPAM reservations left")
	}
	if got, _ := os.ReadFile(ipForwardPath); string(got) != string(origForward) {
		t.Errorf("ip_forward = %q after Cleanup, want the recorded %q", got, origForward)
	}
	// A second Cleanup finds nothing to do.
	if err := Cleanup(stateDir); err != nil {
		t.Errorf("second Cleanup: %v", err)
	}
}

func bridgeVeths(t *testing.T, bridge string) []string {
	t.Helper()
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		t.Fatal(err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

func ipamEntries(t *testing.T, stateDir string) int {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(stateDir, ipamDir, "*", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(files)
}
