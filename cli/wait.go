package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/coder/websocket"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/cli/kube"
)

// pollInterval is how often a stream command re-checks a VMI that is not reachable yet.
var pollInterval = time.Second

// streamDial describes a stream to open on a VMI, waiting until the VMI runs.
type streamDial struct {
	name, sub, proto string
	// timeout bounds the wait for the VMI to run and the stream to open.
	timeout time.Duration
	// retryConflict also retries 409 answers (the VMI is not Running on its node yet). The QMP
	// shell answers 409 when another session holds it, which waiting will not fix.
	retryConflict bool
	// progress receives "waiting for ..." lines.
	progress io.Writer
	// eol ends progress lines ("\r\n" once the terminal is raw).
	eol string
}

// dialVMI waits until the VMI is Running (reading it directly) and its stream opens, printing
// each new reason for waiting. A VMI that does not exist or has ended is an error at once.
func dialVMI(ctx context.Context, c *kube.Client, d streamDial) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	path := subv1.Path(c.Namespace, subv1.VirtualMachineInstances, d.name, d.sub)
	last := ""
	timedOut := func() error {
		why := last
		if why == "" {
			why = "the API server did not answer in time"
		}
		return withHint(fmt.Errorf("VMI %s not reachable within --timeout %s: %s", d.name, d.timeout, why),
			"Check the VMI's phase and events: kubectl describe vmi %s -n %s", d.name, c.Namespace)
	}
	for {
		msg, err := vmiNotReady(ctx, c, d.name)
		if err != nil {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) { // the Get was cut short by the timeout
				return nil, timedOut()
			}
			return nil, err
		}
		if msg == "" {
			conn, err := c.Dial(ctx, path, d.proto)
			if err == nil {
				return conn, nil
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, timedOut()
			}
			if !d.retryable(err) || ctx.Err() != nil {
				return nil, err
			}
			msg = fmt.Sprintf("waiting for VMI %s's %s: %v", d.name, d.sub, apiMessage(err))
		}
		if msg != last {
			fmt.Fprint(d.progress, msg+d.eol)
			last = msg
		}
		select {
		case <-ctx.Done():
			return nil, timedOut()
		case <-time.After(pollInterval):
		}
	}
}

func (d streamDial) retryable(err error) bool {
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		return false
	}
	switch se.ErrStatus.Code {
	case http.StatusServiceUnavailable:
		return true
	case http.StatusConflict:
		return d.retryConflict
	}
	return false
}

// vmiNotReady says why the VMI cannot be connected to yet ("" when it runs), or fails when it
// never will: missing or ended. A user who may not read VMIs skips the check.
func vmiNotReady(ctx context.Context, c *kube.Client, name string) (string, error) {
	var vmi qv1.VirtualMachineInstance
	err := c.Objects.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: name}, &vmi)
	switch {
	case apierrors.IsForbidden(err):
		return "", nil
	case apierrors.IsNotFound(err):
		return "", withHint(err, "Is the VM started? List instances with: kubectl get vmi -n %s", c.Namespace)
	case err != nil:
		return "", fmt.Errorf("read VMI %s: %w", name, err)
	}
	switch vmi.Status.Phase {
	case qv1.Running:
		return "", nil
	case qv1.Succeeded, qv1.Failed:
		return "", fmt.Errorf("VMI %s has ended (phase %s%s); start its VM again with: qvirtctl start %s",
			name, vmi.Status.Phase, reasonSuffix(vmi.Status.Reason), name)
	}
	phase := string(vmi.Status.Phase)
	if phase == "" {
		phase = "not yet set"
	}
	return fmt.Sprintf("waiting for VMI %s to run (phase %s)", name, phase), nil
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return ", reason " + r
}

// apiMessage is the server's message of an API error, else the error's text.
func apiMessage(err error) string {
	var se *apierrors.StatusError
	if errors.As(err, &se) && se.ErrStatus.Message != "" {
		return se.ErrStatus.Message
	}
	return err.Error()
}
