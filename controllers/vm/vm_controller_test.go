package vm

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/config"
	"github.com/qvirt/qvirt/test/envtest"
)

var cp *envtest.ControlPlane

func TestMain(m *testing.M) { envtest.Main(m, &cp) }

// testBackoffBase is the crash-loop back-off in these tests: 2 s after the first failed start, 4 s
// after the second.
const testBackoffBase = 2 * time.Second

// TestReconciler runs the VM reconciler alone against a real API server. Neither the VMI reconciler
// nor the node agent runs: the tests play them by writing VMI status phases, and play qvirtctl by
// appending status.stateChangeRequests. Cases run concurrently, each in its own namespace.
func TestReconciler(t *testing.T) {
	if os.Getenv("QVIRT_TEST_LOG") != "" {
		ctrl.SetLogger(funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 1}))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	opts := cp.ManagerOptions()
	opts.Controller.MaxConcurrentReconciles = 8
	// As qvirt-controller's cache (controllers.CacheOptions) holds them: only qvirt's revisions.
	opts.Cache.ByObject = map[client.Object]cache.ByObject{&appsv1.ControllerRevision{}: {Label: RevisionSelector()}}
	mgr, err := ctrl.NewManager(cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1019 the reconcilers take a record.EventRecorder, as qvirt-controller wires them
	recorder := mgr.GetEventRecorderFor("qvirt-vm")
	r := &Reconciler{
		Client:      mgr.GetClient(),
		Scheme:      mgr.GetScheme(),
		Recorder:    recorder,
		Config:      config.NewStore(config.Default()),
		APIReader:   mgr.GetAPIReader(),
		BackoffBase: testBackoffBase,
		BackoffMax:  30 * time.Second,
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	cases := matrixCases()
	cases = append(cases,
		namedCase{"RestartRequired", testRestartRequired},
		namedCase{"LiveUpdateSockets", testLiveUpdateSockets},
		namedCase{"LiveUpdateMemory", testLiveUpdateMemory},
		namedCase{"StartPaused", testStartPaused},
		namedCase{"CrashLoopBackOff", testCrashLoopBackOff},
		namedCase{"DeleteVM", testDeleteVM},
		namedCase{"ForeignVMI", testForeignVMI},
	)
	cases = append(cases, instancetypeCases()...)
	if only := os.Getenv("QVIRT_TEST_CASE"); only != "" {
		cases = slices.DeleteFunc(cases, func(c namedCase) bool { return !strings.Contains(c.name, only) })
	}
	// Run every case at once (t.Parallel would cap them at GOMAXPROCS); each returns its error and
	// the results are reported per case below, from the test goroutine.
	errs := make([]error, len(cases))
	var wg sync.WaitGroup
	for i, c := range cases {
		wg.Go(func() {
			cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
			defer ccancel()
			h, err := newHarness(cctx)
			if err == nil {
				err = c.run(h)
			}
			if err != nil {
				errs[i] = fmt.Errorf("namespace %s: %w", h.ns, err)
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

type namedCase struct {
	name string
	run  func(h *harness) error
}

// outcome is what a matrix case expects the API to show after the event.
type outcome string

const (
	recreated outcome = "recreated"  // a VMI with a new UID runs
	keptEnded outcome = "kept-ended" // the ended VMI stays; the VM is Stopped
	deleted   outcome = "deleted"    // no VMI, and none comes back; the VM is Stopped
	noVMI     outcome = "no-VMI"     // Halted: no VMI at any point; start requests refused
)

type event string

const (
	guestShutdown  event = "guest-shutdown"
	crash          event = "crash"
	stopRequest    event = "stop"
	startRequest   event = "start-after-shutdown"
	restartRequest event = "restart"
)

func matrixCases() []namedCase {
	events := []event{guestShutdown, crash, stopRequest, startRequest, restartRequest}
	want := map[v1alpha1.RunStrategy][]outcome{
		v1alpha1.RunStrategyAlways:         {recreated, recreated, deleted, recreated, recreated},
		v1alpha1.RunStrategyRerunOnFailure: {keptEnded, recreated, deleted, recreated, recreated},
		v1alpha1.RunStrategyOnce:           {keptEnded, keptEnded, deleted, recreated, recreated},
		v1alpha1.RunStrategyManual:         {keptEnded, keptEnded, deleted, recreated, recreated},
		v1alpha1.RunStrategyHalted:         {noVMI, noVMI, noVMI, noVMI, noVMI},
	}
	var cases []namedCase
	for _, s := range []v1alpha1.RunStrategy{v1alpha1.RunStrategyAlways, v1alpha1.RunStrategyRerunOnFailure,
		v1alpha1.RunStrategyOnce, v1alpha1.RunStrategyManual, v1alpha1.RunStrategyHalted} {
		for i, ev := range events {
			cases = append(cases, namedCase{
				name: fmt.Sprintf("matrix/%s/%s", s, ev),
				run:  func(h *harness) error { return runMatrixCase(h, s, ev, want[s][i]) },
			})
		}
	}
	return cases
}

// runMatrixCase brings a VM with strategy s to its steady state (a running VMI, or none for
// Halted), applies ev and checks the outcome.
func runMatrixCase(h *harness, s v1alpha1.RunStrategy, ev event, want outcome) error {
	const name = "vm"
	if err := h.createVM(name, s); err != nil {
		return err
	}
	if s == v1alpha1.RunStrategyHalted {
		return checkHalted(h, name, ev)
	}
	if s == v1alpha1.RunStrategyManual {
		if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}); err != nil {
			return err
		}
	}
	vmi, err := h.waitVMI(name, "the first VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	uid0 := vmi.UID
	if err := h.setPhase(name, uid0, v1alpha1.Running); err != nil {
		return err
	}
	if err := h.waitVM(name, "printableStatus Running", func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && vm.Status.Ready && len(vm.Status.StateChangeRequests) == 0
	}); err != nil {
		return err
	}

	switch ev {
	case guestShutdown:
		err = h.setPhase(name, uid0, v1alpha1.Succeeded)
	case crash:
		err = h.setPhase(name, uid0, v1alpha1.Failed)
	case stopRequest:
		err = h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &uid0})
	case restartRequest:
		err = h.request(name,
			v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &uid0},
			v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
	case startRequest:
		if err = h.setPhase(name, uid0, v1alpha1.Succeeded); err != nil {
			return err
		}
		// Let the shutdown settle: Always replaces the VMI, the others leave the VM Stopped.
		if err = h.waitVM(name, "the shutdown to settle", func(vm *v1alpha1.VirtualMachine) bool {
			if s == v1alpha1.RunStrategyAlways {
				return vm.Status.Created && vm.Status.PrintableStatus == v1alpha1.PrintableStatusStarting
			}
			return vm.Status.PrintableStatus == v1alpha1.PrintableStatusStopped
		}); err != nil {
			return err
		}
		err = h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
	}
	if err != nil {
		return err
	}

	switch want {
	case recreated:
		if _, err := h.waitVMI(name, "a new VMI", func(vmi *v1alpha1.VirtualMachineInstance) bool {
			return vmi.UID != uid0 && vmiActive(vmi)
		}); err != nil {
			return err
		}
		return h.waitVM(name, "requests consumed and Starting", func(vm *v1alpha1.VirtualMachine) bool {
			return len(vm.Status.StateChangeRequests) == 0 && vm.Status.Created &&
				vm.Status.PrintableStatus == v1alpha1.PrintableStatusStarting
		})
	case keptEnded:
		if err := h.waitVM(name, "Stopped", stoppedWith(true)); err != nil {
			return err
		}
		return h.holds(2*time.Second, "the ended VMI stays", func() error {
			vmi, err := h.getVMI(name)
			switch {
			case err != nil:
				return err
			case vmi.UID != uid0 || !vmiEnded(vmi) || vmi.DeletionTimestamp != nil:
				return fmt.Errorf("VMI %s phase %s deleting %v, want %s ended", vmi.UID, vmi.Status.Phase, vmi.DeletionTimestamp != nil, uid0)
			}
			return h.checkVM(name, stoppedWith(true))
		})
	case deleted:
		if err := h.waitGone(name); err != nil {
			return err
		}
		if err := h.waitVM(name, "Stopped without a VMI", stoppedWith(false)); err != nil {
			return err
		}
		if s == v1alpha1.RunStrategyAlways {
			if err := h.checkVM(name, func(vm *v1alpha1.VirtualMachine) bool {
				return meta.IsStatusConditionTrue(vm.Status.Conditions, ConditionStoppedByRequest)
			}); err != nil {
				return fmt.Errorf("StoppedByRequest: %w", err)
			}
		}
		return h.holds(2*time.Second, "no VMI comes back", func() error {
			if _, err := h.getVMI(name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("VMI present (err %v)", err)
			}
			return h.checkVM(name, stoppedWith(false))
		})
	}
	return fmt.Errorf("unexpected outcome %s", want)
}

// checkHalted: a Halted VM never gets a VMI; a start (alone or in a restart) is refused with a
// Warning event and consumed.
func checkHalted(h *harness, name string, ev event) error {
	if err := h.waitVM(name, "Stopped", stoppedWith(false)); err != nil {
		return err
	}
	refused := false
	switch ev {
	case stopRequest:
		if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest}); err != nil {
			return err
		}
	case startRequest:
		refused = true
		if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}); err != nil {
			return err
		}
	case restartRequest:
		refused = true
		if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest},
			v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}); err != nil {
			return err
		}
	}
	if err := h.waitVM(name, "requests consumed", func(vm *v1alpha1.VirtualMachine) bool {
		return len(vm.Status.StateChangeRequests) == 0
	}); err != nil {
		return err
	}
	if refused {
		if err := h.waitEvent(ReasonStartRefused, corev1.EventTypeWarning); err != nil {
			return err
		}
	}
	return h.holds(time.Second, "no VMI", func() error {
		if _, err := h.getVMI(name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VMI present (err %v)", err)
		}
		return h.checkVM(name, stoppedWith(false))
	})
}

