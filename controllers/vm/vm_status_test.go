package vm

import (
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

func statusVM(mods ...func(*v1alpha1.VirtualMachine)) *v1alpha1.VirtualMachine {
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "vm", UID: "vm-uid", Generation: 3},
		Spec: v1alpha1.VirtualMachineSpec{
			RunStrategy: ptr.To(v1alpha1.RunStrategyAlways),
			Template: v1alpha1.VirtualMachineInstanceTemplateSpec{Spec: v1alpha1.VirtualMachineInstanceSpec{
				Domain: v1alpha1.DomainSpec{Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))}},
			}},
		},
	}
	for _, m := range mods {
		m(vm)
	}
	return vm
}

// matching is an instance created from statusVM's template.
func matching(vm *v1alpha1.VirtualMachine) func(*v1alpha1.VirtualMachineInstance) {
	return func(vmi *v1alpha1.VirtualMachineInstance) { vmi.Spec = desiredVMISpec(vm) }
}

// admitted is an instance created from vm's template as stored by admission, which records
// KubeVirt's defaults in it (v1alpha1.SetDefaults).
func admitted(vm *v1alpha1.VirtualMachine) func(*v1alpha1.VirtualMachineInstance) {
	return func(vmi *v1alpha1.VirtualMachineInstance) {
		vmi.Spec = desiredVMISpec(vm)
		v1alpha1.SetDefaults(&vmi.Spec)
	}
}

func cond(typ string, status metav1.ConditionStatus, reason string) func(*v1alpha1.VirtualMachineInstance) {
	return func(vmi *v1alpha1.VirtualMachineInstance) {
		vmi.Status.Conditions = append(vmi.Status.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason})
	}
}

