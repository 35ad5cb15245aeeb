package vm

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// Action is what the reconciler does to a VirtualMachine's instance in one pass.
type Action string

// Actions.
const (
	ActionNone   Action = "None"
	ActionCreate Action = "Create"
	ActionDelete Action = "Delete"
)

// Decision reasons: why the run strategy and the pending requests lead to an action. They appear in
// events and logs.
const (
	// ReasonStartRequested: a Start request creates an instance (or deletes an ended one first).
	ReasonStartRequested = "StartRequested"
	// ReasonStopRequested: a Stop request deletes the instance.
	ReasonStopRequested = "StopRequested"
	// ReasonStartRefused: a Start request under runStrategy Halted is dropped, as KubeVirt does.
	ReasonStartRefused = "StartRequestRefused"
	// ReasonRunStrategyStart: the run strategy wants an instance and there is none.
	ReasonRunStrategyStart = "RunStrategyStart"
	// ReasonRunStrategyHalted: runStrategy Halted deletes the instance.
	ReasonRunStrategyHalted = "RunStrategyHalted"
	// ReasonVMIEnded: under Always an ended instance (guest shutdown or crash) is deleted to be
	// replaced.
	ReasonVMIEnded = "VMIEnded"
	// ReasonVMIFailed: under RerunOnFailure a failed instance is restarted through a Start request.
	ReasonVMIFailed = "VMIFailed"
	// ReasonCrashLoopBackOff: a start waits for the crash-loop back-off to expire.
	ReasonCrashLoopBackOff = "CrashLoopBackOff"
	// ReasonWaitingForDeletion: a start waits for the previous instance to be gone.
	ReasonWaitingForDeletion = "WaitingForVMIDeletion"
	// ReasonStoppedByRequest: runStrategy Always, held down by a Stop request until a Start.
	ReasonStoppedByRequest = "StoppedByRequest"
	// ReasonInSync: nothing to do.
	ReasonInSync = "InSync"
)

// Note is an event the decision asks the reconciler to record once the decision is applied.
type Note struct {
	Type    string // corev1.EventTypeNormal or corev1.EventTypeWarning
	Reason  string
	Message string
}

// decisionInput is everything the run-strategy decision depends on. It is read from the
// VirtualMachine, its instance (from the cache) and the clock.
type decisionInput struct {
	// Strategy is the run strategy the spec asks for (see runStrategy).
	Strategy v1alpha1.RunStrategy
	// Entered is status.runStrategy: the strategy whose entry has been carried out. Once and
	// RerunOnFailure create an instance when they are entered (first start) and never afterwards on
	// their own; comparing Entered with Strategy tells a first start from a stay-down.
	Entered v1alpha1.RunStrategy
	// Held is true when a Stop request holds a runStrategy Always VM down (condition
	// StoppedByRequest).
	Held bool
	// Requests are status.stateChangeRequests, oldest first.
	Requests []v1alpha1.VirtualMachineStateChangeRequest
	// VMI is the VM's instance, nil when there is none.
	VMI *v1alpha1.VirtualMachineInstance
	// StartFailure is the crash-loop record, already updated for VMI (see nextStartFailure).
	StartFailure *v1alpha1.VirtualMachineStartFailure
	Now          time.Time
}

// Decision is the outcome of decide. Requests, Held and RunStrategy describe the status once Action
// has succeeded; when the action fails the reconciler keeps the previous ones, so that a request is
// consumed only once it has been acted on. Every decision is idempotent given the observed state:
// acting on a stale cache at worst repeats a create (AlreadyExists) or a delete (NotFound).
type Decision struct {
	Action  Action
	Reason  string
	Message string
	// Requests are the state change requests still pending.
	Requests []v1alpha1.VirtualMachineStateChangeRequest
	// Held is the new value of the StoppedByRequest hold.
	Held bool
	// RunStrategy is the value for status.runStrategy.
	RunStrategy v1alpha1.RunStrategy
	// BackingOff is true when a start waits for the crash-loop back-off; RequeueAfter says how long.
	BackingOff   bool
	RequeueAfter time.Duration
	// Notes are events to record.
	Notes []Note
	// GracePeriodSeconds overrides the instance's grace period for a requested stop.
	GracePeriodSeconds *int64
	// StartPaused makes the instance being created start paused (a Start request's data).
	StartPaused bool
}

// vmiEnded is true for an instance whose guest is gone for good (Succeeded or Failed).
func vmiEnded(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi != nil && (vmi.Status.Phase == v1alpha1.Succeeded || vmi.Status.Phase == v1alpha1.Failed)
}

