package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/vmi"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/local/cluster"
)

// reportOverhead checks the pod's memory overhead formula against what the running instances
// use beyond guest RAM: per pod, QEMU's resident memory outside the guest RAM mapping plus the
// launcher's (overhead-used-max-MiB, the largest), beside what the formula gives the same spec
// with the cluster's configuration (overhead-formula-MiB). This machine runs TCG; the figure
// under KVM lacks the translation cache.
func reportOverhead(ctx context.Context, b *testing.B, spec *v1alpha1.VirtualMachineInstanceSpec) {
	var cm corev1.ConfigMap
	if err := cl.Get(ctx, client.ObjectKey{Namespace: cluster.Namespace, Name: config.ConfigMapName}, &cm); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Parse(cm.Data)
	if err != nil {
		b.Fatal(err)
	}
	formula, err := vmi.MemoryOverhead(&spec.Domain, cfg)
	if err != nil {
		b.Fatal(err)
	}
	guestBytes := v1alpha1.GuestMemoryMiB(&spec.Domain) << 20
	launchers, qemus := clusterProcesses()
	var launcherMax, qemuMax float64
	for _, pid := range launchers {
		launcherMax = max(launcherMax, rssMiB(pid))
	}
	for _, pid := range qemus {
		rss, guest, err := qemuResident(pid, guestBytes)
		if err != nil {
			b.Logf("QEMU %d: %v", pid, err)
			continue
		}
		qemuMax = max(qemuMax, float64(rss-guest)/(1<<20))
	}
	b.ReportMetric(qemuMax, "qemu-beyond-guest-max-MiB")
	b.ReportMetric(qemuMax+launcherMax, "overhead-used-max-MiB")
	b.ReportMetric(float64(formula.Value())/(1<<20), "overhead-formula-MiB")
}

// qemuResident is a QEMU's resident bytes in all and in its guest RAM: the mapping of exactly the
// guest's size with the most resident (the RAM backend, a memfd or anonymous).
func qemuResident(pid int, guestBytes int64) (all, guest int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	var size int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if start, end, ok := mappingRange(line); ok {
			size = end - start
			continue
		}
		if !strings.HasPrefix(line, "Rss:") {
			continue
		}
		kb, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("smaps line %q: %w", line, err)
		}
		all += kb << 10
		if size == guestBytes {
			guest = max(guest, kb<<10)
		}
	}
	return all, guest, sc.Err()
}

// mappingRange parses the start-end address range that begins an smaps mapping's header line.
func mappingRange(line string) (start, end int64, ok bool) {
	field, _, _ := strings.Cut(line, " ")
	lo, hi, found := strings.Cut(field, "-")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.ParseUint(lo, 16, 64)
	e, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return int64(s), int64(e), true
}