func TestPrintableStatus(t *testing.T) {
	terminating := func(vm *v1alpha1.VirtualMachine) { vm.DeletionTimestamp = &metav1.Time{Time: t0} }
	migration := func(done, failed bool) func(*v1alpha1.VirtualMachineInstance) {
		return func(vmi *v1alpha1.VirtualMachineInstance) {
			vmi.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{Completed: done, Failed: failed}
		}
	}
	cases := []struct {
		name       string
		vm         *v1alpha1.VirtualMachine
		vmi        *v1alpha1.VirtualMachineInstance
		backingOff bool
		want       v1alpha1.PrintableStatus
	}{
		{"no VMI", statusVM(), nil, false, v1alpha1.PrintableStatusStopped},
		{"succeeded", statusVM(), testVMI(v1alpha1.Succeeded), false, v1alpha1.PrintableStatusStopped},
		{"failed", statusVM(), testVMI(v1alpha1.Failed), false, v1alpha1.PrintableStatusStopped},
		{"created, no phase yet", statusVM(), testVMI(""), false, v1alpha1.PrintableStatusStarting},
		{"pending", statusVM(), testVMI(v1alpha1.Pending), false, v1alpha1.PrintableStatusStarting},
		{"scheduling", statusVM(), testVMI(v1alpha1.Scheduling), false, v1alpha1.PrintableStatusStarting},
		{"scheduled", statusVM(), testVMI(v1alpha1.Scheduled), false, v1alpha1.PrintableStatusStarting},
		{"unschedulable", statusVM(), testVMI(v1alpha1.Scheduling, cond(v1alpha1.VirtualMachineInstancePodScheduled, metav1.ConditionFalse, v1alpha1.ReasonUnschedulable)), false, v1alpha1.PrintableStatusUnschedulable},
		{"image cannot be pulled", statusVM(), testVMI(v1alpha1.Scheduling, cond(v1alpha1.VirtualMachineInstanceSynchronized, metav1.ConditionFalse, v1alpha1.ReasonErrImagePull)), false, v1alpha1.PrintableStatusErrImagePull},
		{"image pull backing off", statusVM(), testVMI(v1alpha1.Scheduling, cond(v1alpha1.VirtualMachineInstanceSynchronized, metav1.ConditionFalse, v1alpha1.ReasonImagePullBackOff)), false, v1alpha1.PrintableStatusImagePullBackOff},
		{"the node agent's own sync failure", statusVM(), testVMI(v1alpha1.Scheduled, cond(v1alpha1.VirtualMachineInstanceSynchronized, metav1.ConditionFalse, "SyncFailed")), false, v1alpha1.PrintableStatusStarting},
		{"running", statusVM(), testVMI(v1alpha1.Running), false, v1alpha1.PrintableStatusRunning},
		{"paused", statusVM(), testVMI(v1alpha1.Running, cond(v1alpha1.VirtualMachineInstancePaused, metav1.ConditionTrue, "PausedByUser")), false, v1alpha1.PrintableStatusPaused},
		{"migrating", statusVM(), testVMI(v1alpha1.Running, migration(false, false)), false, v1alpha1.PrintableStatusMigrating},
		{"migration completed", statusVM(), testVMI(v1alpha1.Running, migration(true, false)), false, v1alpha1.PrintableStatusRunning},
		{"migration failed", statusVM(), testVMI(v1alpha1.Running, migration(false, true)), false, v1alpha1.PrintableStatusRunning},
		{"unknown", statusVM(), testVMI(v1alpha1.Unknown), false, v1alpha1.PrintableStatusUnknown},
		{"stopping", statusVM(), testVMI(v1alpha1.Running, deleting), false, v1alpha1.PrintableStatusStopping},
		{"crash loop", statusVM(), nil, true, v1alpha1.PrintableStatusCrashLoopBackOff},
		{"terminating wins", statusVM(terminating), testVMI(v1alpha1.Running, deleting), false, v1alpha1.PrintableStatusTerminating},
	}
	for _, tc := range cases {
		if got := printableStatus(tc.vm, tc.vmi, tc.backingOff); got != tc.want {
			t.Errorf("%s: printableStatus = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestComputeStatus(t *testing.T) {
	vm := statusVM()
	changed := statusVM(func(vm *v1alpha1.VirtualMachine) {
		vm.Spec.Template.Spec.Domain.Memory.Guest = ptr.To(resource.MustParse("128Mi"))
	})
	failure := &Failure{Reason: ReasonFailedCreate, Message: errors.New("quota").Error()}

	type want struct {
		created, ready                      bool
		readyCond, paused, failure, restart metav1.ConditionStatus // "" means absent
		readyReason                         string
		stoppedByRequest                    bool
		synchronized                        metav1.ConditionStatus
	}
	cases := []struct {
		name    string
		vm      *v1alpha1.VirtualMachine
		vmi     *v1alpha1.VirtualMachineInstance
		d       Decision
		failure *Failure
		want    want
	}{
		{"no VMI", vm, nil, Decision{}, nil,
			want{readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotExists}},
		{"running and ready", vm, testVMI(v1alpha1.Running, matching(vm), cond(v1alpha1.VirtualMachineInstanceReady, metav1.ConditionTrue, "GuestRunning")), Decision{}, nil,
			want{created: true, ready: true, readyCond: metav1.ConditionTrue, readyReason: "GuestRunning"}},
		{"running, not ready yet", vm, testVMI(v1alpha1.Scheduled, matching(vm)), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotReady}},
		{"paused mirrored", vm, testVMI(v1alpha1.Running, matching(vm),
			cond(v1alpha1.VirtualMachineInstanceReady, metav1.ConditionFalse, "Paused"),
			cond(v1alpha1.VirtualMachineInstancePaused, metav1.ConditionTrue, "PausedByUser")), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: "Paused", paused: metav1.ConditionTrue}},
		{"ended VMI is not ready", vm, testVMI(v1alpha1.Succeeded, matching(vm), cond(v1alpha1.VirtualMachineInstanceReady, metav1.ConditionTrue, "GuestRunning")), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotReady}},
		{"deleting VMI", vm, testVMI(v1alpha1.Running, matching(vm), deleting), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMIDeleting}},
		{"the instance's recorded defaults are no template change", vm, testVMI(v1alpha1.Running, admitted(vm)), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotReady}},
		{"template changed", changed, testVMI(v1alpha1.Running, matching(vm)), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotReady, restart: metav1.ConditionTrue}},
		{"template changed, VMI ended: nothing to restart", changed, testVMI(v1alpha1.Succeeded, matching(vm)), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotReady}},
		{"create failed", vm, nil, Decision{}, failure,
			want{readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotExists, failure: metav1.ConditionTrue}},
		{"a missing cloud-init Secret is shown", vm, testVMI(v1alpha1.Scheduling, matching(vm),
			cond(v1alpha1.VirtualMachineInstanceSynchronized, metav1.ConditionFalse, "SecretNotFound")), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotReady, synchronized: metav1.ConditionFalse}},
		{"a synchronized instance is not", vm, testVMI(v1alpha1.Running, matching(vm),
			cond(v1alpha1.VirtualMachineInstanceSynchronized, metav1.ConditionTrue, "Synchronized")), Decision{}, nil,
			want{created: true, readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotReady}},
		{"held by a stop", vm, nil, Decision{Held: true}, nil,
			want{readyCond: metav1.ConditionFalse, readyReason: ReasonVMINotExists, stoppedByRequest: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := computeStatus(statusInput{VM: tc.vm, VMI: tc.vmi, Decision: tc.d, Failure: tc.failure, Now: t0})
			status := func(typ string) metav1.ConditionStatus {
				if c := meta.FindStatusCondition(st.Conditions, typ); c != nil {
					return c.Status
				}
				return ""
			}
			got := want{created: st.Created, ready: st.Ready,
				readyCond: status(v1alpha1.VirtualMachineReady), paused: status(v1alpha1.VirtualMachinePaused),
				failure: status(v1alpha1.VirtualMachineFailure), restart: status(v1alpha1.VirtualMachineRestartRequired),
				stoppedByRequest: status(ConditionStoppedByRequest) == metav1.ConditionTrue,
				synchronized:     status(v1alpha1.VirtualMachineInstanceSynchronized)}
			if c := meta.FindStatusCondition(st.Conditions, v1alpha1.VirtualMachineReady); c != nil {
				got.readyReason = c.Reason
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if st.ObservedGeneration != tc.vm.Generation {
				t.Errorf("observedGeneration %d, want %d", st.ObservedGeneration, tc.vm.Generation)
			}
			for _, c := range st.Conditions {
				if c.ObservedGeneration != tc.vm.Generation || c.LastTransitionTime.IsZero() || c.Reason == "" {
					t.Errorf("condition %+v: want observedGeneration, transition time and reason", c)
				}
			}
		})
	}
}