func stoppedWith(created bool) func(vm *v1alpha1.VirtualMachine) bool {
	return func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.PrintableStatus == v1alpha1.PrintableStatusStopped && vm.Status.Created == created &&
			!vm.Status.Ready && len(vm.Status.StateChangeRequests) == 0
	}
}

// testRestartRequired: changing the template under a running VMI sets RestartRequired; a restart
// creates the VMI from the new template and clears it.
func testRestartRequired(h *harness) error {
	const name = "vm"
	if err := h.createVM(name, v1alpha1.RunStrategyAlways); err != nil {
		return err
	}
	vmi, err := h.waitVMI(name, "the VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	if err := h.setPhase(name, vmi.UID, v1alpha1.Running); err != nil {
		return err
	}
	if err := h.waitVM(name, "Running without RestartRequired", func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.PrintableStatus == v1alpha1.PrintableStatusRunning &&
			meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineRestartRequired) == nil
	}); err != nil {
		return err
	}
	if err := h.updateVM(name, func(vm *v1alpha1.VirtualMachine) {
		vm.Spec.Template.Spec.Domain.Memory.Guest = ptr.To(resource.MustParse("128Mi"))
	}); err != nil {
		return err
	}
	if err := h.waitVM(name, "RestartRequired=True", func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineRestartRequired)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == ReasonTemplateChange &&
			vm.Status.ObservedGeneration == vm.Generation
	}); err != nil {
		return err
	}
	if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &vmi.UID},
		v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}); err != nil {
		return err
	}
	next, err := h.waitVMI(name, "the restarted VMI", func(v *v1alpha1.VirtualMachineInstance) bool { return v.UID != vmi.UID })
	if err != nil {
		return err
	}
	if got := next.Spec.Domain.Memory.Guest.String(); got != "128Mi" {
		return fmt.Errorf("restarted VMI has guest memory %s, want the new template's 128Mi", got)
	}
	return h.waitVM(name, "RestartRequired cleared", func(vm *v1alpha1.VirtualMachine) bool {
		return meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineRestartRequired) == nil &&
			len(vm.Status.StateChangeRequests) == 0
	})
}

