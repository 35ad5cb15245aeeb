package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/handler/streams"
)

var (
	vmiResource = schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "virtualmachineinstances"}
	vmResource  = schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "virtualmachines"}
)

// target is a running VMI and the stream server of its node.
type target struct {
	vmi  *v1alpha1.VirtualMachineInstance
	addr string // host:port of the node's qvirt-handler stream server
}

func (t target) key() string { return t.vmi.Namespace + "/" + t.vmi.Name }

// url is the handler's URL of one of the VMI's endpoints; scheme is https or wss.
func (t target) url(scheme, endpoint string) string {
	u := url.URL{Scheme: scheme, Host: t.addr, Path: streams.Path(t.vmi.Namespace, t.vmi.Name, endpoint)}
	return u.String()
}

// namespaceOf is the request's namespace, which the generic server put in ctx.
func namespaceOf(ctx context.Context) string {
	ns, _ := genericapirequest.NamespaceFrom(ctx)
	return ns
}

// runningVMI finds a Running VMI and its node's stream server; the error is an APIStatus saying
// what is missing and what to do.
func (a *API) runningVMI(ctx context.Context, name string) (target, error) {
	key := types.NamespacedName{Namespace: namespaceOf(ctx), Name: name}
	vmi := &v1alpha1.VirtualMachineInstance{}
	if err := a.client.Get(ctx, key, vmi); err != nil {
		if apierrors.IsNotFound(err) {
			return target{}, apierrors.NewNotFound(vmiResource, name)
		}
		return target{}, apierrors.NewInternalError(fmt.Errorf("get VMI %s: %w", key, err))
	}
	if vmi.Status.Phase != v1alpha1.Running {
		return target{}, notRunning(vmi)
	}
	node := vmi.Status.NodeName
	if node == "" {
		return target{}, apierrors.NewConflict(vmiResource, name, fmt.Errorf("VMI %s is Running but names no node in status.nodeName", key))
	}
	addr, err := a.streamsAddress(ctx, node)
	if err != nil {
		return target{}, err
	}
	return target{vmi: vmi, addr: addr}, nil
}

func notRunning(vmi *v1alpha1.VirtualMachineInstance) error {
	phase := string(vmi.Status.Phase)
	if phase == "" {
		phase = "Pending"
	}
	return apierrors.NewConflict(vmiResource, vmi.Name, fmt.Errorf("VMI %s is not running (phase %s); wait until it is Running", vmi.Name, phase))
}

// streamsAddress is the node's v1alpha1.NodeStreamsAddressAnnotation, written by its qvirt-handler.
func (a *API) streamsAddress(ctx context.Context, nodeName string) (string, error) {
	node := &corev1.Node{}
	if err := a.client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return "", apierrors.NewServiceUnavailable(fmt.Sprintf("node %s of the VMI does not exist any more", nodeName))
		}
		return "", apierrors.NewInternalError(fmt.Errorf("get node %s: %w", nodeName, err))
	}
	addr := node.Annotations[v1alpha1.NodeStreamsAddressAnnotation]
	if addr == "" {
		return "", apierrors.NewServiceUnavailable(fmt.Sprintf("node %s has no %s annotation: its qvirt-handler is not running or has not started its stream server", nodeName, v1alpha1.NodeStreamsAddressAnnotation))
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", apierrors.NewInternalError(fmt.Errorf("node %s: annotation %s=%q is not host:port: %w", nodeName, v1alpha1.NodeStreamsAddressAnnotation, addr, err))
	}
	return addr, nil
}

// handlerClient is an HTTP client for one call to the handler of t's node, with a fresh TLS
// configuration from the source that accepts only a certificate naming that node.
func (a *API) handlerClient(t target) (*http.Client, error) {
	cfg, err := a.tls()
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("TLS configuration for qvirt-handler: %w", err))
	}
	tr := &http.Transport{
		TLSClientConfig:     forNode(cfg, t.vmi.Status.NodeName),
		TLSHandshakeTimeout: 10 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		ForceAttemptHTTP2:   false, // websockets need HTTP/1.1
	}
	return &http.Client{Transport: tr}, nil
}

// unreachable is the error for a handler that cannot be reached at all, or that is not the
// handler of the VMI's node.
func unreachable(t target, err error) error {
	var se apierrors.APIStatus
	if errors.As(err, &se) {
		return err
	}
	var wrong *certs.WrongNodeError
	if errors.As(err, &wrong) {
		return apierrors.NewServiceUnavailable(fmt.Sprintf("refused the qvirt-handler at %s for VMI %s on node %s: %v; "+
			"the address comes from node %s's %s annotation, which should point at that node's own qvirt-handler",
			t.addr, t.key(), t.vmi.Status.NodeName, wrong, t.vmi.Status.NodeName, v1alpha1.NodeStreamsAddressAnnotation))
	}
	return apierrors.NewServiceUnavailable(fmt.Sprintf("qvirt-handler of node %s at %s for VMI %s cannot be reached: %v", t.vmi.Status.NodeName, t.addr, t.key(), err))
}
