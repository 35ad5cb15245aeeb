package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/nodeagent"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/handler/vmisync"
	"github.com/qvirt/qvirt/local/provider"
	"github.com/qvirt/qvirt/test/testutil"
)

// TestPostCopyMigration: with the nodes' vm.unprivileged_userfaultfd at 1 (the test sets it and
// puts back what it was), the node agents label their nodes for post-copy, and a policy that
// allows it moves a guest that dirties memory faster than the policy's 4 MiB/s: still in pre-copy
// at its 1 s completion timeout, the migration switches to post-copy (the mode QEMU reported,
// in status.migrationState.mode) and succeeds, and the guest counts on on the target.
//
// In post-copy the source node's agent is killed (SIGKILL): the migration stream runs through it,
// so the link breaks with the guest's memory split between the nodes. Both QEMUs pause; the
// target's agent has its launcher listen again, the restarted source agent resumes the migration
// there, and it completes with the guest unharmed. Not parallel: the agent's restart would
// disturb other tests' guests on that node.
func TestPostCopyMigration(t *testing.T) {
	ctx := context.Background()
	old, err := os.ReadFile(nodeagent.UserfaultfdSysctl)
	if err != nil {
		t.Fatalf("read %s: %v", nodeagent.UserfaultfdSysctl, err)
	}
	if err := os.WriteFile(nodeagent.UserfaultfdSysctl, []byte("1\n"), 0o644); err != nil {
		t.Fatalf("set %s: %v", nodeagent.UserfaultfdSysctl, err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(nodeagent.UserfaultfdSysctl, old, 0o644); err != nil {
			t.Errorf("put %s back to %q: %v", nodeagent.UserfaultfdSysctl, strings.TrimSpace(string(old)), err)
		}
	})
	// The agents read the sysctl at every heartbeat (30 s).
	testutil.Eventually(t, 75*time.Second, "every node labelled "+v1alpha1.NodePostCopyLabel+"=true", func() bool {
		var nodes corev1.NodeList
		if err := cl.List(ctx, &nodes); err != nil || len(nodes.Items) == 0 {
			return false
		}
		for _, n := range nodes.Items {
			if n.Labels[v1alpha1.NodePostCopyLabel] != "true" {
				return false
			}
		}
		return true
	})

	ns := namespace(t)
	const name = "postcopy"
	policy, vm := policyVM(t, ns, name, v1alpha1.MigrationPolicySpec{
		AllowPostCopy:           ptr.To(true),
		CompletionTimeoutPerGiB: ptr.To[int64](1),
		BandwidthPerMigration:   ptr.To(resource.MustParse("4Mi")),
	})
	vmi, src := bootVM(t, vm)
	// 8 MiB of fresh random bytes every second or so: twice what the link carries.
	src.Run(t, "(while :; do dd if=/dev/urandom of=/dev/shm/dirty bs=1M count=8 2>/dev/null; sleep 1; done) & echo DIRTY-$((3+4))", "DIRTY-7", 30*time.Second)

	waitVMI(t, ns, name, 30*time.Second, "LiveMigratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && meta.IsStatusConditionTrue(v.Status.Conditions, v1alpha1.VirtualMachineInstanceIsMigratable)
	})
	migrated := make(chan string, 1)
	go func() {
		out, errOut, code := qvirtctl(t, "migrate", name, "-n", ns, "--wait", "--timeout", "6m")
		if code != 0 {
			migrated <- fmt.Sprintf("exit %d\n%s%s", code, out, errOut)
		}
		close(migrated)
	}()
	inPostCopy := waitVMI(t, ns, name, 3*time.Minute, "the migration in post-copy", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v != nil && v.Status.MigrationState != nil && v.Status.MigrationState.Mode == v1alpha1.MigrationPostCopy
	})
	// The target's console, from its pod's socket directory on the target node: the guest runs
	// there from the switch, before the instance moves there.
	ms := inPostCopy.Status.MigrationState
	var target corev1.Pod
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: ms.TargetPod}, &target); err != nil {
		t.Fatal(err)
	}
	dst := testutil.AttachConsole(t, podsockets.Dir(provider.PodsDir(filepath.Join(dir, "nodes", ms.TargetNode)), target.UID, vmi.UID).Serial())
	last := src.LastTick()
	// Not before the guest runs on the target: until then the target QEMU loads the devices'
	// state, and QEMU 7.2 cannot pause a migration whose link breaks there.
	testutil.Eventually(t, time.Minute, "the counter to go on on the target", func() bool { return dst.LastTick() > last+1 }, func() string {
		return fmt.Sprintf("source console:\n%s\ntarget console:\n%s", src.Text(), dst.Text())
	})
	killComponent(t, "qvirt-handler-"+vmi.Status.NodeName)
	if failure, failed := <-migrated; failed {
		t.Fatalf("qvirtctl migrate --wait with the source's agent killed in post-copy: %s", failure)
	}
	moved := waitVMI(t, ns, name, 30*time.Second, "Running on the other node", func(v *v1alpha1.VirtualMachineInstance) bool {
		return running("")(v) && v.UID == vmi.UID && v.Status.NodeName != vmi.Status.NodeName
	})
	// The guest counted on through the recovery, and after it: there was no boot.
	last = dst.LastTick()
	testutil.Eventually(t, time.Minute, "the counter to go on after the migration", func() bool { return dst.LastTick() > last+1 }, func() string {
		return fmt.Sprintf("target console:\n%s", dst.Text())
	})
	if strings.Contains(dst.Text(), "QVIRT-GUEST-READY") {
		t.Error("the guest booted again on the target")
	}
	ms = moved.Status.MigrationState
	if ms == nil || ms.Mode != v1alpha1.MigrationPostCopy || ms.MigrationConfiguration == nil || !ms.MigrationConfiguration.PostCopy() {
		t.Fatalf("migration state %+v: want a post-copy migration under policy %s", ms, policy.Name)
	}
	t.Logf("post-copy migration: total %d ms, downtime %d ms", ptr.Deref(ms.TotalTimeMilliseconds, 0), ptr.Deref(ms.DowntimeMilliseconds, 0))
	// The Events say the link broke and was mended (recorded asynchronously).
	for _, reason := range []string{vmisync.EventMigrationRecovering, vmisync.EventMigrationResumed} {
		testutil.Eventually(t, 10*time.Second, "a "+reason+" Event on the instance", func() bool {
			var evs corev1.EventList
			if err := cl.List(ctx, &evs, client.InNamespace(ns)); err != nil {
				return false
			}
			for _, e := range evs.Items {
				if e.InvolvedObject.UID == vmi.UID && e.Reason == reason {
					return true
				}
			}
			return false
		})
	}
	var got v1alpha1.VirtualMachineInstanceMigrationList
	if err := cl.List(ctx, &got, client.InNamespace(ns)); err != nil || len(got.Items) != 1 || got.Items[0].Status.Phase != v1alpha1.MigrationSucceeded {
		t.Fatalf("migrations in %s: %+v, %v; want one that succeeded", ns, got.Items, err)
	}
}