// testLiveUpdateSockets: with maxSockets, more sockets in the template reach the running instance
// (CPU hotplug, KubeVirt's LiveUpdate) without RestartRequired; fewer sockets leave the instance as
// it is and require a restart.
func testLiveUpdateSockets(h *harness) error {
	sockets := func(n uint32) func(*v1alpha1.VirtualMachineInstanceSpec) {
		return func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.CPU.Sockets = n }
	}
	return liveUpdate(h, liveUpdateCase{
		room: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.CPU = &v1alpha1.CPU{Sockets: 1, Cores: 1, Threads: 1, MaxSockets: 4}
		},
		hasRoom: func(s *v1alpha1.VirtualMachineInstanceSpec) bool {
			return s.Domain.CPU != nil && s.Domain.CPU.MaxSockets == 4
		},
		value: func(s *v1alpha1.VirtualMachineInstanceSpec) string { return fmt.Sprint(s.Domain.CPU.Sockets) },
		up:    sockets(3), upValue: "3",
		down: sockets(2),
	})
}

// testLiveUpdateMemory: with maxGuest, more guest memory in the template reaches the running
// instance (memory hotplug, KubeVirt's LiveUpdate) without RestartRequired; less memory leaves the
// instance as it is and requires a restart.
func testLiveUpdateMemory(h *harness) error {
	guest := func(q string) func(*v1alpha1.VirtualMachineInstanceSpec) {
		return func(s *v1alpha1.VirtualMachineInstanceSpec) { s.Domain.Memory.Guest = ptr.To(resource.MustParse(q)) }
	}
	return liveUpdate(h, liveUpdateCase{
		room: func(s *v1alpha1.VirtualMachineInstanceSpec) {
			s.Domain.Memory = &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("1Gi")), MaxGuest: ptr.To(resource.MustParse("4Gi"))}
		},
		hasRoom: func(s *v1alpha1.VirtualMachineInstanceSpec) bool {
			return s.Domain.Memory != nil && s.Domain.Memory.MaxGuest != nil
		},
		value: func(s *v1alpha1.VirtualMachineInstanceSpec) string { return s.Domain.Memory.Guest.String() },
		up:    guest("3Gi"), upValue: "3Gi",
		down: guest("2Gi"),
	})
}

