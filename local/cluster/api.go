package cluster

import (
	"context"
	"path/filepath"
	"strconv"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/certs"
	"github.com/qvirt/qvirt/local/supervise"
)

// startAPI runs qvirt-api on the API bridge, serving with Secret qvirt-api-serving, and registers
// it with the aggregator: config/api's APIService (qvirt-controller writes its caBundle), a
// Service without selector and an EndpointSlice for the host address (no pod runs it here), and
// config/rbac's user roles. It is ready when kube-apiserver serves its group.
func (c *Cluster) startAPI(ctx context.Context, cl client.Client, port int) error {
	objs, err := c.apiObjects(port)
	if err != nil {
		return err
	}
	if err := applyAll(ctx, cl, objs); err != nil {
		return err
	}
	kc := filepath.Clean(c.Kubeconfig)
	return c.sup.Start(ctx, supervise.Component{Name: "qvirt-api", Path: filepath.Join(c.opts.Bin, "qvirt-api"),
		Args: []string{"--bind-address=" + apiAddress.String(), "--secure-port=" + strconv.Itoa(port),
			"--tls-secret=" + certs.APIServingSecret,
			"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
			"--handler-tls-secret=" + certs.APISecret, "--namespace=" + Namespace},
		Ready: supervise.HTTPReady("https://127.0.0.1:"+strconv.Itoa(c.cp.opts.APIServerPort)+"/apis/subresources.qvirt.io/v1alpha1", c.cp.adminTLS)})
}

// apiObjects are what registers qvirt-api at the host address.
func (c *Cluster) apiObjects(port int) ([]*unstructured.Unstructured, error) {
	apisvc, err := readObjects(filepath.Join(c.opts.Repo, "config", "api", "apiservice.yaml"))
	if err != nil {
		return nil, err
	}
	roles, err := readObjects(filepath.Join(c.opts.Repo, "config", "rbac", "user_roles.yaml"))
	if err != nil {
		return nil, err
	}
	svc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": "qvirt-api", "namespace": Namespace},
		"spec": map[string]any{"ports": []any{map[string]any{"name": "https", "port": int64(443),
			"targetPort": int64(port), "protocol": "TCP"}}}}}
	slice := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"name": "qvirt-api-host", "namespace": Namespace,
			"labels": map[string]any{"kubernetes.io/service-name": "qvirt-api"}},
		"addressType": "IPv4",
		"endpoints":   []any{map[string]any{"addresses": []any{apiAddress.String()}, "conditions": map[string]any{"ready": true}}},
		"ports":       []any{map[string]any{"name": "https", "port": int64(port), "protocol": "TCP"}}}}
	return append(append(roles, svc, slice), apisvc...), nil
}