func TestComputeStatusKeepsTransitionTimes(t *testing.T) {
	vm := statusVM()
	st := computeStatus(statusInput{VM: vm, Now: t0})
	vm.Status = st
	st = computeStatus(statusInput{VM: vm, Now: t0.Add(time.Minute)})
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.VirtualMachineReady); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("Ready transition time moved to %s without a status change", c.LastTransitionTime)
	}
}

func TestMirroredConditionFixesReason(t *testing.T) {
	vmi := testVMI(v1alpha1.Running, cond(v1alpha1.VirtualMachineInstanceReady, metav1.ConditionTrue, ""))
	if c := mirroredCondition(vmi, v1alpha1.VirtualMachineInstanceReady); c.Reason != "VMIReadyTrue" {
		t.Errorf("reason %q, want a valid replacement", c.Reason)
	}
}

func TestNewVMI(t *testing.T) {
	vm := statusVM(func(vm *v1alpha1.VirtualMachine) {
		vm.Namespace = "ns"
		vm.Spec.Template.ObjectMeta.Labels = map[string]string{"app": "web"}
		vm.Spec.Template.ObjectMeta.Annotations = map[string]string{"note": "x"}
	})
	vmi := newVMI(vm)
	if vmi.Name != "vm" || vmi.Namespace != "ns" {
		t.Errorf("name %s/%s", vmi.Namespace, vmi.Name)
	}
	if vmi.Labels["app"] != "web" || vmi.Labels[v1alpha1.VMNameLabel] != "vm" || vmi.Annotations["note"] != "x" {
		t.Errorf("labels %v annotations %v", vmi.Labels, vmi.Annotations)
	}
	if _, ok := vm.Spec.Template.ObjectMeta.Labels[v1alpha1.VMNameLabel]; ok {
		t.Errorf("newVMI changed the template's labels")
	}
	ref := metav1.GetControllerOf(vmi)
	if ref == nil || ref.UID != vm.UID || ref.Kind != "VirtualMachine" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("controller ref %+v", ref)
	}
	if !controlledBy(vmi, vm) {
		t.Errorf("controlledBy = false")
	}
	if vmi.Spec.Domain.Firmware == nil || vmi.Spec.Domain.Firmware.UUID != vm.UID {
		t.Errorf("firmware UUID not defaulted to the VM's UID: %+v", vmi.Spec.Domain.Firmware)
	}
	if vm.Spec.Template.Spec.Domain.Firmware != nil {
		t.Errorf("newVMI changed the template's spec")
	}
}