// liveUpdateCase is a hotplug field of KubeVirt's LiveUpdate: room gives the template hotplug room
// (hasRoom finds it on the instance), up raises the field to upValue (value reads it) and down
// lowers it below that.
type liveUpdateCase struct {
	room, up, down func(*v1alpha1.VirtualMachineInstanceSpec)
	hasRoom        func(*v1alpha1.VirtualMachineInstanceSpec) bool
	value          func(*v1alpha1.VirtualMachineInstanceSpec) string
	upValue        string
}

// liveUpdate: raising the field in the template reaches the running instance without
// RestartRequired; lowering it leaves the instance as it is and requires a restart.
func liveUpdate(h *harness, c liveUpdateCase) error {
	const name = "vm"
	if err := h.createVM(name, v1alpha1.RunStrategyAlways, func(vm *v1alpha1.VirtualMachine) { c.room(&vm.Spec.Template.Spec) }); err != nil {
		return err
	}
	vmi, err := h.waitVMI(name, "the VMI with hotplug room", func(v *v1alpha1.VirtualMachineInstance) bool { return c.hasRoom(&v.Spec) })
	if err != nil {
		return err
	}
	if err := h.setPhase(name, vmi.UID, v1alpha1.Running); err != nil {
		return err
	}
	restartRequired := func(vm *v1alpha1.VirtualMachine) bool {
		return meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineRestartRequired) != nil
	}
	if err := h.updateVM(name, func(vm *v1alpha1.VirtualMachine) { c.up(&vm.Spec.Template.Spec) }); err != nil {
		return err
	}
	if _, err := h.waitVMI(name, "the running VMI raised to "+c.upValue, func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID == vmi.UID && c.value(&v.Spec) == c.upValue
	}); err != nil {
		return err
	}
	if err := h.waitVM(name, "Running without RestartRequired", func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.ObservedGeneration == vm.Generation && vm.Status.PrintableStatus == v1alpha1.PrintableStatusRunning && !restartRequired(vm)
	}); err != nil {
		return err
	}
	if err := h.updateVM(name, func(vm *v1alpha1.VirtualMachine) { c.down(&vm.Spec.Template.Spec) }); err != nil {
		return err
	}
	if err := h.waitVM(name, "RestartRequired after lowering it", func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.ObservedGeneration == vm.Generation && restartRequired(vm)
	}); err != nil {
		return err
	}
	v, err := h.waitVMI(name, "the VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	if got := c.value(&v.Spec); got != c.upValue {
		return fmt.Errorf("the running VMI has %s after the template lowered it, want %s", got, c.upValue)
	}
	return nil
}

