package migration

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// TestPostCopyOnlyWhereTheTargetAllowsIt: a policy allowing post-copy applies it only when the
// target node's agent labelled the node for it; elsewhere the migration's fixed configuration
// has allowPostCopy off and a Warning Event says why (the node's reason). A migration that may
// switch is not aborted at its completion timeout (its launcher switches then), and one in
// post-copy never is.
func TestPostCopyOnlyWhereTheTargetAllowsIt(t *testing.T) {
	e := setup(t, nil)
	yes, no := e.ns+"-uffd", e.ns+"-no-uffd"
	for name, label := range map[string]string{yes: "true", no: "false"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.NodePostCopyLabel: label}}}
		if label == "false" {
			n.Annotations = map[string]string{v1alpha1.NodePostCopyReasonAnnotation: "the sysctl is 0"}
		}
		if err := cp.Client.Create(e.ctx, n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cp.Client.Delete(e.ctx, n) })
	}
	p := policy(e.ns+"-postcopy", v1alpha1.LabelSelector{"app": "web"}, nil)
	p.Spec.AllowPostCopy = ptr.To(true)
	p.Spec.CompletionTimeoutPerGiB = ptr.To[int64](1) // a 512Mi guest: 1 s
	if err := cp.Client.Create(e.ctx, &p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(e.ctx, &p) })

	refused, _ := e.runningVMI("vm-refused", "node-a", false)
	m := e.migrate("mig-refused", refused.Name)
	e.driveToRunning(m, refused, no)
	if c := e.getVMI(refused).Status.MigrationState.MigrationConfiguration; c.PostCopy() {
		t.Errorf("a migration to node %s (no userfaultfd) may switch to post-copy: %+v", no, c)
	}
	e.waitEvent(m.Name, ReasonPostCopyUnavailable, "the sysctl is 0")
	if got, err := e.getMigration(m); err != nil {
		t.Fatal(err)
	} else if c := condition(got, ConditionPostCopyUnavailable); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "the sysctl is 0") {
		t.Errorf("migration to node %s: condition %s is %+v, want True saying why", no, ConditionPostCopyUnavailable, c)
	}
	e.eventually("the pre-copy migration aborted at its completion timeout", func() (bool, string) {
		got, err := e.getMigration(m)
		if err != nil {
			return false, err.Error()
		}
		c := condition(got, ConditionAbortRequested)
		return c != nil && c.Reason == ReasonCompletionTimeout, "no abort"
	})

	allowed, _ := e.runningVMI("vm-allowed", "node-a", false)
	m = e.migrate("mig-allowed", allowed.Name)
	e.driveToRunning(m, allowed, yes)
	if c := e.getVMI(allowed).Status.MigrationState.MigrationConfiguration; !c.PostCopy() {
		t.Fatalf("a migration to node %s (userfaultfd) may not switch to post-copy: %+v", yes, c)
	}
	e.agent(allowed, func(ms *v1alpha1.VirtualMachineInstanceMigrationState) { ms.Mode = v1alpha1.MigrationPostCopy })
	time.Sleep(3 * time.Second) // past twice the completion timeout
	got, err := e.getMigration(m)
	if err != nil {
		t.Fatal(err)
	}
	if c := condition(got, ConditionAbortRequested); c != nil {
		t.Fatalf("a migration in post-copy was aborted: %+v", c)
	}
}

// completionDeadline: pre-copy gets its timeout, a migration that may switch twice that, one in
// post-copy none.
func TestCompletionDeadline(t *testing.T) {
	allow := &v1alpha1.MigrationConfiguration{AllowPostCopy: ptr.To(true)}
	for _, c := range []struct {
		ms   *v1alpha1.VirtualMachineInstanceMigrationState
		want time.Duration
	}{
		{nil, time.Minute},
		{&v1alpha1.VirtualMachineInstanceMigrationState{}, time.Minute},
		{&v1alpha1.VirtualMachineInstanceMigrationState{MigrationConfiguration: allow}, 2 * time.Minute},
		{&v1alpha1.VirtualMachineInstanceMigrationState{MigrationConfiguration: allow, Mode: v1alpha1.MigrationPostCopy}, 0},
	} {
		if got := completionDeadline(c.ms, time.Minute); got != c.want {
			t.Errorf("completionDeadline(%+v) = %s, want %s", c.ms, got, c.want)
		}
	}
}
