package apiserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

// vmRequest is one VM action: the VM (as read for this attempt), its instance (same name; nil
// when there is none) and the request body.
type vmRequest struct {
	vm   *v1alpha1.VirtualMachine
	vmi  *v1alpha1.VirtualMachineInstance
	body []byte
	user string
}

func (r vmRequest) key() string { return r.vm.Namespace + "/" + r.vm.Name }

// vmActionFunc carries out one action; it returns what to answer (a metav1.Status message or an
// object). It may be called again on a conflict, with the VM read again.
type vmActionFunc func(ctx context.Context, r vmRequest) (any, error)

// vmAction reads the body and the VM and runs f, retrying on write conflicts. The user's request
// is authorised already (RBAC on virtualmachines/<action>); the writes use qvirt-api's identity.
func (a *API) vmAction(f vmActionFunc) connectFunc {
	return func(ctx context.Context, name string) (http.Handler, error) {
		u, ok := genericapirequest.UserFrom(ctx)
		if !ok {
			return nil, apierrors.NewUnauthorized("no authenticated user in the request")
		}
		ns := namespaceOf(ctx)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
			if err != nil || len(body) > maxBody {
				writeError(w, apierrors.NewBadRequest(fmt.Sprintf("reading the body (at most %d bytes): %v", maxBody, err)))
				return
			}
			var out any
			err = retry.OnError(retry.DefaultRetry, isWriteConflict, func() error {
				req, err := a.readVM(r.Context(), types.NamespacedName{Namespace: ns, Name: name})
				if err != nil {
					return err
				}
				req.body, req.user = body, u.GetName()
				out, err = f(r.Context(), req)
				return err
			})
			a.answer(w, out, err, "vm", ns+"/"+name, "user", u.GetName(), "path", r.URL.Path)
		}), nil
	}
}

func (a *API) answer(w http.ResponseWriter, out any, err error, kv ...any) {
	if err != nil {
		a.log.Info("VM action refused", append(kv, "error", err.Error())...)
		if bad, ok := err.(*BadBodyError); ok {
			err = apierrors.NewBadRequest(bad.Error())
		}
		writeError(w, err)
		return
	}
	a.log.Info("VM action done", kv...)
	if msg, ok := out.(string); ok {
		writeSuccess(w, msg)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *API) readVM(ctx context.Context, key types.NamespacedName) (vmRequest, error) {
	vm := &v1alpha1.VirtualMachine{}
	if err := a.client.Get(ctx, key, vm); err != nil {
		if apierrors.IsNotFound(err) {
			return vmRequest{}, apierrors.NewNotFound(vmResource, key.Name)
		}
		return vmRequest{}, apierrors.NewInternalError(fmt.Errorf("get VM %s: %w", key, err))
	}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := a.client.Get(ctx, key, vmi); err != nil {
		if !apierrors.IsNotFound(err) {
			return vmRequest{}, apierrors.NewInternalError(fmt.Errorf("get VMI %s: %w", key, err))
		}
		vmi = nil
	}
	return vmRequest{vm: vm, vmi: vmi}, nil
}

// active is an instance that runs or is on its way: not being deleted, not Succeeded or Failed.
func active(vmi *v1alpha1.VirtualMachineInstance) bool {
	return vmi != nil && vmi.DeletionTimestamp == nil && vmi.Status.Phase != v1alpha1.Succeeded && vmi.Status.Phase != v1alpha1.Failed
}

func phaseOf(vmi *v1alpha1.VirtualMachineInstance) string {
	if vmi.Status.Phase == "" {
		return "Pending"
	}
	return string(vmi.Status.Phase)
}

// pendingStop is true when the VM's requests end with a Stop that has not been followed by a Start.
func pendingStop(vm *v1alpha1.VirtualMachine) bool {
	reqs := vm.Status.StateChangeRequests
	return len(reqs) > 0 && reqs[len(reqs)-1].Action == v1alpha1.StopRequest
}

func conflict(r vmRequest, format string, args ...any) error {
	return apierrors.NewConflict(vmResource, r.vm.Name, fmt.Errorf(format, args...))
}

// start asks for a Start. The VM controller (controllers/vm) holds a runStrategy Always VM down
// after a Stop request until a Start request, so no run strategy is rewritten: the spec stays the
// user's (KubeVirt rewrites Always to Halted and back instead). Halted refuses starts.
func (a *API) start(ctx context.Context, r vmRequest) (any, error) {
	o, err := ParseStartOptions(r.body)
	if err != nil {
		return nil, err
	}
	switch rs := r.vm.EffectiveRunStrategy(); {
	case rs == v1alpha1.RunStrategyHalted:
		return nil, conflict(r, "VM %s has runStrategy Halted, which keeps it stopped: set spec.runStrategy to Always, RerunOnFailure or Manual to start it", r.key())
	case active(r.vmi) && !pendingStop(r.vm):
		return nil, conflict(r, "VM %s is running already (VMI phase %s); use restart to start it afresh", r.key(), phaseOf(r.vmi))
	}
	req := v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest}
	if o.Paused {
		req.Data = map[string]string{v1alpha1.StartPausedDataKey: "true"}
	}
	if err := a.appendRequests(ctx, r.vm, req); err != nil {
		return nil, err
	}
	return fmt.Sprintf("VM %s: start requested", r.key()), nil
}