// testStartPaused: a Start request with paused data (`qvirtctl start --paused`) creates an instance
// with spec.startStrategy Paused, which does not count as a template change; the next plain Start
// creates a running one.
func testStartPaused(h *harness) error {
	const name = "vm"
	if err := h.createVM(name, v1alpha1.RunStrategyManual); err != nil {
		return err
	}
	if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest,
		Data: map[string]string{v1alpha1.StartPausedDataKey: "true"}}); err != nil {
		return err
	}
	vmi, err := h.waitVMI(name, "the VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	if s := vmi.Spec.StartStrategy; s == nil || *s != v1alpha1.StartStrategyPaused {
		return fmt.Errorf("VMI spec.startStrategy %v, want Paused", s)
	}
	if err := h.setPhase(name, vmi.UID, v1alpha1.Running); err != nil {
		return err
	}
	if err := h.waitVM(name, "Running", func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.PrintableStatus == v1alpha1.PrintableStatusRunning
	}); err != nil {
		return err
	}
	if err := h.holds(2*time.Second, "no RestartRequired for a paused start", func() error {
		return h.checkVM(name, func(vm *v1alpha1.VirtualMachine) bool {
			return meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineRestartRequired) == nil
		})
	}); err != nil {
		return err
	}
	if err := h.request(name, v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &vmi.UID},
		v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}); err != nil {
		return err
	}
	next, err := h.waitVMI(name, "the next VMI", func(v *v1alpha1.VirtualMachineInstance) bool { return v.UID != vmi.UID })
	if err != nil {
		return err
	}
	if next.Spec.StartStrategy != nil {
		return fmt.Errorf("VMI started without --paused has spec.startStrategy %s, want none", *next.Spec.StartStrategy)
	}
	return nil
}

