package apiserver

import (
	"context"
	"net/http"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
)

// parent is the storage of virtualmachineinstances or virtualmachines: no verbs of its own, only
// what the installer needs to list the resource in discovery (kubectl api-resources shows it) and
// to hang the subresources off it.
type parent struct {
	singular string
	newObj   func() runtime.Object
}

var (
	_ rest.Storage              = parent{}
	_ rest.Scoper               = parent{}
	_ rest.SingularNameProvider = parent{}
)

func (p parent) New() runtime.Object     { return p.newObj() }
func (p parent) Destroy()                {}
func (p parent) NamespaceScoped() bool   { return true }
func (p parent) GetSingularName() string { return p.singular }

// connectFunc serves one subresource of the named object; ctx carries the namespace and the
// authenticated user. An error is answered as a metav1.Status by the generic server.
type connectFunc func(ctx context.Context, name string) (http.Handler, error)

// subresource is a rest.Connecter: the generic server authorises the request (its verb follows
// the method: GET is get, PUT is update), then hands it to connect.
type subresource struct {
	parent
	method  string
	connect connectFunc
}

var _ rest.Connecter = subresource{}

func (s subresource) ConnectMethods() []string { return []string{s.method} }

// NewConnectOptions: no query parameters; bodies are read by the handlers.
func (s subresource) NewConnectOptions() (runtime.Object, bool, string) { return nil, false, "" }

func (s subresource) Connect(ctx context.Context, name string, _ runtime.Object, _ rest.Responder) (http.Handler, error) {
	return s.connect(ctx, name)
}

// apiGroupInfo lists every resource and subresource of the group with the function serving it.
func (a *API) apiGroupInfo() genericapiserver.APIGroupInfo {
	info := genericapiserver.NewDefaultAPIGroupInfo(sub.GroupVersion.Group, scheme, runtime.NewParameterCodec(scheme), codecs)
	vmi := parent{singular: "virtualmachineinstance", newObj: func() runtime.Object { return &VirtualMachineInstance{} }}
	vm := parent{singular: "virtualmachine", newObj: func() runtime.Object { return &VirtualMachine{} }}
	storage := map[string]rest.Storage{
		sub.VirtualMachineInstances: vmi,
		sub.VirtualMachines:         vm,
	}
	add := func(p parent, resource, name, method string, f connectFunc) {
		storage[resource+"/"+name] = subresource{parent: p, method: method, connect: f}
	}
	for _, s := range streamSubresources {
		add(vmi, sub.VirtualMachineInstances, s, http.MethodGet, a.stream(s))
	}
	add(vmi, sub.VirtualMachineInstances, sub.Pause, http.MethodPut, a.vmiAction(sub.Pause, http.MethodPut))
	add(vmi, sub.VirtualMachineInstances, sub.Unpause, http.MethodPut, a.vmiAction(sub.Unpause, http.MethodPut))
	add(vmi, sub.VirtualMachineInstances, sub.SoftReboot, http.MethodPut, a.vmiAction(sub.SoftReboot, http.MethodPut))
	add(vmi, sub.VirtualMachineInstances, sub.Screenshot, http.MethodGet, a.vmiAction(sub.Screenshot, http.MethodGet))
	for _, s := range []string{sub.GuestOSInfo, sub.UserList, sub.FileSystemList} {
		add(vmi, sub.VirtualMachineInstances, s, http.MethodGet, a.vmiAction(s, http.MethodGet))
	}
	add(vmi, sub.VirtualMachineInstances, sub.Freeze, http.MethodPut, a.vmiAction(sub.Freeze, http.MethodPut))
	add(vmi, sub.VirtualMachineInstances, sub.Unfreeze, http.MethodPut, a.vmiAction(sub.Unfreeze, http.MethodPut))
	add(vm, sub.VirtualMachines, sub.Start, http.MethodPut, a.vmAction(a.start))
	add(vm, sub.VirtualMachines, sub.Stop, http.MethodPut, a.vmAction(a.stop))
	add(vm, sub.VirtualMachines, sub.Restart, http.MethodPut, a.vmAction(a.restart))
	add(vm, sub.VirtualMachines, sub.Migrate, http.MethodPut, a.vmAction(a.migrate))
	add(vm, sub.VirtualMachines, sub.AddVolume, http.MethodPut, a.vmAction(a.addVolume))
	add(vm, sub.VirtualMachines, sub.RemoveVolume, http.MethodPut, a.vmAction(a.removeVolume))
	info.VersionedResourcesStorageMap[sub.GroupVersion.Version] = storage
	return info
}

// streamSubresources are the VMI subresources that are websocket streams: long-running requests.
var streamSubresources = []string{sub.Console, sub.VNC, sub.QMP, sub.USBRedir}