// TestComputeStatusDataVolumes: while no instance exists the DataVolumes decide the printable
// status and the DataVolumesReady condition; a pass that did not look at them leaves the condition
// as it was, and a VM without DataVolumes has none.
func TestComputeStatusDataVolumes(t *testing.T) {
	withDV := statusVM(func(vm *v1alpha1.VirtualMachine) {
		vm.Spec.Template.Spec.Volumes = []v1alpha1.Volume{{Name: "root", VolumeSource: v1alpha1.VolumeSource{DataVolume: &v1alpha1.DataVolumeSource{Name: "dv"}}}}
	})
	failed := &Failure{Reason: ReasonFailedDataVolumeImport, Message: "DataVolume dv of volume root failed"}
	for _, tc := range []struct {
		name      string
		vm        *v1alpha1.VirtualMachine
		dvs       *dataVolumesState
		printable v1alpha1.PrintableStatus
		cond      metav1.ConditionStatus // "" means absent
		reason    string
	}{
		{"importing", withDV, &dataVolumesState{Waiting: []string{"DataVolume dv is ImportInProgress"}, Printable: v1alpha1.PrintableStatusProvisioning},
			v1alpha1.PrintableStatusProvisioning, metav1.ConditionFalse, ReasonNotAllDVsReady},
		{"failed", withDV, &dataVolumesState{Failure: failed, Printable: v1alpha1.PrintableStatusDataVolumeNotReady},
			v1alpha1.PrintableStatusDataVolumeNotReady, metav1.ConditionFalse, ReasonNotAllDVsReady},
		{"succeeded", withDV, &dataVolumesState{Ready: true, Printable: v1alpha1.PrintableStatusProvisioning},
			v1alpha1.PrintableStatusStopped, metav1.ConditionTrue, ReasonAllDVsReady},
		{"not looked at", withDV, nil, v1alpha1.PrintableStatusStopped, "", ""},
		{"no DataVolumes", statusVM(), nil, v1alpha1.PrintableStatusStopped, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := computeStatus(statusInput{VM: tc.vm, DataVolumes: tc.dvs, Now: time.Now()})
			if st.PrintableStatus != tc.printable {
				t.Errorf("printableStatus %s, want %s", st.PrintableStatus, tc.printable)
			}
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.VirtualMachineDataVolumesReady)
			switch {
			case tc.cond == "" && c != nil:
				t.Errorf("DataVolumesReady %+v, want none", c)
			case tc.cond != "" && (c == nil || c.Status != tc.cond || c.Reason != tc.reason):
				t.Errorf("DataVolumesReady %+v, want %s %s", c, tc.cond, tc.reason)
			}
			if tc.dvs != nil && tc.dvs.Failure != nil && (c == nil || c.Message != tc.dvs.Failure.Message) {
				t.Errorf("DataVolumesReady %+v, want the failure's message", c)
			}
		})
	}
}
