package streams

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/handler/podsockets"
	"github.com/qvirt/qvirt/internal/apistatus"
	"github.com/qvirt/qvirt/internal/unixsock"
	"github.com/qvirt/qvirt/launcher"
)

// Headers qvirt-api sets to name the end user; trusted because only a client holding a
// certificate from the client CA gets this far.
const (
	HeaderUser     = "X-Qvirt-User"
	HeaderGroups   = "X-Qvirt-Groups"
	HeaderQMPWrite = "X-Qvirt-QMP-Write"
)

// Caller is the end user on whose behalf qvirt-api calls.
type Caller struct {
	User   string
	Groups []string
	// QMPWrite is true when the user holds the QMP shell's write permission.
	QMPWrite bool
	// Client is the subject CN of the client certificate (qvirt-api's).
	Client string
}

func callerFrom(r *http.Request) (Caller, error) {
	c := Caller{User: r.Header.Get(HeaderUser), Groups: r.Header.Values(HeaderGroups)}
	if c.User == "" {
		return c, apierrors.NewBadRequest(fmt.Sprintf("missing %s header: qvirt-api must name the end user", HeaderUser))
	}
	switch v := strings.ToLower(r.Header.Get(HeaderQMPWrite)); v {
	case "", "false":
	case "true":
		c.QMPWrite = true
	default:
		return c, apierrors.NewBadRequest(fmt.Sprintf("header %s: %q is neither true nor false", HeaderQMPWrite, v))
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		c.Client = r.TLS.PeerCertificates[0].Subject.CommonName
	}
	return c, nil
}

var vmiResource = schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "virtualmachineinstances"}

// target is the VMI a request is about, checked to run on this node.
type target struct {
	vmi *v1alpha1.VirtualMachineInstance
	dir launcher.Dir
}

func (t target) key() string { return t.vmi.Namespace + "/" + t.vmi.Name }

// lookup finds the VMI of the request and checks that it runs here; the error is an
// *apierrors.StatusError with the status code to answer.
func (s *Server) lookup(ctx context.Context, r *http.Request) (target, error) {
	key := types.NamespacedName{Namespace: r.PathValue("namespace"), Name: r.PathValue("name")}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := s.opts.Reader.Get(ctx, key, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return target{}, apierrors.NewNotFound(vmiResource, key.Name)
		}
		return target{}, apierrors.NewInternalError(fmt.Errorf("get VMI %s: %w", key, err))
	}
	st := vmi.Status
	switch {
	case st.NodeName == "":
		return target{}, apierrors.NewConflict(vmiResource, key.Name, fmt.Errorf("it is not on a node yet (phase %s)", phaseOf(st.Phase)))
	case st.NodeName != s.opts.NodeName:
		return target{}, apierrors.NewConflict(vmiResource, key.Name, fmt.Errorf("it runs on node %q, this handler serves node %q", st.NodeName, s.opts.NodeName))
	case st.Phase != v1alpha1.Running:
		return target{}, apierrors.NewConflict(vmiResource, key.Name, fmt.Errorf("it is %s, not Running", phaseOf(st.Phase)))
	}
	dir, err := podsockets.Running(s.opts.PodsDir, s.opts.NodeName, vmi)
	if err != nil {
		return target{}, apierrors.NewConflict(vmiResource, key.Name, err)
	}
	return target{vmi: vmi, dir: dir}, nil
}

func phaseOf(p v1alpha1.VirtualMachineInstancePhase) string {
	if p == "" {
		return "without a phase"
	}
	return string(p)
}

// dial connects to one of the VMI's unix sockets; what names the socket in the error.
func dial(ctx context.Context, t target, what, socket string) (net.Conn, error) {
	conn, err := unixsock.Dial(ctx, socket)
	if err == nil {
		return conn, nil
	}
	var why string
	switch {
	case errors.Is(err, os.ErrNotExist):
		why = "is missing: QEMU has not started yet or has exited"
	case errors.Is(err, syscall.ECONNREFUSED):
		why = "refuses connections: QEMU is not listening (exited?)"
	default:
		why = "cannot be reached: " + err.Error()
	}
	return nil, apierrors.NewServiceUnavailable(fmt.Sprintf("the %s socket %s of VMI %s %s", what, socket, t.key(), why))
}

// fail answers err as a metav1.Status with its HTTP code (apistatus, as qvirt-api answers, which
// relays it unchanged); errors that are not StatusErrors are 500.
func fail(w http.ResponseWriter, err error) { apistatus.WriteError(w, err) }
