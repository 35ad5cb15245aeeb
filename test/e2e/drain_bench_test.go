package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// drainBenchVMIs is how many idle instances BenchmarkDrain drains off a node.
const drainBenchVMIs = 5

// BenchmarkDrain reports the wall time of `kubectl drain` (as a user runs it: launcher pods only,
// kubectl's own retries of refused evictions) of a node running 5 idle instances with
// evictionStrategy LiveMigrate: drain-s, from the command's start to its end, when all five have
// live-migrated to the other node and their source pods are gone. The instances are
// BenchmarkStartup's tiny halted guests (64 MiB): the figure is qvirt's path (webhook, evacuation
// controller, migration within the parallel limits: 2 outbound per node by default, kubectl's 5 s
// retry), not the copying of guest memory under emulation. One iteration is the whole procedure.
func BenchmarkDrain(b *testing.B) {
	for range b.N {
		benchDrain(b)
	}
}

func benchDrain(b *testing.B) {
	ctx := context.Background()
	image, err := pushTinyGuest(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-drain-"}}
	if err := cl.Create(ctx, ns); err != nil {
		b.Fatal(err)
	}
	defer deleteBenchNamespace(b, ns)
	source, other := "qvirt-node-1", "qvirt-node-2"
	cordon(b, other)
	for i := range drainBenchVMIs {
		vmi := benchVMI(ns.Name, fmt.Sprintf("d%d", i), image)
		vmi.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
		if err := cl.Create(ctx, vmi); err != nil {
			b.Fatalf("create VMI %d: %v", i, err)
		}
	}
	waitVMIs(b, ns.Name, 5*time.Minute, "Running and LiveMigratable on "+source, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && v.Status.NodeName == source &&
			meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	})
	uncordon(b, other)

	b.ResetTimer()
	started := time.Now()
	drain(b, source, 10*time.Minute)
	took := time.Since(started)
	b.StopTimer()
	waitVMIs(b, ns.Name, time.Minute, "Running on "+other, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.Running && v.Status.NodeName == other
	})
	uncordon(b, source)
	b.ReportMetric(took.Seconds(), "drain-s")
	b.ReportMetric(0, "ns/op") // the procedure is not a per-op cost
}

// waitVMIs waits until all of the namespace's drainBenchVMIs instances satisfy ok.
func waitVMIs(b *testing.B, ns string, d time.Duration, what string, ok func(*v1alpha1.VirtualMachineInstance) bool) {
	b.Helper()
	deadline := time.Now().Add(d)
	for {
		var list v1alpha1.VirtualMachineInstanceList
		n := 0
		if err := cl.List(context.Background(), &list, client.InNamespace(ns)); err == nil {
			for i := range list.Items {
				if ok(&list.Items[i]) {
					n++
				}
			}
		}
		if n == drainBenchVMIs {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d VMIs %s after %s", n, drainBenchVMIs, what, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
