package vm

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	testcdi "github.com/qvirt/qvirt/test/cdi"
)

// TestDataVolumes runs the VM reconciler against a real API server first without CDI, then with a
// stand-in of CDI's DataVolume CRD (test/cdi/datavolume-crd.yaml) installed. CDI itself does
// not run: the tests play its importer by creating the DataVolume's claim and writing the
// DataVolume's status.phase (ImportInProgress, Succeeded or Failed). The CRD is removed at the end.
func TestDataVolumes(t *testing.T) {
	ctrl.SetLogger(logr.Discard())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Without CDI: a clear condition, no instance, and the controller keeps running.
	h, err := newHarness(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop := startVMManager(t)
	if err := h.createDVVM("early", "early-root", nil); err != nil {
		t.Fatal(err)
	}
	if err := h.waitVM("early", "Failure CDINotInstalled", func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure)
		return c != nil && c.Reason == ReasonCDINotInstalled && strings.Contains(c.Message, "CDI is not installed") &&
			strings.Contains(c.Message, "spec.dataVolumeTemplates[0] (DataVolume early-root)") &&
			vm.Status.PrintableStatus == v1alpha1.PrintableStatusProvisioning
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.getVMI("early"); !apierrors.IsNotFound(err) {
		t.Fatalf("a VMI exists for a VM whose DataVolume CDI cannot make (err %v)", err)
	}
	stop()

	testcdi.InstallCRDs(t, cp.Config)
	// A new manager, as qvirt-controller restarted after CDI's installation: it watches DataVolumes.
	stop = startVMManager(t)
	defer stop()

	cases := []namedCase{
		{"Provisioning", testDVProvisioning},
		{"Failed", testDVFailed},
		{"NotOwned", testDVNotOwned},
		{"NotFound", testDVNotFound},
		{"CDIInstalledLater", func(*harness) error {
			// The VM refused above gets its DataVolume now that CDI is there.
			dv, err := h.waitDataVolume("early-root")
			if err != nil {
				return err
			}
			return h.ownedByVM(dv, "early")
		}},
	}
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() {
			ch, err := newHarness(ctx)
			if err == nil {
				err = c.run(ch)
			}
			if err != nil {
				errs[i] = fmt.Errorf("namespace %s: %w", ch.ns, err)
			}
		})
	}
	wg.Wait()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if errs[i] != nil {
				t.Error(errs[i])
			}
		})
	}
}

// startVMManager runs the VM reconciler in a manager of its own until the returned stop.
func startVMManager(t *testing.T) (stop func()) {
	t.Helper()
	mgr, err := ctrl.NewManager(cp.Config, cp.ManagerOptions())
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 the reconcilers take a record.EventRecorder, as qvirt-controller wires them
	recorder := mgr.GetEventRecorderFor("qvirt-vm")
	r := &Reconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: recorder,
		Config: config.NewStore(config.Default()), APIReader: mgr.GetAPIReader()}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("manager: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// createDVVM creates a runStrategy Always VM whose root disk is DataVolume dv; with a template for
// it unless template is false (mutate may change the VM further).
func (h *harness) createDVVM(name, dv string, mutate func(*v1alpha1.VirtualMachine)) error {
	tmpl := testTemplate(name)
	tmpl.Spec.Domain.Devices.Disks = []v1alpha1.Disk{{Name: "root", Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}}
	tmpl.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{DataVolume: &v1alpha1.DataVolumeSource{Name: dv}}}}
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec: v1alpha1.VirtualMachineSpec{RunStrategy: ptr.To(v1alpha1.RunStrategyAlways), Template: tmpl,
			DataVolumeTemplates: []v1alpha1.DataVolumeTemplateSpec{{
				ObjectMeta: metav1.ObjectMeta{Name: dv, Labels: map[string]string{"disk": "root"}},
				Spec: runtime.RawExtension{Raw: []byte(`{"source":{"http":{"url":"https://example.com/fedora.qcow2"}},` +
					`"storage":{"resources":{"requests":{"storage":"1Gi"}}}}`)},
			}}},
	}
	if mutate != nil {
		mutate(vm)
	}
	if err := h.c.Create(h.ctx, vm); err != nil {
		return fmt.Errorf("create VM: %w", err)
	}
	return nil
}