// testCrashLoopBackOff: VMIs that fail before running back off 2 s, then 4 s; while waiting the VM
// shows CrashLoopBackOff and no VMI exists.
func testCrashLoopBackOff(h *harness) error {
	const name = "vm"
	if err := h.createVM(name, v1alpha1.RunStrategyAlways); err != nil {
		return err
	}
	var uid types.UID
	var retryAfter time.Time
	for n := 1; n <= 2; n++ {
		vmi, err := h.waitVMI(name, fmt.Sprintf("VMI #%d", n), func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.UID != uid && vmiActive(v)
		})
		if err != nil {
			return err
		}
		if n > 1 && vmi.CreationTimestamp.Time.Before(retryAfter) {
			return fmt.Errorf("VMI #%d created at %s, before the back-off ended at %s", n, vmi.CreationTimestamp, retryAfter)
		}
		uid = vmi.UID
		if err := h.setPhase(name, uid, v1alpha1.Failed); err != nil {
			return err
		}
		var vm *v1alpha1.VirtualMachine
		if err := h.waitVM(name, fmt.Sprintf("failure %d counted", n), func(v *v1alpha1.VirtualMachine) bool {
			vm = v
			sf := v.Status.StartFailure
			return sf != nil && sf.ConsecutiveFailCount == n && sf.LastFailedVMIUID == uid && sf.RetryAfterTimestamp != nil
		}); err != nil {
			return err
		}
		retryAfter = vm.Status.StartFailure.RetryAfterTimestamp.Time
		if n == 2 {
			// The first back-off may be over before a loaded test machine looks; the second is long
			// enough to watch.
			if err := h.waitVM(name, "CrashLoopBackOff", func(v *v1alpha1.VirtualMachine) bool {
				return v.Status.PrintableStatus == v1alpha1.PrintableStatusCrashLoopBackOff
			}); err != nil {
				return err
			}
			if left := time.Until(retryAfter); left <= 500*time.Millisecond {
				return fmt.Errorf("retryAfterTimestamp %s is only %s ahead after the second failure", retryAfter, left)
			}
			// No VMI until the back-off ends.
			if err := h.holds(time.Until(retryAfter)-300*time.Millisecond, "no VMI during the back-off", func() error {
				if _, err := h.getVMI(name); !apierrors.IsNotFound(err) {
					return fmt.Errorf("VMI present during the back-off (err %v)", err)
				}
				return nil
			}); err != nil {
				return err
			}
		}
	}
	vmi, err := h.waitVMI(name, "VMI #3 after the back-off", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.UID != uid && vmiActive(v)
	})
	if err != nil {
		return err
	}
	if vmi.CreationTimestamp.Time.Before(retryAfter) {
		return fmt.Errorf("VMI #3 created at %s, before the back-off ended at %s", vmi.CreationTimestamp, retryAfter)
	}
	return h.waitEvent(ReasonCrashLoopBackOff, corev1.EventTypeWarning)
}

// testDeleteVM: deleting a VM deletes its VMI first (no garbage collector here), then the VM goes.
func testDeleteVM(h *harness) error {
	const name = "vm"
	if err := h.createVM(name, v1alpha1.RunStrategyAlways); err != nil {
		return err
	}
	vmi, err := h.waitVMI(name, "the VMI", func(*v1alpha1.VirtualMachineInstance) bool { return true })
	if err != nil {
		return err
	}
	ref := metav1.GetControllerOf(vmi)
	if ref == nil || ref.Name != name || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion || vmi.Labels[v1alpha1.VMNameLabel] != name || vmi.Labels["app"] != name {
		return fmt.Errorf("VMI metadata: owner %+v labels %v", ref, vmi.Labels)
	}
	// A finalizer on the VMI (as the VMI reconciler keeps) shows that the VM waits for it.
	const holdFinalizer = "test.qvirt.io/hold"
	if err := h.patchVMI(name, func(v *v1alpha1.VirtualMachineInstance) { v.Finalizers = append(v.Finalizers, holdFinalizer) }); err != nil {
		return err
	}
	vm := &v1alpha1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns}}
	if err := h.c.Delete(h.ctx, vm); err != nil {
		return err
	}
	if _, err := h.waitVMI(name, "the VMI marked for deletion", func(v *v1alpha1.VirtualMachineInstance) bool { return v.DeletionTimestamp != nil }); err != nil {
		return err
	}
	if err := h.waitVM(name, "Terminating", func(vm *v1alpha1.VirtualMachine) bool {
		return vm.Status.PrintableStatus == v1alpha1.PrintableStatusTerminating
	}); err != nil {
		return err
	}
	if err := h.holds(500*time.Millisecond, "the VM waits for its VMI", func() error { return h.checkVM(name, func(*v1alpha1.VirtualMachine) bool { return true }) }); err != nil {
		return err
	}
	if err := h.patchVMI(name, func(v *v1alpha1.VirtualMachineInstance) { v.Finalizers = nil }); err != nil {
		return err
	}
	if err := h.waitGone(name); err != nil {
		return err
	}
	return poll(h.ctx, "the VM to be gone", func() error {
		err := h.c.Get(h.ctx, client.ObjectKeyFromObject(vm), vm)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("VM still there (finalizers %v, err %v)", vm.Finalizers, err)
	})
}

