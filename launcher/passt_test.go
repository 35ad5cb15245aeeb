package launcher_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/podlayout"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/podnet"
)

// passtLauncher is a launcher whose passt runs in a pod-like network namespace (eth0 with the pod's
// address, a default route to the host), as the launcher's passt runs in its pod's, with the
// sysctls the launcher pod of a passt instance sets (controllers/vmi). The launcher itself runs
// in this process.
func passtLauncher(t *testing.T) (*vm, *podnet.NS) {
	t.Helper()
	pod := podnet.New(t)
	for name, value := range map[string]string{"ip_unprivileged_port_start": "0", "ping_group_range": "107 107"} {
		run(t, "ip", "netns", "exec", pod.Name, "sh", "-c", fmt.Sprintf("echo %s > /proc/sys/net/ipv4/%s", value, name))
	}
	wrapper := filepath.Join(t.TempDir(), "passt")
	// passt runs as the launcher's user, as in its pod, in the run directory that user owns.
	script := fmt.Sprintf("#!/bin/sh\nexec nsenter --net=%s setpriv --reuid=%d --regid=%d --clear-groups %s \"$@\"\n",
		pod.Path, podlayout.LauncherUID, podlayout.LauncherUID, launcher.DefaultPasst)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v := newLauncherOpts(t, launcher.HostResolver{SpareRootPorts: 2}, launcher.Options{Passt: wrapper})
	if err := os.Chown(v.runDir, podlayout.LauncherUID, podlayout.LauncherUID); err != nil {
		t.Fatal(err)
	}
	return v, pod
}

// passtNIC is the test guest's eth0 on passt, forwarding tcpPorts (all ports when none).
func passtNIC(tcpPorts ...int32) machine.NIC {
	return machine.NIC{Name: "default", MAC: "02:00:00:5a:55:01", Model: machine.NICVirtio,
		Passt: &machine.Passt{Interface: "eth0", TCPPorts: tcpPorts}}
}

// TestPasstBinding boots the test guest on passt: the guest's DHCP gets the pod's own address,
// the pod's port 80 (below 1024: the pod's sysctl lets passt bind it) reaches the guest's httpd,
// the guest reaches the pod's network, and passt ends with QEMU.
func TestPasstBinding(t *testing.T) {
	v, pod := passtLauncher(t)
	ctx := context.Background()
	req := guestSpec(t)
	req.Machine.NICs = []machine.NIC{passtNIC(80)}
	if st, err := v.client.Sync(ctx, req); err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Expect(t, 0, "QVIRT-IP eth0 "+pod.PodIP.String(), time.Minute)

	// Inbound: the listed port.
	url := "http://" + pod.PodIP.String() + ":80/"
	var body string
	waitFor(t, time.Minute, "GET "+url+" from the host reaches the guest's httpd", func() bool {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = strings.TrimSpace(string(b))
		return resp.StatusCode == http.StatusOK && body != ""
	})
	from := len(c.Text())
	c.Send(t, "echo HOSTNAME-$(hostname)")
	c.Expect(t, from, "HOSTNAME-"+body, time.Minute)

	// Outbound: the guest reaches a server on the pod's network through passt. Not at the
	// gateway's address, which passt maps to the pod's own loopback (as under KubeVirt).
	from = len(c.Text())
	c.Send(t, "wget -q -O - http://"+serveOnPodNetwork(t, pod)+"/")
	// passt connects from the pod's own address: the host sees the pod, as with any pod.
	c.Expect(t, from, "FROM-HOST-"+pod.PodIP.String(), time.Minute)

	// A passt that ends on its own (even cleanly, on SIGTERM) leaves the guest without its
	// network: the launcher ends the guest, saying why.
	if err := syscall.Kill(passtPID(t, v), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var st protocol.Status
	waitFor(t, 30*time.Second, "QEMU to end with passt", func() bool {
		st, _ = v.client.Status(ctx)
		return st.Exit != nil
	})
	if !strings.Contains(st.Exit.Detail, `passt of interface "default" ended`) {
		t.Errorf("the guest's end %q does not say passt ended", st.Exit.String())
	}
}

// serveOnPodNetwork serves HTTP at an address of pod's network beside the host's end, answering
// FROM-HOST-<the client's address>, and returns the address (host:port).
func serveOnPodNetwork(t *testing.T, pod *podnet.NS) string {
	t.Helper()
	peer := pod.HostIP.Next().Next()
	run(t, "ip", "addr", "add", peer.String()+"/32", "dev", pod.HostVeth)
	ln, err := net.Listen("tcp", peer.String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "FROM-HOST-%s\n", strings.Split(r.RemoteAddr, ":")[0])
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// A passt that cannot start (the port it must forward is taken in the pod) fails the start with
// passt's own words, before QEMU runs.
func TestPasstFailureFailsTheStart(t *testing.T) {
	v, pod := passtLauncher(t)
	// Something in the pod already listens on the port the interface forwards.
	taker := exec.Command("nsenter", "--net="+pod.Path, "busybox", "nc", "-l", "-p", "8088")
	taker.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := taker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = taker.Process.Kill(); _ = taker.Wait() })
	waitFor(t, 10*time.Second, "port 8088 taken in the pod", func() bool {
		out, _ := exec.Command("ip", "netns", "exec", pod.Name, "ss", "-Hltn", "sport = :8088").Output()
		return strings.Contains(string(out), "8088")
	})
	req := guestSpec(t)
	req.Machine.NICs = []machine.NIC{passtNIC(8088)}
	_, err := v.client.Sync(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "passt") || !strings.Contains(err.Error(), "8088") {
		t.Fatalf("sync with passt unable to bind 8088: %v, want an error from passt naming the port", err)
	}
	if st, err := v.client.Status(context.Background()); err != nil || st.PID != 0 {
		t.Fatalf("status %+v, %v: QEMU must not have started", st, err)
	}
}

// passtPID is the PID of the launcher's passt of NIC 0, from its PID file.
func passtPID(t *testing.T, v *vm) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(v.runDir, "passt0.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Sscan(string(data), &pid); err != nil || pid <= 0 {
		t.Fatalf("passt PID file %q: %v", data, err)
	}
	return pid
}

// An interface that lists no ports forwards them all, as KubeVirt's passt binding does: passt then
// takes a socket per port and protocol. Where the open-file limit is too low for that (this
// machine's is 20000; a container runtime's is usually 1048576), the start fails saying so and
// what to do; where it allows it, the guest gets its address and QEMU runs.
func TestPasstAllPorts(t *testing.T) {
	v, pod := passtLauncher(t)
	req := guestSpec(t)
	req.Machine.NICs = []machine.NIC{passtNIC()}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	st, err := v.client.Sync(context.Background(), req)
	if lim.Max < launcher.PasstAllPortsFiles {
		if err == nil || !strings.Contains(err.Error(), "lists no ports") || !strings.Contains(err.Error(), fmt.Sprint(lim.Max)) {
			t.Fatalf("sync forwarding all ports under an open-file limit of %d: %v, want the reason and the remedy", lim.Max, err)
		}
		return
	}
	if err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-IP eth0 "+pod.PodIP.String(), bootTimeout)
}
