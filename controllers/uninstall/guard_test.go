package uninstall_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	ctrladmission "sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/controllers/admission"
	"github.com/qvirt/qvirt/controllers/uninstall"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// This control plane is the package's own: no other test leaves VMs in it, so "nothing left"
// is reachable and is tested for real.
var cp *envtest.ControlPlane

func TestMain(m *testing.M) {
	envtest.MainWith(m, &cp, envtest.Options{Webhooks: true})
}

// startController runs what qvirt-controller runs for this: the admission webhooks (the guard
// among them) and the finalizer reconciler, here over targets.
func startController(t *testing.T) {
	t.Helper()
	cp.StartWebhookManager(t, func(mgr ctrl.Manager) error {
		if err := admission.Setup(mgr, config.NewStore(config.Default())); err != nil {
			return err
		}
		return (&uninstall.Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
	})
}

func kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, stderr, err := cp.KubectlCmd(ctx, nil, args...)
	return stderr, err
}

// TestUninstallRefusedWhileVMsExist plays an uninstall against a VMI as kubectl delete -k does it:
//   - deleting an installed object (it carries the install label) is refused through
//     kube-apiserver, naming the VMI and what to do, and the object stays; an object without the
//     label is not the guard's business;
//   - the webhook configuration and admission policy, which no webhook can guard, carry the
//     finalizer while the VMI exists, so their deletion waits;
//   - once the VMI is gone, the finalizers go (the configuration deleted meanwhile with them) and
//     the installed object can be deleted.
func TestUninstallRefusedWhileVMsExist(t *testing.T) {
	ctx := context.Background()
	// Two of the targets, by the names config/default gives them (envtest installs the webhook
	// configurations under other names); harmless: no webhook, and a policy bound to nothing.
	vwc := &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "qvirt-validating-webhook"}}
	vap := &admissionregv1.ValidatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: "qvirt-handler-own-node"},
		Spec: admissionregv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregv1.Ignore),
			MatchConstraints: &admissionregv1.MatchResources{ResourceRules: []admissionregv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregv1.RuleWithOperations{Operations: []admissionregv1.OperationType{admissionregv1.Create},
					Rule: admissionregv1.Rule{APIGroups: []string{"guard.test"}, APIVersions: []string{"v1"}, Resources: []string{"nothings"}}}}}},
			Validations: []admissionregv1.Validation{{Expression: "true"}},
		}}
	for _, o := range []client.Object{vwc, vap} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { release(o); _ = cp.Client.Delete(context.Background(), o) })
	}
	startController(t)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "uninstall-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), ns) })
	installed := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "qvirt-config",
		Labels: map[string]string{uninstall.InstallLabel: "qvirt"}}}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "someone-elses"}}
	for _, o := range []client.Object{installed, other} {
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), installed) })

	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := yaml.Unmarshal(sample(t), vmi); err != nil {
		t.Fatal(err)
	}
	vmi.Namespace, vmi.Name = ns.Name, "guarded"
	// The webhook server starts with the manager; the VMI webhooks (failurePolicy Fail) refuse
	// until it answers.
	testutil.Eventually(t, 30*time.Second, "the VMI admitted", func() bool { return cp.Client.Create(ctx, vmi) == nil }, func() string { return "" })
	t.Cleanup(func() {
		_ = cp.Client.Delete(context.Background(), vmi)
		release(vmi, v1alpha1.GracefulShutdownFinalizer)
	})

	held := func(o client.Object) func() bool {
		return func() bool {
			return cp.Client.Get(ctx, client.ObjectKeyFromObject(o), o) == nil && controllerutil.ContainsFinalizer(o, uninstall.Finalizer)
		}
	}
	testutil.Eventually(t, 20*time.Second, "the finalizer on the webhook configuration", held(vwc), func() string { return "" })
	testutil.Eventually(t, 20*time.Second, "the finalizer on the admission policy", held(vap), func() string { return "" })

	stderr, err := kubectl("delete", "-n", ns.Name, "configmap", installed.Name)
	if err == nil {
		t.Fatal("kubectl delete of an installed object succeeded with a VMI in the cluster")
	}
	for _, want := range []string{"vuninstall.qvirt.io", "qvirt is still in use", "1 VirtualMachineInstance: " + ns.Name + "/guarded",
		`ConfigMap "qvirt-config"`, "kubectl delete vm,vmi,vmim --all -A"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("refusal %q does not say %q", stderr, want)
		}
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(installed), &corev1.ConfigMap{}); err != nil {
		t.Errorf("the refused object is gone: %v", err)
	}
	if stderr, err := kubectl("delete", "-n", ns.Name, "configmap", other.Name); err != nil {
		t.Errorf("deleting an object qvirt did not install was refused: %s", stderr)
	}
	if stderr, err := kubectl("delete", "--wait=false", "validatingwebhookconfiguration", vwc.Name); err != nil {
		t.Fatalf("kubectl delete of the webhook configuration: %s", stderr)
	}
	time.Sleep(time.Second)
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(vwc), vwc); err != nil || vwc.DeletionTimestamp == nil {
		t.Fatalf("the webhook configuration, deleted with a VMI in the cluster: %v (deletionTimestamp %v), want it held Terminating", err, vwc.DeletionTimestamp)
	}

	// A migration under way keeps qvirt in use after its VMI is gone, until it finishes.
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "moving"},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi.Name}}
	if err := cp.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), mig) })
	// The VMI's graceful-shutdown finalizer (set by the mutating webhook) is the VMI reconciler's
	// to clear, which does not run here: the test clears it, as the reconciler does once the
	// launcher is gone.
	if err := cp.Client.Delete(ctx, vmi); err != nil {
		t.Fatal(err)
	}
	release(vmi, v1alpha1.GracefulShutdownFinalizer)
	testutil.Eventually(t, 20*time.Second, "the VMI gone", func() bool {
		return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(vmi), vmi))
	}, func() string { return fmt.Sprint("finalizers ", vmi.Finalizers) })
	time.Sleep(time.Second)
	if !held(vap)() {
		t.Fatal("the admission policy was released with a migration still under way")
	}
	stderr, err = kubectl("delete", "-n", ns.Name, "configmap", installed.Name)
	if err == nil || !strings.Contains(stderr, "1 VirtualMachineInstanceMigration: "+ns.Name+"/moving") {
		t.Fatalf("kubectl delete with a migration under way: %v %s, want it refused naming the migration", err, stderr)
	}

	// The migration finishes (a status update): nothing is in use. The admission policy is
	// released; the webhook configuration, deleted by the refused uninstall, stays held and in
	// force: qvirt keeps its admission until an uninstall goes through.
	mig.Status.Phase = v1alpha1.MigrationFailed
	if err := cp.Client.Status().Update(ctx, mig); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the finalizer off the admission policy once the migration finished", func() bool { return !held(vap)() },
		func() string { return fmt.Sprint("finalizers ", vap.Finalizers) })
	if !held(vwc)() || vwc.DeletionTimestamp == nil {
		t.Fatalf("the webhook configuration deleted by the refused uninstall: finalizers %v, deletion %v; want it held Terminating", vwc.Finalizers, vwc.DeletionTimestamp)
	}

	// The uninstall goes through: the guard releases the held configuration first.
	if stderr, err := kubectl("delete", "-n", ns.Name, "configmap", installed.Name); err != nil {
		t.Fatalf("kubectl delete of an installed object with nothing in use: %s", stderr)
	}
	testutil.Eventually(t, 20*time.Second, "the held webhook configuration gone with the uninstall", func() bool {
		return apierrors.IsNotFound(cp.Client.Get(ctx, client.ObjectKeyFromObject(vwc), vwc))
	}, func() string { return fmt.Sprint("finalizers ", vwc.Finalizers) })
}

