package launcher_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestGuestDownwardMetrics: with KubeVirt's downwardMetrics device, the guest finds the port
// org.github.vhostmd.1 and reads vhostmd's metrics document from it as KubeVirt's user guide does
// (printf "GET /metrics/XML\n\n" to the port, then read it): its node's name and its own memory.
// Junk first does not stop the server from answering.
func TestGuestDownwardMetrics(t *testing.T) {
	t.Parallel()
	vmi := guestVMI(t)
	vmi.Spec.Domain.Devices.DownwardMetrics = &v1alpha1.DownwardMetrics{}
	req := testutil.SyncRequest(t, vmi, nil)
	req.Machine.DownwardMetrics.NodeName = "node-a"
	_, c := bootGuest(t, req)
	from := len(c.Text())
	c.Send(t, `for d in /sys/class/virtio-ports/*; do [ "$(cat $d/name)" = org.github.vhostmd.1 ] && p=/dev/${d##*/}; done; exec 3<>$p; `+
		`head -c 1000 /dev/zero | tr '\0' x >&3; printf '\n\nGET /metrics/XML\n\n' >&3; `+
		`while read -r l <&3; do echo "M:$l"; case $l in *'</metrics>'*) break;; esac; done; echo "METRICS-$((40+2))"`)
	c.Expect(t, from, "METRICS-42", time.Minute)
	text := c.Text()[from:]
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`M:<metric type="string" context="host">\s*`),
		regexp.MustCompile(`M:<name>HostName</name>\s+M:<value>node-a</value>`),
		regexp.MustCompile(`M:<name>ResourceMemoryLimit</name>\s+M:<value>` + strconv.FormatInt(req.Machine.MemoryMiB, 10) + `</value>`),
		regexp.MustCompile(`M:<name>FreePhysicalMemory</name>\s+M:<value>[1-9][0-9]*</value>`),
	} {
		if !want.MatchString(text) {
			t.Errorf("the metrics the guest read do not match %s; console ends with %q", want, testutil.Tail(text, 3000))
		}
	}
	if strings.Count(text, "M:</metrics>") != 1 {
		t.Errorf("the guest read %d documents, want 1: %q", strings.Count(text, "M:</metrics>"), testutil.Tail(text, 3000))
	}
}
