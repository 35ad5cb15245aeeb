package apiserver

import (
	"encoding/json"
	"fmt"

	"github.com/emicklei/go-restful/v3"
	genericapiserver "k8s.io/apiserver/pkg/server"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/internal/buildinfo"
)

// installVersion adds GET .../version to the group version's web service (a route beside the
// resources; its RBAC resource is "version", verb get).
func installVersion(srv *genericapiserver.GenericAPIServer) error {
	root := "/apis/" + sub.GroupVersion.String()
	for _, ws := range srv.Handler.GoRestfulContainer.RegisteredWebServices() {
		if ws.RootPath() != root {
			continue
		}
		ws.Route(ws.GET("/version").To(func(_ *restful.Request, resp *restful.Response) {
			resp.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(resp.ResponseWriter).Encode(buildinfo.Version())
		}).Operation("getQvirtAPIVersion").Doc("qvirt-api's version").Produces("application/json"))
		return nil
	}
	return fmt.Errorf("no web service at %s to add the version route to", root)
}