// release takes finalizer (uninstall.Finalizer when none is given) off o, so that a failed test
// leaves nothing held.
func release(o client.Object, finalizer ...string) {
	ctx := context.Background()
	f := uninstall.Finalizer
	if len(finalizer) > 0 {
		f = finalizer[0]
	}
	if cp.Client.Get(ctx, client.ObjectKeyFromObject(o), o) != nil || !controllerutil.RemoveFinalizer(o, f) {
		return
	}
	_ = cp.Client.Update(ctx, o)
}

func sample(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(envtest.RepoRoot(), "config", "samples", "vmi_testguest.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestGuardNamesWhatIsRunning: the refusal counts each kind and names the first three of each; a
// finished migration does not count; anything but a deletion goes through.
func TestGuardNamesWhatIsRunning(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	req := ctrladmission.Request{AdmissionRequest: admissionv1.AdmissionRequest{Operation: admissionv1.Delete,
		Kind: metav1.GroupVersionKind{Kind: "Namespace"}, Name: "qvirt-system"}}
	var objs []client.Object
	for _, n := range []string{"a", "b", "c", "d"} {
		objs = append(objs, &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: n}})
	}
	finished := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "done"}}
	finished.Status.Phase = v1alpha1.MigrationSucceeded
	objs = append(objs, &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm"}},
		&v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig"}}, finished)
	busy := &uninstall.Guard{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()}
	resp := busy.Handle(context.Background(), req)
	if resp.Allowed {
		t.Fatal("allowed with VMs running")
	}
	want := `qvirt is still in use (1 VirtualMachine: ns/vm; 4 VirtualMachineInstance: ns/a, ns/b, ns/c and 1 more; ` +
		`1 VirtualMachineInstanceMigration: ns/mig): deleting Namespace "qvirt-system"`
	if !strings.Contains(resp.Result.Message, want) {
		t.Errorf("refusal %q, want it to contain %q", resp.Result.Message, want)
	}
	req.Operation = admissionv1.Update
	if resp := busy.Handle(context.Background(), req); !resp.Allowed {
		t.Errorf("an update was refused: %v", resp.Result)
	}
}
