package vm

import (
	"regexp"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/patch"
)

// ConditionStoppedByRequest is True while a Stop request holds a runStrategy Always VM down; a
// Start request or a change of run strategy clears it. It is the controller's memory of the stop
// (KubeVirt switches the spec to Halted instead).
const ConditionStoppedByRequest = "StoppedByRequest"

// Condition reasons.
const (
	ReasonVMINotExists   = "VMINotExists"
	ReasonVMIDeleting    = "VMIDeleting"
	ReasonVMINotReady    = "VMINotReady"
	ReasonVMIReady       = "VMIReady"
	ReasonTemplateChange = "TemplateChanged"
	ReasonFailedCreate   = "FailedCreate"
	ReasonFailedDelete   = "FailedDelete"
	ReasonVMIConflict    = "VMIConflict"
	ReasonStopRequest    = "StopRequest"
)

// statusInput is what the VirtualMachine's status is computed from.
type statusInput struct {
	VM *v1alpha1.VirtualMachine
	// VMI is the instance as it stands after this pass's action: nil when there is none, the new
	// object after a create, marked deleting after a delete.
	VMI      *v1alpha1.VirtualMachineInstance
	Decision Decision
	// StartFailure is the crash-loop record to store.
	StartFailure *v1alpha1.VirtualMachineStartFailure
	// Failure, when set, is the reason and message of the Failure condition (a failed create or
	// delete, a VMI of the same name owned by someone else).
	Failure *Failure
	// Desired is the spec the VM's next instance would get (its template expanded with its
	// instancetype and preference); desiredVMISpec(VM) when nil.
	Desired *v1alpha1.VirtualMachineInstanceSpec
	// DataVolumes is what this pass found of the VM's DataVolumes when it tried to start the VM
	// (nil otherwise: the DataVolumesReady condition then stays as it was).
	DataVolumes *dataVolumesState
	Now         time.Time
}

// Failure is a failed action, reported in the Failure condition.
type Failure struct {
	Reason  string
	Message string
}

// computeStatus is the VirtualMachine's status for one pass. Conditions keep their transition
// times while their status does not change.
func computeStatus(in statusInput) v1alpha1.VirtualMachineStatus {
	vm, vmi, d := in.VM, in.VMI, in.Decision
	st := *vm.Status.DeepCopy()
	st.ObservedGeneration = vm.Generation
	st.RunStrategy = d.RunStrategy
	st.StateChangeRequests = d.Requests
	if len(st.StateChangeRequests) == 0 {
		st.StateChangeRequests = nil
	}
	st.StartFailure = in.StartFailure
	st.Created = vmi != nil
	st.Ready = vmiActive(vmi) && meta.IsStatusConditionTrue(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceReady)
	st.PrintableStatus = printableStatus(vm, vmi, d.BackingOff)
	if dv := in.DataVolumes; dv != nil && !dv.Ready && (vmi == nil || vmiEnded(vmi)) && st.PrintableStatus == v1alpha1.PrintableStatusStopped {
		st.PrintableStatus = dv.Printable
	}

	set := func(c metav1.Condition) {
		c.LastTransitionTime = metav1.NewTime(in.Now)
		patch.SetCondition(&st.Conditions, vm, c)
	}
	set(readyCondition(vmi))

	if c := mirroredCondition(vmi, v1alpha1.VirtualMachineInstancePaused); c != nil && vmiActive(vmi) {
		set(*c)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.VirtualMachinePaused)
	}

	// Why the instance cannot be brought to its spec (a missing cloud-init Secret, a launcher's
	// refusal), as long as it cannot.
	if c := mirroredCondition(vmi, v1alpha1.VirtualMachineInstanceSynchronized); c != nil && c.Status == metav1.ConditionFalse && vmiActive(vmi) {
		set(*c)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
	}

	if in.Failure != nil {
		set(metav1.Condition{Type: v1alpha1.VirtualMachineFailure, Status: metav1.ConditionTrue,
			Reason: in.Failure.Reason, Message: in.Failure.Message})
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.VirtualMachineFailure)
	}

	desired := in.Desired
	if desired == nil {
		d := desiredVMISpec(vm)
		desired = &d
	}
	switch {
	case in.DataVolumes != nil:
		set(in.DataVolumes.condition())
	case !hasDataVolumes(vm, desired):
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.VirtualMachineDataVolumesReady)
	}
	if vmiActive(vmi) && (!equality.Semantic.DeepEqual(coldSpec(*desired), coldSpec(vmi.Spec)) || fewerSockets(desired, &vmi.Spec) || lessMemory(desired, &vmi.Spec)) {
		set(metav1.Condition{Type: v1alpha1.VirtualMachineRestartRequired, Status: metav1.ConditionTrue,
			Reason:  ReasonTemplateChange,
			Message: "the VM template changed since VMI " + vmi.Name + " was created; restart the VM to apply it"})
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.VirtualMachineRestartRequired)
	}

	if d.Held {
		set(metav1.Condition{Type: ConditionStoppedByRequest, Status: metav1.ConditionTrue, Reason: ReasonStopRequest,
			Message: "a stop request stopped this VM; runStrategy Always resumes after a start request"})
	} else {
		meta.RemoveStatusCondition(&st.Conditions, ConditionStoppedByRequest)
	}
	if len(st.Conditions) == 0 {
		st.Conditions = nil
	}
	return st
}