// stop asks for a Stop of the current instance, with the grace period (force is 0) in its data.
func (a *API) stop(ctx context.Context, r vmRequest) (any, error) {
	o, err := ParseStopOptions(r.body)
	if err != nil {
		return nil, err
	}
	if !active(r.vmi) {
		return nil, conflict(r, "VM %s is not running (runStrategy %s, no running VMI); nothing to stop", r.key(), r.vm.EffectiveRunStrategy())
	}
	if !o.Force && r.vmi.Status.Phase != v1alpha1.Running {
		return nil, conflict(r, "VMI %s is still starting (phase %s); wait until it runs, or stop with force", r.key(), phaseOf(r.vmi))
	}
	grace := o.GracePeriodSeconds
	if o.Force {
		grace = ptr.To[int64](0)
	}
	if err := a.appendRequests(ctx, r.vm, stopRequest(r.vmi, grace)); err != nil {
		return nil, err
	}
	return fmt.Sprintf("VM %s: stop of VMI %s requested", r.key(), r.vmi.UID), nil
}

// restart asks for a Stop of the current instance followed by a Start; force makes the stop
// immediate (grace period 0).
func (a *API) restart(ctx context.Context, r vmRequest) (any, error) {
	o, err := ParseRestartOptions(r.body)
	if err != nil {
		return nil, err
	}
	if r.vm.EffectiveRunStrategy() == v1alpha1.RunStrategyHalted {
		return nil, conflict(r, "VM %s has runStrategy Halted, which keeps it stopped: set spec.runStrategy to Always, RerunOnFailure or Manual first", r.key())
	}
	if !active(r.vmi) {
		return nil, conflict(r, "VM %s is not running; use start", r.key())
	}
	grace := o.GracePeriodSeconds
	if o.Force {
		grace = ptr.To[int64](0)
	}
	err = a.appendRequests(ctx, r.vm, stopRequest(r.vmi, grace),
		v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StartRequest})
	if err != nil {
		return nil, err
	}
	return fmt.Sprintf("VM %s: restart of VMI %s requested", r.key(), r.vmi.UID), nil
}

func stopRequest(vmi *v1alpha1.VirtualMachineInstance, grace *int64) v1alpha1.VirtualMachineStateChangeRequest {
	uid := vmi.UID
	req := v1alpha1.VirtualMachineStateChangeRequest{Action: v1alpha1.StopRequest, UID: &uid}
	if grace != nil {
		req.Data = map[string]string{v1alpha1.StopGracePeriodDataKey: strconv.FormatInt(*grace, 10)}
	}
	return req
}

// appendRequests adds requests to status.stateChangeRequests, failing with a conflict when the
// VM changed since it was read (the caller retries).
func (a *API) appendRequests(ctx context.Context, vm *v1alpha1.VirtualMachine, reqs ...v1alpha1.VirtualMachineStateChangeRequest) error {
	orig := vm.DeepCopy()
	vm.Status.StateChangeRequests = append(vm.Status.StateChangeRequests, reqs...)
	err := a.client.Status().Patch(ctx, vm, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	return writeErr(err, "patch status.stateChangeRequests of VM %s/%s", vm.Namespace, vm.Name)
}

// writeConflict is a write refused because the object changed since it was read: vmAction reads
// again and retries.
type writeConflict struct{ err error }

func (w writeConflict) Error() string { return w.err.Error() }
func (w writeConflict) Unwrap() error { return w.err }

func isWriteConflict(err error) bool {
	var wc writeConflict
	return errors.As(err, &wc)
}

// writeErr classifies the error of a write: nil, a writeConflict, the API server's refusal of an
// invalid object as is, or an internal error naming what was written.
func writeErr(err error, format string, args ...any) error {
	switch {
	case err == nil:
		return nil
	case apierrors.IsConflict(err):
		return writeConflict{err}
	case apierrors.IsInvalid(err), apierrors.IsForbidden(err), apierrors.IsNotFound(err):
		return err
	}
	return apierrors.NewInternalError(fmt.Errorf(format+": %w", append(args, err)...))
}

// migrate creates a VirtualMachineInstanceMigration of the VM's running instance.
func (a *API) migrate(ctx context.Context, r vmRequest) (any, error) {
	o, err := ParseMigrateOptions(r.body)
	if err != nil {
		return nil, err
	}
	if r.vmi == nil {
		return nil, conflict(r, "VM %s is not running (no VMI); only a running VM can migrate", r.key())
	}
	if r.vmi.Status.Phase != v1alpha1.Running {
		return nil, notRunning(r.vmi)
	}
	// The migration controller would fail such a migration at once; saying why here spares the
	// user a Failed object to look into.
	if ok, _, msg := v1alpha1.LiveMigratable(&r.vmi.Spec); !ok {
		return nil, conflict(r, "VMI %s cannot be live-migrated: %s", r.key(), msg)
	}
	m := &v1alpha1.VirtualMachineInstanceMigration{}
	m.GenerateName = r.vm.Name + "-migration-"
	m.Namespace = r.vm.Namespace
	m.Spec.VMIName = r.vmi.Name
	var opts []client.CreateOption
	if hasDryRunAll(o.DryRun) {
		opts = append(opts, client.DryRunAll)
	}
	if err := a.client.Create(ctx, m, opts...); err != nil {
		return nil, writeErr(err, "create a migration of VMI %s", r.key())
	}
	m.APIVersion, m.Kind = v1alpha1.GroupVersion.String(), "VirtualMachineInstanceMigration"
	return m, nil
}