// testForeignVMI: a VMI of the VM's name that another owner controls is left alone and reported.
func testForeignVMI(h *harness) error {
	const name = "vm"
	foreign := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec:       testTemplate(name).Spec,
	}
	if err := h.c.Create(h.ctx, foreign); err != nil {
		return err
	}
	if err := h.createVM(name, v1alpha1.RunStrategyAlways); err != nil {
		return err
	}
	if err := h.waitVM(name, "Failure=True VMIConflict", func(vm *v1alpha1.VirtualMachine) bool {
		c := meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == ReasonVMIConflict
	}); err != nil {
		return err
	}
	vmi, err := h.getVMI(name)
	if err != nil {
		return err
	}
	if vmi.UID != foreign.UID || len(vmi.OwnerReferences) != 0 {
		return fmt.Errorf("foreign VMI was touched: uid %s owners %v", vmi.UID, vmi.OwnerReferences)
	}
	// Once it is gone the VM starts its own.
	if err := h.c.Delete(h.ctx, vmi); err != nil {
		return err
	}
	if _, err := h.waitVMI(name, "the VM's own VMI", func(v *v1alpha1.VirtualMachineInstance) bool { return v.UID != foreign.UID }); err != nil {
		return err
	}
	return h.waitVM(name, "Failure cleared", func(vm *v1alpha1.VirtualMachine) bool {
		return meta.FindStatusCondition(vm.Status.Conditions, v1alpha1.VirtualMachineFailure) == nil
	})
}

// harness is one case's namespace and helpers. Its methods return errors instead of failing the
// test, since cases run on their own goroutines.
type harness struct {
	ctx context.Context
	c   client.Client
	ns  string
}

func newHarness(ctx context.Context) (*harness, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "vm-test-"}}
	if err := cp.Client.Create(ctx, ns); err != nil {
		return &harness{}, err
	}
	return &harness{ctx: ctx, c: cp.Client, ns: ns.Name}, nil
}

func testTemplate(name string) v1alpha1.VirtualMachineInstanceTemplateSpec {
	return v1alpha1.VirtualMachineInstanceTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Domain: v1alpha1.DomainSpec{Memory: &v1alpha1.Memory{Guest: ptr.To(resource.MustParse("64Mi"))}},
		},
	}
}

func (h *harness) createVM(name string, s v1alpha1.RunStrategy, mutate ...func(*v1alpha1.VirtualMachine)) error {
	vm := &v1alpha1.VirtualMachine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec:       v1alpha1.VirtualMachineSpec{RunStrategy: ptr.To(s), Template: testTemplate(name)},
	}
	for _, m := range mutate {
		m(vm)
	}
	if err := h.c.Create(h.ctx, vm); err != nil {
		return fmt.Errorf("create VM: %w", err)
	}
	return nil
}

func (h *harness) key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: h.ns, Name: name}
}

func (h *harness) getVMI(name string) (*v1alpha1.VirtualMachineInstance, error) {
	vmi := &v1alpha1.VirtualMachineInstance{}
	return vmi, h.c.Get(h.ctx, h.key(name), vmi)
}

func (h *harness) waitVMI(name, what string, ok func(*v1alpha1.VirtualMachineInstance) bool) (*v1alpha1.VirtualMachineInstance, error) {
	var vmi *v1alpha1.VirtualMachineInstance
	err := poll(h.ctx, what, func() error {
		v, err := h.getVMI(name)
		if err != nil {
			return err
		}
		if !ok(v) {
			return fmt.Errorf("VMI %s phase %q deleting %v", v.UID, v.Status.Phase, v.DeletionTimestamp != nil)
		}
		vmi = v
		return nil
	})
	return vmi, err
}