func newDataVolume(ns, name string) *unstructured.Unstructured {
	dv := &unstructured.Unstructured{}
	dv.SetGroupVersionKind(DataVolumeGVK)
	dv.SetNamespace(ns)
	dv.SetName(name)
	return dv
}

func (h *harness) getDataVolume(name string) (*unstructured.Unstructured, error) {
	dv := newDataVolume(h.ns, name)
	return dv, h.c.Get(h.ctx, h.key(name), dv)
}

func (h *harness) waitDataVolume(name string) (*unstructured.Unstructured, error) {
	var dv *unstructured.Unstructured
	err := poll(h.ctx, "DataVolume "+name, func() error {
		var err error
		dv, err = h.getDataVolume(name)
		return err
	})
	return dv, err
}

// ownedByVM checks that dv is controlled by VM vm.
func (h *harness) ownedByVM(dv *unstructured.Unstructured, vm string) error {
	ref := metav1.GetControllerOf(dv)
	if ref == nil || ref.Kind != "VirtualMachine" || ref.Name != vm || ref.APIVersion != v1alpha1.GroupVersion.String() {
		return fmt.Errorf("DataVolume %s: controller %+v, want VirtualMachine %s", dv.GetName(), ref, vm)
	}
	return nil
}

// playCDI writes the DataVolume's status as CDI does.
func (h *harness) playCDI(name string, status map[string]any) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		dv, err := h.getDataVolume(name)
		if err != nil {
			return err
		}
		dv.Object["status"] = status
		return h.c.Status().Update(h.ctx, dv)
	})
}

// failureIs checks the VM's Failure condition.
func failureIs(reason string, parts ...string) func(*v1alpha1.VirtualMachine) bool {
	return func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure)
		if c == nil || c.Reason != reason {
			return false
		}
		for _, p := range parts {
			if !strings.Contains(c.Message, p) {
				return false
			}
		}
		return true
	}
}

func (h *harness) noVMI(name string) error {
	if _, err := h.getVMI(name); !apierrors.IsNotFound(err) {
		return fmt.Errorf("VMI %s exists (err %v)", name, err)
	}
	return nil
}

// testDVProvisioning: the DataVolume is created from the template, owned by the VM; the VM is
// Provisioning and has no instance until the DataVolume succeeds; then the instance uses it.
func testDVProvisioning(h *harness) error {
	if err := h.createDVVM("fedora", "fedora-root", nil); err != nil {
		return err
	}
	dv, err := h.waitDataVolume("fedora-root")
	if err != nil {
		return err
	}
	if err := h.ownedByVM(dv, "fedora"); err != nil {
		return err
	}
	if url, _, _ := unstructured.NestedString(dv.Object, "spec", "source", "http", "url"); url != "https://example.com/fedora.qcow2" || dv.GetLabels()["disk"] != "root" {
		return fmt.Errorf("DataVolume spec %v labels %v: want the template's", dv.Object["spec"], dv.GetLabels())
	}
	if err := h.playCDI("fedora-root", map[string]any{"phase": "ImportInProgress", "progress": "45.00%"}); err != nil {
		return err
	}
	if err := h.waitVM("fedora", "Provisioning with DataVolumesReady=False", func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineDataVolumesReady)
		return vm.Status.PrintableStatus == v1alpha1.PrintableStatusProvisioning && c != nil && c.Status == metav1.ConditionFalse &&
			c.Reason == ReasonNotAllDVsReady && strings.Contains(c.Message, "DataVolume fedora-root is ImportInProgress (45.00%)")
	}); err != nil {
		return err
	}
	if err := h.holds(2*time.Second, "no VMI while the import runs", func() error { return h.noVMI("fedora") }); err != nil {
		return err
	}
	// CDI's importer has filled the claim named as the DataVolume, and CDI marks it Succeeded.
	mode := corev1.PersistentVolumeFilesystem
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "fedora-root", Namespace: h.ns},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	if err := h.c.Create(h.ctx, pvc); err != nil {
		return err
	}
	if err := h.playCDI("fedora-root", map[string]any{"phase": "Succeeded", "progress": "100.0%"}); err != nil {
		return err
	}
	vmi, err := h.waitVMI("fedora", "the VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	if v := vmi.Spec.Volumes; len(v) != 1 || v[0].DataVolume == nil || v[0].DataVolume.Name != "fedora-root" {
		return fmt.Errorf("VMI volumes %+v: want dataVolume fedora-root", v)
	}
	return h.waitVM("fedora", "DataVolumesReady=True", func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineDataVolumesReady)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == ReasonAllDVsReady &&
			meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure) == nil
	})
}

