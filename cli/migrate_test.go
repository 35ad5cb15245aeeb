package cli

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// migrationScript plays the controller and the handlers: it moves the VMIM through its phases and
// reports progress in the VMI's status.migrationState, as the real ones do.
func migrationScript(f *fakeAPI, fail bool) (func(*qv1.VirtualMachineInstanceMigration), chan error) {
	errs := make(chan error, 1)
	return func(vmim *qv1.VirtualMachineInstanceMigration) {
		// Progress drawn before qvirtctl watches would never be seen.
		if err := f.waitWatching("virtualmachineinstances", "virtualmachineinstancemigrations"); err != nil {
			errs <- err
			return
		}
		errs <- playMigration(vmim, fail)
	}, errs
}

func playMigration(vmim *qv1.VirtualMachineInstanceMigration, fail bool) error {
	ctx := context.Background()
	total := int64(256 << 20)
	start := metav1.Now()
	if err := updateVMIM(ctx, vmim, func(m *qv1.VirtualMachineInstanceMigration) { m.Status.Phase = qv1.MigrationRunning }); err != nil {
		return err
	}
	for done := int64(0); done <= total; done += 64 << 20 {
		processed, remaining := done, total-done
		err := updateVMI(ctx, vmim.Namespace, vmim.Spec.VMIName, func(v *qv1.VirtualMachineInstance) {
			v.Status.MigrationState = &qv1.VirtualMachineInstanceMigrationState{MigrationUID: vmim.UID, StartTimestamp: &start,
				DataTotalBytes: &total, DataProcessedBytes: &processed, DataRemainingBytes: &remaining}
		})
		if err != nil {
			return err
		}
		time.Sleep(150 * time.Millisecond)
		if fail && done >= 128<<20 {
			break
		}
	}
	end := metav1.Now()
	downtime, total := int64(42), int64(317)
	err := updateVMI(ctx, vmim.Namespace, vmim.Spec.VMIName, func(v *qv1.VirtualMachineInstance) {
		st := v.Status.MigrationState
		st.EndTimestamp = &end
		if fail {
			st.Failed, st.FailureReason = true, "target node refused the connection"
			return
		}
		st.Completed, st.DowntimeMilliseconds, st.TotalTimeMilliseconds = true, &downtime, &total
	})
	if err != nil {
		return err
	}
	phase := qv1.MigrationSucceeded
	if fail {
		phase = qv1.MigrationFailed
	}
	return updateVMIM(ctx, vmim, func(m *qv1.VirtualMachineInstanceMigration) { m.Status.Phase = phase })
}

func updateVMI(ctx context.Context, ns, name string, mutate func(*qv1.VirtualMachineInstance)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var v qv1.VirtualMachineInstance
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &v); err != nil {
			return err
		}
		mutate(&v)
		return cp.Client.Status().Update(ctx, &v)
	})
}

func updateVMIM(ctx context.Context, vmim *qv1.VirtualMachineInstanceMigration, mutate func(*qv1.VirtualMachineInstanceMigration)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var m qv1.VirtualMachineInstanceMigration
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(vmim), &m); err != nil {
			return err
		}
		mutate(&m)
		return cp.Client.Status().Update(ctx, &m)
	})
}

func TestMigrateWaitDrawsProgressToTheEnd(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "mig-ok", qv1.Running)
	var errs chan error
	f.onMigrate, errs = migrationScript(f, false)
	out, errOut, code := run(t, nil, "migrate", "mig-ok", "--wait", "--kubeconfig", kc)
	if err := <-errs; err != nil {
		t.Fatalf("migration script: %v", err)
	}
	if code != 0 || !regexp.MustCompile(`^virtualmachineinstancemigration\.qvirt\.io/mig-ok-migration-\w+ created\n$`).MatchString(out) {
		t.Fatalf("migrate --wait: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Logf("migrate --wait stderr:\n%s", errOut)
	for _, want := range []string{
		"Running         [###############...............]  50% 128.0 MiB processed of 256.0 MiB, 128.0 MiB remaining,",
		"MiB/s",
		"] 100% 256.0 MiB processed of 256.0 MiB, 0 B remaining",
		// QEMU's own figure: the timestamps' whole seconds would say 0s.
		"succeeded: downtime 42 ms, total time 317ms\n",
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("progress lacks %q:\n%s", want, errOut)
		}
	}
}

func TestMigrateWaitFailsWithTheReason(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "mig-bad", qv1.Running)
	var errs chan error
	f.onMigrate, errs = migrationScript(f, true)
	_, errOut, code := run(t, nil, "migrate", "mig-bad", "--wait", "--kubeconfig", kc)
	if err := <-errs; err != nil {
		t.Fatalf("migration script: %v", err)
	}
	if code != 1 || !regexp.MustCompile(`error: migration mig-bad-migration-\w+ failed: target node refused the connection`).MatchString(errOut) {
		t.Errorf("failed migration: exit %d, stderr %q", code, errOut)
	}
	// Without --wait only the name is printed.
	f.onMigrate = nil
	out, _, code := run(t, nil, "migrate", "mig-bad", "--kubeconfig", kc)
	if code != 0 || !strings.HasPrefix(out, "virtualmachineinstancemigration.qvirt.io/mig-bad-migration-") {
		t.Errorf("migrate: exit %d, stdout %q", code, out)
	}
}

// A migration the controller failed (no node agent ever reported on it) fails with the Failed
// condition's message, not the message of whichever condition comes first.
func TestMigrateWaitFailsWithTheFailedCondition(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	createVMI(t, "ns-a", "mig-refused", qv1.Running)
	errs := make(chan error, 1)
	f.onMigrate = func(vmim *qv1.VirtualMachineInstanceMigration) {
		if err := f.waitWatching("virtualmachineinstances", "virtualmachineinstancemigrations"); err != nil {
			errs <- err
			return
		}
		now := metav1.Now()
		errs <- updateVMIM(context.Background(), vmim, func(m *qv1.VirtualMachineInstanceMigration) {
			m.Status.Phase = qv1.MigrationFailed
			m.Status.Conditions = []metav1.Condition{
				{Type: "Admitted", Status: metav1.ConditionTrue, Reason: "Admitted", Message: "within the parallel migration limits", LastTransitionTime: now},
				{Type: "Failed", Status: metav1.ConditionTrue, Reason: "TargetImageMismatch", LastTransitionTime: now,
					Message: "target pod p: containerDisk root: the target's node pulled a for b, the source runs c"},
			}
		})
	}
	_, errOut, code := run(t, nil, "migrate", "mig-refused", "--wait", "--kubeconfig", kc)
	if err := <-errs; err != nil {
		t.Fatalf("migration script: %v", err)
	}
	if code != 1 || !regexp.MustCompile(`failed: target pod p: containerDisk root: the target's node pulled a for b, the source runs c \(TargetImageMismatch\)`).MatchString(errOut) {
		t.Errorf("failed migration: exit %d, stderr %q", code, errOut)
	}
}
