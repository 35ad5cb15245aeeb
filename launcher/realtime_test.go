package launcher_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/translate"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestNUMAUnprivilegedLauncher runs KubeVirt's real-time guest (dedicated CPUs, the guest NUMA
// mapping, huge pages, real-time vCPU 0 of two) with the launcher as an unprivileged user holding
// no capability, as in its pod: it starts (no mbind is needed on a host whose CPUs are on one NUMA
// node), the guest finds both vCPUs on the one NUMA node QEMU describes (its ACPI SRAT table), and
// the vCPU threads are left as they were for the node agent to make real-time (handler's
// TestRealtimeVCPUs).
func TestNUMAUnprivilegedLauncher(t *testing.T) {
	t.Parallel()
	u := newUnprivileged(t)
	vmi := u.vmi(t)
	vmi.Spec.Domain.CPU = &v1alpha1.CPU{Sockets: 2, Cores: 1, Threads: 1, DedicatedCPUPlacement: true,
		NUMA: &v1alpha1.NUMA{GuestMappingPassthrough: &v1alpha1.NUMAGuestMappingPassthrough{}}, Realtime: &v1alpha1.Realtime{Mask: "0"}}
	vmi.Spec.Domain.Memory.Hugepages = &v1alpha1.Hugepages{PageSize: "2Mi"}
	testutil.ReserveHugepages(t, int(v1alpha1.GuestMemoryMiB(&vmi.Spec.Domain)/2))
	m, err := translate.Machine(vmi, translate.Host{Emulation: true})
	if err != nil {
		t.Fatal(err)
	}
	r := u.run(t, m)
	r.waitReady(t)
	qemu := childQEMU(t, r.cmd.Process.Pid)
	if cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", qemu)); !strings.Contains(string(cmdline), ",pmu=off") {
		t.Errorf("QEMU's command line has no pmu=off for the real-time guest: %q", cmdline)
	}
	// E""ND: the echoed command line does not match what the guest prints.
	_, _ = r.stdin.Write([]byte(`echo NUMA-$(dmesg | grep -c 'SRAT: PXM 0 -> APIC 0x0[01] -> Node 0')-$(ls -d /sys/devices/system/node/node* | wc -l)-E""ND` + "\n"))
	answer := regexp.MustCompile(`NUMA-\d+-\d+-END`)
	waitFor(t, time.Minute, "the guest's NUMA nodes", func() bool { return answer.MatchString(r.stdout.String()) })
	if got := answer.FindString(r.stdout.String()); got != "NUMA-2-1-END" {
		t.Errorf("the guest's SRAT entries and NUMA nodes: %s, want both vCPUs on node 0, one node (NUMA-2-1-END)", got)
	}
}

// childQEMU is the QEMU the launcher process pid started.
func childQEMU(t *testing.T, pid int) int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		_, after, _ := strings.Cut(string(data), ") ")
		if fields := strings.Fields(after); len(fields) > 1 && fields[1] == strconv.Itoa(pid) && strings.Contains(string(data), "(qemu-system") {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			return child
		}
	}
	t.Fatalf("launcher %d has no QEMU child", pid)
	return 0
}