func vmiDeleting(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi != nil && vmi.DeletionTimestamp != nil
}

// vmiActive is an instance that is neither ended nor being deleted: it runs or is on its way.
func vmiActive(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi != nil && !vmiDeleting(vmi) && !vmiEnded(vmi)
}

// decide applies KubeVirt's run-strategy semantics to one observed state. Pending requests come
// first, oldest first; then the run strategy:
//
//   - Always keeps an instance: an ended one (guest shutdown or crash) is deleted and replaced. A Stop
//     request deletes the instance and holds the VM down (condition StoppedByRequest) until a Start
//     request or a change of run strategy; KubeVirt gets the same effect by switching the spec to
//     Halted, which qvirt's controller does not do because it does not write the spec.
//   - RerunOnFailure creates an instance when entered; a failed instance is deleted and replaced
//     (through a Start request, as KubeVirt does); a guest shutdown leaves the Succeeded instance in
//     place and the VM Stopped until a Start request.
//   - Once creates an instance when entered and never replaces it once it has ended or is gone.
//   - Manual changes only on requests.
//   - Halted deletes any instance and refuses Start requests (Warning event).
//
// Start and creation wait for the crash-loop back-off (status.startFailure) whatever the strategy.
// A restart is [Stop{uid}, Start]: the Stop deletes that instance, the Start creates the next one
// once the old one is gone.
func decide(in decisionInput) Decision {
	d := Decision{
		Action:      ActionNone,
		Reason:      ReasonInSync,
		Requests:    slices.Clone(in.Requests),
		Held:        in.Held && in.Strategy == v1alpha1.RunStrategyAlways && in.Entered == v1alpha1.RunStrategyAlways,
		RunStrategy: in.Entered,
	}
	vmi := in.VMI
	entering := in.Entered != in.Strategy

	// finish fills in the run strategy to echo. Always, Manual and Halted are entered at once. Once
	// and RerunOnFailure are entered when their first start is done: an instance is being created,
	// or one exists that is not on its way out to make room for the first start (a Stop request
	// acting on it also counts, so that the stopped VM stays down).
	finish := func(d Decision) Decision {
		switch in.Strategy {
		case v1alpha1.RunStrategyOnce, v1alpha1.RunStrategyRerunOnFailure:
			replacing := vmiEnded(vmi) && d.Action == ActionDelete && d.Reason != ReasonStopRequested
			if !entering || d.Action == ActionCreate || (vmi != nil && !vmiDeleting(vmi) && !replacing) {
				d.RunStrategy = in.Strategy
			}
		default:
			d.RunStrategy = in.Strategy
		}
		return d
	}
	create := func(reason, msg string) Decision {
		if left := backoffLeft(in.StartFailure, in.Now); left > 0 {
			d.BackingOff = true
			d.RequeueAfter = left
			d.Reason = ReasonCrashLoopBackOff
			d.Message = fmt.Sprintf("%s; waiting %s for the crash-loop back-off (%d failed starts in a row)",
				msg, left.Round(time.Second), in.StartFailure.ConsecutiveFailCount)
			return d
		}
		d.Action, d.Reason, d.Message = ActionCreate, reason, msg
		return d
	}

	for len(d.Requests) > 0 {
		req := d.Requests[0]
		switch req.Action {
		case v1alpha1.StopRequest:
			d.Requests = d.Requests[1:]
			if req.UID != nil && vmi != nil && vmi.UID != *req.UID {
				continue // meant for an instance that has been replaced since
			}
			if in.Strategy == v1alpha1.RunStrategyAlways {
				d.Held = true
			}
			if vmi != nil && !vmiDeleting(vmi) {
				d.GracePeriodSeconds = stopGracePeriod(req, &d)
				d.Action, d.Reason = ActionDelete, ReasonStopRequested
				d.Message = fmt.Sprintf("stop requested: deleting VMI %s", vmi.Name)
				return finish(d)
			}
		case v1alpha1.StartRequest:
			if in.Strategy == v1alpha1.RunStrategyHalted {
				d.Requests = d.Requests[1:]
				d.Notes = append(d.Notes, Note{corev1.EventTypeWarning, ReasonStartRefused,
					"start request refused: runStrategy is Halted; change the runStrategy to start this VM"})
				continue
			}
			d.Held = false
			switch {
			case vmiActive(vmi):
				d.Requests = d.Requests[1:]
				continue // started already
			case vmiDeleting(vmi):
				d.Reason = ReasonWaitingForDeletion
				d.Message = fmt.Sprintf("start requested: waiting for VMI %s to be deleted", vmi.Name)
				return finish(d)
			case vmi != nil:
				d.Action, d.Reason = ActionDelete, ReasonStartRequested
				d.Message = fmt.Sprintf("start requested: deleting VMI %s, which is %s, to start a new one", vmi.Name, vmi.Status.Phase)
				return finish(d)
			}
			rest := d.Requests[1:]
			d = create(ReasonStartRequested, "start requested")
			if d.Action == ActionCreate {
				d.Requests = rest
				d.StartPaused = startPaused(req, &d)
			}
			return finish(d)
		default:
			d.Requests = d.Requests[1:] // unknown action: the CRD's enum keeps these out
		}
	}

	switch in.Strategy {
	case v1alpha1.RunStrategyHalted:
		if vmi != nil && !vmiDeleting(vmi) {
			d.Action, d.Reason = ActionDelete, ReasonRunStrategyHalted
			d.Message = fmt.Sprintf("runStrategy Halted: deleting VMI %s", vmi.Name)
		}
	case v1alpha1.RunStrategyAlways:
		switch {
		case d.Held:
			if vmi == nil || vmiEnded(vmi) {
				d.Reason, d.Message = ReasonStoppedByRequest, "stopped by a stop request; a start request starts it again"
			}
		case vmi == nil:
			d = create(ReasonRunStrategyStart, "runStrategy Always: creating VMI")
		case vmiEnded(vmi) && !vmiDeleting(vmi):
			d.Action, d.Reason = ActionDelete, ReasonVMIEnded
			d.Message = fmt.Sprintf("runStrategy Always: VMI %s is %s; deleting it to start a new one", vmi.Name, vmi.Status.Phase)
		}
	case v1alpha1.RunStrategyRerunOnFailure, v1alpha1.RunStrategyOnce:
		switch {
		case vmiDeleting(vmi):
			if entering {
				d.Reason = ReasonWaitingForDeletion
				d.Message = fmt.Sprintf("runStrategy %s: waiting for VMI %s to be deleted before the first start", in.Strategy, vmi.Name)
			}
		case entering && vmi == nil:
			d = create(ReasonRunStrategyStart, fmt.Sprintf("runStrategy %s: first start", in.Strategy))
		case entering && vmiEnded(vmi):
			d.Action, d.Reason = ActionDelete, ReasonRunStrategyStart
			d.Message = fmt.Sprintf("runStrategy %s: deleting VMI %s, which is %s, before the first start", in.Strategy, vmi.Name, vmi.Status.Phase)
		case in.Strategy == v1alpha1.RunStrategyRerunOnFailure && vmi != nil && vmi.Status.Phase == v1alpha1.Failed:
			d.Requests = append(d.Requests, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
			d.Reason = ReasonVMIFailed
			d.Message = fmt.Sprintf("runStrategy RerunOnFailure: VMI %s failed; restarting it", vmi.Name)
			d.Notes = append(d.Notes, Note{corev1.EventTypeNormal, ReasonVMIFailed, d.Message})
		}
	case v1alpha1.RunStrategyManual:
	}
	return finish(d)
}

// stopGracePeriod is a Stop request's grace period override, nil when it has none. One that is not
// a whole number of seconds >= 0 is reported in a Warning and ignored (the spec's applies).
func stopGracePeriod(req v1alpha1.VirtualMachineStateChangeRequest, d *Decision) *int64 {
	raw, ok := req.Data[v1alpha1.StopGracePeriodDataKey]
	if !ok {
		return nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 0 {
		d.Notes = append(d.Notes, Note{corev1.EventTypeWarning, ReasonStopRequested, fmt.Sprintf(
			"stop request data %s=%q is not a whole number of seconds >= 0: using the instance's terminationGracePeriodSeconds",
			v1alpha1.StopGracePeriodDataKey, raw)})
		return nil
	}
	return &n
}

// startPaused reads a Start request's paused flag. A value other than "true" or "false" is
// reported in a Warning and the instance starts running.
func startPaused(req v1alpha1.VirtualMachineStateChangeRequest, d *Decision) bool {
	switch raw, ok := req.Data[v1alpha1.StartPausedDataKey]; {
	case !ok || raw == "false":
		return false
	case raw == "true":
		return true
	default:
		d.Notes = append(d.Notes, Note{corev1.EventTypeWarning, ReasonStartRequested, fmt.Sprintf(
			"start request data %s=%q is neither \"true\" nor \"false\": starting the instance running",
			v1alpha1.StartPausedDataKey, raw)})
		return false
	}
}
