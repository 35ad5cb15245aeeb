package launcher_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/launcher"
	"github.com/qvirt/qvirt/launcher/protocol"
	"github.com/qvirt/qvirt/machine"
	"github.com/qvirt/qvirt/test/podnet"
)

// TestSlirpBinding boots the test guest with KubeVirt's slirp binding: QEMU, in a pod-like network
// namespace as in its pod, runs the guest's network itself. The guest's DHCP gets 10.0.2.15, the
// pod's port 80 reaches the guest's httpd, a port the interface does not list does not, and the
// guest reaches the pod's network from the pod's own address.
func TestSlirpBinding(t *testing.T) {
	t.Parallel()
	pod := podnet.New(t)
	// QEMU runs in the pod's network namespace, as the launcher's QEMU runs in its pod's.
	wrapper := filepath.Join(t.TempDir(), "qemu")
	script := fmt.Sprintf("#!/bin/sh\nexec nsenter --net=%s qemu-system-x86_64 \"$@\"\n", pod.Path)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v := newLauncherOpts(t, launcher.HostResolver{SpareRootPorts: 2}, launcher.Options{QEMU: wrapper})
	ctx := context.Background()
	req := guestSpec(t)
	req.Machine.NICs = []machine.NIC{{Name: "default", MAC: "02:00:00:51:1e:01", Model: machine.NICVirtio,
		Slirp: &machine.Slirp{TCPPorts: []int32{80}}}}
	if st, err := v.client.Sync(ctx, req); err != nil || st.Phase != protocol.PhaseRunning {
		t.Fatalf("sync: %v (phase %s)", err, st.Phase)
	}
	c := attach(t, v.runDir)
	c.Expect(t, 0, "QVIRT-GUEST-READY", bootTimeout)
	c.Expect(t, 0, "QVIRT-IP eth0 10.0.2.15", time.Minute)

	// Inbound: the listed port, at the pod's address.
	get := func(url string) (string, error) {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s: %s", url, resp.Status)
		}
		return strings.TrimSpace(string(b)), err
	}
	url := "http://" + pod.PodIP.String() + ":80/"
	var body string
	waitFor(t, time.Minute, "GET "+url+" from the host reaches the guest's httpd", func() bool {
		b, err := get(url)
		body = b
		return err == nil && b != ""
	})
	from := len(c.Text())
	c.Send(t, "echo HOSTNAME-$(hostname)")
	c.Expect(t, from, "HOSTNAME-"+body, time.Minute)
	// A port the interface does not list reaches nothing: the guest serves 8080 too (it answers
	// itself there), and QEMU forwards only port 80.
	from = len(c.Text())
	c.Send(t, `httpd -p 8080 -h /www && wget -q -O - http://127.0.0.1:8080/ | sed 's/^/ON-8080-/'`)
	c.Expect(t, from, "ON-8080-"+body, time.Minute)
	if b, err := get("http://" + pod.PodIP.String() + ":8080/"); err == nil {
		t.Errorf("port 8080, which the interface does not list, reached the guest: %q", b)
	}

	// Outbound: the guest reaches a server on the pod's network, which sees the pod's address.
	from = len(c.Text())
	c.Send(t, "wget -q -O - http://"+serveOnPodNetwork(t, pod)+"/")
	c.Expect(t, from, "FROM-HOST-"+pod.PodIP.String(), time.Minute)
}