func (h *harness) waitGone(name string) error {
	return poll(h.ctx, "the VMI to be gone", func() error {
		if _, err := h.getVMI(name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("VMI still there (err %v)", err)
		}
		return nil
	})
}

func (h *harness) checkVM(name string, ok func(*v1alpha1.VirtualMachine) bool) error {
	vm := &v1alpha1.VirtualMachine{}
	if err := h.c.Get(h.ctx, h.key(name), vm); err != nil {
		return err
	}
	if !ok(vm) {
		return fmt.Errorf("VM status %+v", vm.Status)
	}
	return nil
}

func (h *harness) waitVM(name, what string, ok func(*v1alpha1.VirtualMachine) bool) error {
	return poll(h.ctx, what, func() error { return h.checkVM(name, ok) })
}

// setPhase plays the VMI reconciler and the node agent: it writes the VMI's phase (and Ready for
// Running), if the VMI is still uid.
func (h *harness) setPhase(name string, uid types.UID, phase v1alpha1.VirtualMachineInstancePhase) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vmi, err := h.getVMI(name)
		if err != nil {
			return err
		}
		if vmi.UID != uid {
			return fmt.Errorf("VMI is %s, not %s", vmi.UID, uid)
		}
		vmi.Status.Phase = phase
		ready := metav1.Condition{Type: v1alpha1.VirtualMachineInstanceReady, Status: metav1.ConditionFalse,
			Reason: "GuestNotRunning", LastTransitionTime: metav1.Now()}
		if phase == v1alpha1.Running {
			ready.Status, ready.Reason = metav1.ConditionTrue, "GuestRunning"
		}
		meta.SetStatusCondition(&vmi.Status.Conditions, ready)
		return h.c.Status().Update(h.ctx, vmi)
	})
}

func (h *harness) patchVMI(name string, mutate func(*v1alpha1.VirtualMachineInstance)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vmi, err := h.getVMI(name)
		if err != nil {
			return err
		}
		mutate(vmi)
		return h.c.Update(h.ctx, vmi)
	})
}

func (h *harness) updateVM(name string, mutate func(*v1alpha1.VirtualMachine)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vm := &v1alpha1.VirtualMachine{}
		if err := h.c.Get(h.ctx, h.key(name), vm); err != nil {
			return err
		}
		mutate(vm)
		return h.c.Update(h.ctx, vm)
	})
}

// request plays qvirtctl start/stop/restart: it appends to status.stateChangeRequests.
func (h *harness) request(name string, reqs ...v1alpha1.VirtualMachineStateChangeRequest) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		vm := &v1alpha1.VirtualMachine{}
		if err := h.c.Get(h.ctx, h.key(name), vm); err != nil {
			return err
		}
		vm.Status.StateChangeRequests = append(vm.Status.StateChangeRequests, reqs...)
		return h.c.Status().Update(h.ctx, vm)
	})
}

func (h *harness) waitEvent(reason, typ string) error {
	return poll(h.ctx, "a "+typ+" "+reason+" event", func() error {
		var list corev1.EventList
		if err := h.c.List(h.ctx, &list, client.InNamespace(h.ns)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.Reason == reason && e.Type == typ && e.InvolvedObject.Kind == "VirtualMachine" {
				return nil
			}
		}
		return fmt.Errorf("%d events, none matching", len(list.Items))
	})
}

// holds checks that check keeps passing for d.
func (h *harness) holds(d time.Duration, what string, check func() error) error {
	end := time.Now().Add(d)
	for {
		if err := check(); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if time.Now().After(end) {
			return nil
		}
		select {
		case <-h.ctx.Done():
			return h.ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pollTimeout bounds each wait; the slowest expected wait is a 4 s back-off.
const pollTimeout = 15 * time.Second

// poll retries check until it passes, for at most pollTimeout.
func poll(ctx context.Context, what string, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, pollTimeout)
	defer cancel()
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