// testDVFailed: a DataVolume CDI failed to import gives the VM a condition naming it, and no instance.
func testDVFailed(h *harness) error {
	if err := h.createDVVM("broken", "broken-root", nil); err != nil {
		return err
	}
	if _, err := h.waitDataVolume("broken-root"); err != nil {
		return err
	}
	if err := h.playCDI("broken-root", map[string]any{"phase": "Failed", "conditions": []any{
		map[string]any{"type": "Running", "status": "False", "reason": "Error", "message": "Unable to connect to http data source: expected status code 200, got 404"}}}); err != nil {
		return err
	}
	if err := h.waitVM("broken", "Failure FailedDataVolumeImport", func(vm *v1alpha1.VirtualMachine) bool {
		return failureIs(ReasonFailedDataVolumeImport, "DataVolume broken-root of volume root failed", "got 404")(vm) &&
			vm.Status.PrintableStatus == v1alpha1.PrintableStatusDataVolumeNotReady
	}); err != nil {
		return err
	}
	if err := h.waitEvent(ReasonFailedDataVolumeImport, corev1.EventTypeWarning); err != nil {
		return err
	}
	return h.noVMI("broken")
}

// testDVNotOwned: a DataVolume of the template's name that the VM does not control is reported,
// not adopted.
func testDVNotOwned(h *harness) error {
	other := newDataVolume(h.ns, "taken-root")
	other.Object["spec"] = map[string]any{"source": map[string]any{"blank": map[string]any{}}}
	if err := h.c.Create(h.ctx, other); err != nil {
		return err
	}
	if err := h.createDVVM("taken", "taken-root", nil); err != nil {
		return err
	}
	if err := h.waitVM("taken", "Failure DataVolumeConflict", failureIs(ReasonDataVolumeConflict,
		"DataVolume taken-root of spec.dataVolumeTemplates[0] exists and is not controlled by this VM")); err != nil {
		return err
	}
	dv, err := h.getDataVolume("taken-root")
	if err != nil {
		return err
	}
	if refs := dv.GetOwnerReferences(); len(refs) != 0 {
		return fmt.Errorf("the DataVolume was adopted: owner references %+v", refs)
	}
	return h.noVMI("taken")
}

// testDVNotFound: a dataVolume volume without a template names a DataVolume that must exist.
func testDVNotFound(h *harness) error {
	if err := h.createDVVM("orphan", "nowhere", func(vm *v1alpha1.VirtualMachine) { vm.Spec.DataVolumeTemplates = nil }); err != nil {
		return err
	}
	if err := h.waitVM("orphan", "Failure FailedDataVolumeNotFound", func(vm *v1alpha1.VirtualMachine) bool {
		return failureIs(ReasonDataVolumeNotFound, "spec.template.spec.volumes[root].dataVolume.name: DataVolume nowhere does not exist")(vm) &&
			vm.Status.PrintableStatus == v1alpha1.PrintableStatusDataVolumeNotFound
	}); err != nil {
		return err
	}
	return h.noVMI("orphan")
}