// coldSpec is a spec with the defaults admission gives an instance (the instance's were recorded
// when it was created, the template's are not) and without its disks, volumes, interfaces and
// networks, nor its sockets when it has maxSockets, nor its guest memory when it has maxGuest:
// those can be hot-plugged into a running
// instance, so a difference there needs no restart. The start strategy is left out too: it only says how the instance started (a `start
// --paused` sets it on the instance alone).
func coldSpec(spec v1alpha1.VirtualMachineInstanceSpec) v1alpha1.VirtualMachineInstanceSpec {
	c := *spec.DeepCopy()
	v1alpha1.SetDefaults(&c)
	c.Volumes, c.Domain.Devices.Disks = nil, nil
	c.Networks, c.Domain.Devices.Interfaces = nil, nil
	c.StartStrategy = nil
	if cpu := c.Domain.CPU; cpu != nil && cpu.MaxSockets != 0 {
		// More sockets, up to maxSockets, are plugged into the running instance
		// (liveUpdateSockets); fewer need a restart (fewerSockets).
		cpu.Sockets = 0
	}
	if m := c.Domain.Memory; m != nil && m.MaxGuest != nil {
		// The same for memory up to maxGuest (liveUpdateMemory); less needs a restart (lessMemory).
		m.Guest = nil
	}
	return c
}

// lessMemory says whether the template has less guest memory than the running instance under
// memory hotplug: memory is not unplugged, so that takes a restart.
func lessMemory(desired, running *v1alpha1.VirtualMachineInstanceSpec) bool {
	d, r := v1alpha1.GuestMemory(&desired.Domain), v1alpha1.GuestMemory(&running.Domain)
	return running.Domain.Memory != nil && running.Domain.Memory.MaxGuest != nil && d != nil && r != nil && d.Cmp(*r) < 0
}

// fewerSockets says whether the template has fewer sockets than the running instance: vCPUs are
// not unplugged, so that takes a restart.
func fewerSockets(desired, running *v1alpha1.VirtualMachineInstanceSpec) bool {
	d, r := desired.Domain.CPU, running.Domain.CPU
	return d != nil && r != nil && r.MaxSockets != 0 && max(d.Sockets, 1) < max(r.Sockets, 1)
}

// held reads the StoppedByRequest hold from the status.
func held(vm *v1alpha1.VirtualMachine) bool {
	return meta.IsStatusConditionTrue(vm.Status.Conditions, ConditionStoppedByRequest)
}

