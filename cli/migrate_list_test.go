package cli

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// listedMigration creates a migration of vmi in phase, from a node drain when evacuating names a
// node.
func listedMigration(t *testing.T, ns, name, vmi, evacuating string, phase qv1.VirtualMachineInstanceMigrationPhase) *qv1.VirtualMachineInstanceMigration {
	t.Helper()
	ctx := context.Background()
	ensureNamespace(t, ns)
	m := &qv1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: qv1.VirtualMachineInstanceMigrationSpec{VMIName: vmi}}
	if evacuating != "" {
		m.Annotations = map[string]string{qv1.EvacuationMigrationAnnotation: evacuating}
	}
	if err := cp.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), m) })
	m.Status.Phase = phase
	m.Status.MigrationState = &qv1.VirtualMachineInstanceMigrationState{SourceNode: "node-1", TargetNode: "node-2"}
	if phase == qv1.MigrationFailed {
		m.Status.Conditions = []metav1.Condition{{Type: "Failed", Status: metav1.ConditionTrue, Reason: "MigrationFailed",
			Message: "target pod failed", LastTransitionTime: metav1.Now()}}
	}
	if err := cp.Client.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestMigrateListShowsEvacuations: migrate-list tells a drain's migrations (evacuation of NODE) from
// a user's, with a failure's reason; migrate-cancel deletes the VM's migration under way and
// refuses, naming the VM, when there is none.
func TestMigrateListShowsEvacuations(t *testing.T) {
	f := newFakeAPI(t)
	kc := f.kubeconfig(t)
	listedMigration(t, "ns-a", "by-hand", "web", "", qv1.MigrationSucceeded)
	listedMigration(t, "ns-a", "web-evacuation-x1", "web", "node-1", qv1.MigrationFailed)
	running := listedMigration(t, "ns-a", "web-evacuation-x2", "web", "node-1", qv1.MigrationRunning)
	listedMigration(t, "ns-a", "db-1", "db", "", qv1.MigrationRunning)

	out, errOut, code := run(t, nil, "migrate-list", "web", "--kubeconfig", kc)
	if code != 0 {
		t.Fatalf("migrate-list: exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"NAME", "TRIGGER",
		"by-hand", "user",
		"web-evacuation-x1  web  Failed     evacuation of node-1  node-1  node-2  target pod failed",
		"web-evacuation-x2  web  Running    evacuation of node-1  node-1  node-2  -",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate-list lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "db-1") {
		t.Errorf("migrate-list web lists another VM's migration:\n%s", out)
	}

	out, errOut, code = run(t, nil, "migrate-cancel", "web", "--kubeconfig", kc)
	if code != 0 || out != "VM web: migration web-evacuation-x2 (evacuation of node-1) cancelled\n" {
		t.Fatalf("migrate-cancel: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if err := cp.Client.Get(context.Background(), client.ObjectKeyFromObject(running), running); !apierrors.IsNotFound(err) {
		t.Fatalf("the cancelled migration is still there: %v", err)
	}
	_, errOut, code = run(t, nil, "migrate-cancel", "web", "--kubeconfig", kc)
	if code != 1 || !strings.Contains(errOut, "VM web in namespace ns-a has no migration under way to cancel") {
		t.Fatalf("migrate-cancel with nothing to cancel: exit %d, stderr %q", code, errOut)
	}
}
