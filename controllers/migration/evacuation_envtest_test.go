package migration

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
)

// startEvacuation runs the evacuation reconciler on a manager of its own, with a clock skew the
// test moves forward.
func (e *testEnv) startEvacuation(skew *atomic.Int64) {
	t := e.t
	t.Helper()
	opts := cp.ManagerOptions()
	opts.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{e.ns: {}}}
	opts.Controller.SkipNameValidation = ptr.To(true)
	mgr, err := ctrl.NewManager(cp.Config, opts)
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(e.ctx, &v1alpha1.VirtualMachineInstanceMigration{}, VMINameField, func(o client.Object) []string {
		return []string{o.(*v1alpha1.VirtualMachineInstanceMigration).Spec.VMIName}
	}); err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 the reconcilers record with the core/v1 Events API (see controllers.recorder)
	recorder := mgr.GetEventRecorderFor("qvirt-evacuation")
	r := &EvacuationReconciler{Client: mgr.GetClient(), Config: e.store, Recorder: recorder,
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// evacuations are the instance's migrations that the evacuation reconciler created.
func (e *testEnv) evacuations(vmi string) []v1alpha1.VirtualMachineInstanceMigration {
	var list v1alpha1.VirtualMachineInstanceMigrationList
	if err := cp.Client.List(e.ctx, &list, client.InNamespace(e.ns)); err != nil {
		e.t.Fatal(err)
	}
	var out []v1alpha1.VirtualMachineInstanceMigration
	for _, m := range list.Items {
		if m.Spec.VMIName == vmi && m.Annotations[v1alpha1.EvacuationMigrationAnnotation] != "" {
			out = append(out, m)
		}
	}
	return out
}

func (e *testEnv) waitEvacuations(vmi string, n int) *v1alpha1.VirtualMachineInstanceMigration {
	e.t.Helper()
	var got []v1alpha1.VirtualMachineInstanceMigration
	e.eventually(fmt.Sprintf("%d evacuation migrations of %s", n, vmi), func() (bool, string) {
		got = e.evacuations(vmi)
		return len(got) == n, fmt.Sprintf("%d", len(got))
	})
	newest := &got[0]
	for i := range got {
		if got[i].CreationTimestamp.After(newest.CreationTimestamp.Time) || (got[i].CreationTimestamp.Equal(&newest.CreationTimestamp) && got[i].Name > newest.Name) {
			newest = &got[i]
		}
	}
	return newest
}

// waitEvent waits for an Event on the instance with reason whose message contains want.
func (e *testEnv) waitEvent(vmi, reason, want string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("event %s on %s saying %q", reason, vmi, want), func() (bool, string) {
		var list corev1.EventList
		if err := cp.Client.List(e.ctx, &list, client.InNamespace(e.ns)); err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name == vmi && ev.Reason == reason {
				if strings.Contains(ev.Message, want) {
					return true, ""
				}
				seen = append(seen, ev.Message)
			}
		}
		return false, strings.Join(seen, " | ")
	})
}

// TestEvacuation: an instance marked for evacuation (as the eviction webhook marks it) gets an
// annotated migration that moves it, and the mark goes once it has left; a failed evacuation
// migration is retried only after the backoff, with an Event naming the failures and the last
// reason; an External instance is left to its outside controller.
func TestEvacuation(t *testing.T) {
	e := setup(t, func(c *config.Config) { c.EvictionStrategy = v1alpha1.EvictionStrategyLiveMigrate })
	var skew atomic.Int64
	e.startEvacuation(&skew)

	vmi, _ := e.runningVMI("mover", "node-a", false)
	e.updateVMIStatus(vmi, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.EvacuationNodeName = "node-a" })
	m := e.waitEvacuations("mover", 1)
	if m.Annotations[v1alpha1.EvacuationMigrationAnnotation] != "node-a" || !strings.HasPrefix(m.Name, "mover-evacuation-") {
		t.Fatalf("evacuation migration %s annotations %v", m.Name, m.Annotations)
	}
	e.waitEvent("mover", ReasonEvacuationStarted, "node node-a is being drained: created migration "+m.Name)
	e.driveToRunning(m, vmi, "node-b")
	e.agent(vmi, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) {
		ms.Completed, ms.EndTimestamp = true, ptr.To(metav1.Now())
	})
	e.waitPhase(m, v1alpha1.MigrationSucceeded)
	if after := e.getVMI(vmi); after.Status.NodeName != "node-b" || after.Status.EvacuationNodeName != "" {
		t.Fatalf("after the evacuation: node %q evacuationNodeName %q", after.Status.NodeName, after.Status.EvacuationNodeName)
	}

	stuck, _ := e.runningVMI("stuck", "node-a", false)
	e.updateVMIStatus(stuck, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.EvacuationNodeName = "node-a" })
	for attempt := 1; attempt <= 2; attempt++ {
		m := e.waitEvacuations("stuck", attempt)
		tp := e.waitTargetPod(m)
		e.runPod(tp, "node-b")
		e.waitPhase(m, v1alpha1.MigrationPreparingTarget)
		e.setPodPhase(tp, corev1.PodFailed)
		e.assertFailed(m, ReasonTargetPodFailed)
		e.waitEvent("stuck", ReasonEvacuationBackoff, fmt.Sprintf("%d migration(s) off node node-a failed before, the last: %s (TargetPodFailed", attempt, m.Name))
		time.Sleep(2 * time.Second)
		if n := len(e.evacuations("stuck")); n != attempt {
			t.Fatalf("attempt %d: %d evacuation migrations during the backoff", attempt, n)
		}
		// Past the backoff (20 s, then 40 s): a poke (any change of the instance) lets it retry.
		skew.Add(int64(EvacuationFirstBackoff) << (attempt - 1))
		e.updateVMIStatus(stuck, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.Reason = fmt.Sprintf("poke-%d", attempt) })
	}
	e.waitEvacuations("stuck", 3)

	// External (here the cluster's default): marked, but no migration; an outside controller acts.
	cfg := config.Default()
	cfg.EvictionStrategy = v1alpha1.EvictionStrategyExternal
	e.store.Set(cfg)
	ext, _ := e.runningVMI("external", "node-a", false)
	e.updateVMIStatus(ext, func(s *v1alpha1.VirtualMachineInstanceStatus) { s.EvacuationNodeName = "node-a" })
	time.Sleep(2 * time.Second)
	if n := len(e.evacuations("external")); n != 0 {
		t.Fatalf("%d evacuation migrations of an External instance", n)
	}
}
