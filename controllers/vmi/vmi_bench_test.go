package vmi

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/test/testutil"
)

// BenchmarkCreate2000VMIs measures the VMI reconciler at scale against a real API server: the time
// from the first of 2000 instances being created until every one has its launcher pod, and the
// controller's heap per instance (its cache then holds every instance and every pod). It runs once
// whatever b.N is; run it with -benchtime=1x. Budgets: at most 50 KB per instance (KubeVirt's
// controller takes about 173 KB) and well above 530 instances per minute.
func BenchmarkCreate2000VMIs(b *testing.B) {
	const total = 2000
	ctx := context.Background()
	ns := newNamespace(b)

	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	creator, err := client.New(cfg, client.Options{Scheme: cp.Scheme})
	if err != nil {
		b.Fatal(err)
	}

	stop := startManager(b, ns, emulationConfig(), cfg)
	// Let the manager's informers start before the baseline, so it counts only per-instance memory.
	time.Sleep(2 * time.Second)
	before := testutil.LiveHeap()

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, total)
	const creators = 16
	for w := range creators {
		wg.Go(func() {
			for i := w; i < total; i += creators {
				if err := creator.Create(ctx, newVMI(ns, fmt.Sprintf("vm-%04d", i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	created := time.Since(start)
	close(errs)
	for err := range errs {
		b.Fatalf("create vmi: %v", err)
	}

	// Every instance has a launcher pod: count distinct VMI UID labels on the pods (metadata only).
	deadline := time.Now().Add(10 * time.Minute)
	var have int
	for {
		var pods metav1.PartialObjectMetadataList
		pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := creator.List(ctx, &pods, client.InNamespace(ns)); err != nil {
			b.Fatal(err)
		}
		uids := map[string]bool{}
		for _, p := range pods.Items {
			uids[p.Labels[v1alpha1.VMIUIDLabel]] = true
		}
		have = len(uids)
		if have >= total {
			if len(pods.Items) != total {
				b.Errorf("%d pods for %d instances", len(pods.Items), total)
			}
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d of %d instances have a pod after %s", have, total, time.Since(start))
		}
		time.Sleep(200 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()

	// Let the reconciler settle (status patches, the pods' events reaching the cache) before
	// measuring what it holds.
	time.Sleep(3 * time.Second)
	after := testutil.LiveHeap()
	stop()

	kbPerVMI := float64(int64(after)-int64(before)) / 1024 / total
	perMinute := total / elapsed.Minutes()
	b.ReportMetric(kbPerVMI, "KB/vmi")
	b.ReportMetric(perMinute, "vmis/min")
	b.ReportMetric(elapsed.Seconds(), "s/2000vmis")
	b.Logf("created %d instances in %s; all had launcher pods after %s (%.0f/min); controller heap %d -> %d bytes (%.1f KB/vmi)",
		total, created.Round(time.Millisecond), elapsed.Round(time.Millisecond), perMinute, before, after, kbPerVMI)
}