// printableStatus is the one-word summary, in KubeVirt's order of precedence.
func printableStatus(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, backingOff bool) v1alpha1.PrintableStatus {
	switch {
	case vm.DeletionTimestamp != nil:
		return v1alpha1.PrintableStatusTerminating
	case vmiDeleting(vmi):
		return v1alpha1.PrintableStatusStopping
	case backingOff:
		return v1alpha1.PrintableStatusCrashLoopBackOff
	case vmi == nil || vmiEnded(vmi):
		return v1alpha1.PrintableStatusStopped
	case migrating(vmi):
		return v1alpha1.PrintableStatusMigrating
	case meta.IsStatusConditionTrue(vmi.Status.Conditions, v1alpha1.VirtualMachineInstancePaused):
		return v1alpha1.PrintableStatusPaused
	case vmi.Status.Phase == v1alpha1.Running:
		return v1alpha1.PrintableStatusRunning
	case vmi.Status.Phase == v1alpha1.Unknown:
		return v1alpha1.PrintableStatusUnknown
	case unschedulable(vmi):
		return v1alpha1.PrintableStatusUnschedulable
	case imagePull(vmi, v1alpha1.ReasonErrImagePull):
		return v1alpha1.PrintableStatusErrImagePull
	case imagePull(vmi, v1alpha1.ReasonImagePullBackOff):
		return v1alpha1.PrintableStatusImagePullBackOff
	default: // "", Pending, Scheduling, Scheduled
		return v1alpha1.PrintableStatusStarting
	}
}

func migrating(vmi *v1alpha1.VirtualMachineInstance) bool {
	ms := vmi.Status.MigrationState
	return ms != nil && !ms.Completed && !ms.Failed
}

// imagePull says whether the instance's launcher pod cannot pull an image for reason (the VMI
// reconciler's Synchronized condition), as KubeVirt decides ErrImagePull and ImagePullBackOff.
func imagePull(vmi *v1alpha1.VirtualMachineInstance, reason string) bool {
	c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstanceSynchronized)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason
}

func unschedulable(vmi *v1alpha1.VirtualMachineInstance) bool {
	if vmi.Status.Phase != v1alpha1.Scheduling {
		return false
	}
	c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VirtualMachineInstancePodScheduled)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonUnschedulable
}

// readyCondition mirrors the instance's Ready condition; without an instance, or while it goes away,
// the VM is not ready.
func readyCondition(vmi *v1alpha1.VirtualMachineInstance) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.VirtualMachineReady, Status: metav1.ConditionFalse}
	switch {
	case vmi == nil:
		c.Reason, c.Message = ReasonVMINotExists, "no VMI exists"
	case vmiDeleting(vmi):
		c.Reason, c.Message = ReasonVMIDeleting, "VMI "+vmi.Name+" is being deleted"
	default:
		if m := mirroredCondition(vmi, v1alpha1.VirtualMachineInstanceReady); m != nil && !vmiEnded(vmi) {
			return *m
		}
		c.Reason, c.Message = ReasonVMINotReady, "VMI "+vmi.Name+" is "+string(vmi.Status.Phase)
	}
	return c
}

var reasonPattern = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// mirroredCondition copies condition typ of the instance for the VM, or nil when it has none. A
// reason the CRD would refuse is replaced.
func mirroredCondition(vmi *v1alpha1.VirtualMachineInstance, typ string) *metav1.Condition {
	if vmi == nil {
		return nil
	}
	src := meta.FindStatusCondition(vmi.Status.Conditions, typ)
	if src == nil {
		return nil
	}
	c := metav1.Condition{Type: typ, Status: src.Status, Reason: src.Reason, Message: src.Message}
	if !reasonPattern.MatchString(c.Reason) {
		c.Reason = "VMI" + typ + string(src.Status)
	}
	return &c
}
