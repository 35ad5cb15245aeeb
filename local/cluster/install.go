package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/certs"
)

// fieldOwner names local mode's server-side applies.
const fieldOwner = "qvirtctl-local"

// InstallOptions say what to install.
type InstallOptions struct {
	// Repo is the source tree holding config/.
	Repo string
	// Namespace is the install namespace (qvirt-system).
	Namespace string
	// Config is qvirt-config's data (useEmulation, launcherImage, ...).
	Config map[string]string
}

// multusCRD is Multus's NetworkAttachmentDefinition CRD, under the repository.
const multusCRD = "config/multus/network-attachment-definition-crd.yaml"

// Install applies qvirt's CRDs, the install namespace, the configuration, the node agents'
// ServiceAccount with its RBAC and own-node admission policy (the identity the agents run with,
// handlerauth.go) and the webhook configurations with their Service (webhooks), with server-side
// apply.
func (cp *ControlPlane) Install(ctx context.Context, c client.Client, opts InstallOptions) error {
	crds, err := filepath.Glob(filepath.Join(opts.Repo, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) == 0 {
		return fmt.Errorf("no CRDs under %s/config/crd/bases (%v)", opts.Repo, err)
	}
	// Multus's NetworkAttachmentDefinition, since local mode's nodes run Multus.
	crds = append(crds, filepath.Join(opts.Repo, multusCRD))
	var objs []*unstructured.Unstructured
	for _, f := range crds {
		o, err := readObjects(f)
		if err != nil {
			return err
		}
		objs = append(objs, o...)
	}
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": opts.Namespace}}}
	cfg := map[string]any{}
	for k, v := range opts.Config {
		cfg[k] = v
	}
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "qvirt-config", "namespace": opts.Namespace}, "data": cfg}}
	objs = append(objs, ns, cm)
	handler, err := handlerObjects(opts)
	if err != nil {
		return err
	}
	objs = append(objs, handler...)
	hooks, err := webhooks(opts)
	if err != nil {
		return err
	}
	objs = append(objs, hooks...)
	if err := applyAll(ctx, c, objs); err != nil {
		return err
	}
	return waitServed(ctx, c, objs)
}

// crdServeTimeout bounds the wait for a new CRD's kinds to appear in discovery.
const crdServeTimeout = 30 * time.Second

// waitServed waits until the kind of every served version of every applied CRD resolves through
// c's REST mapper, that is until kube-apiserver's discovery lists it: it publishes a new CRD
// there asynchronously, and a create issued before that fails with "no matches for kind".
func waitServed(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
		for _, v := range versions {
			version, _ := v.(map[string]any)
			name, _, _ := unstructured.NestedString(version, "name")
			if served, _, _ := unstructured.NestedBool(version, "served"); !served {
				continue
			}
			gk := schema.GroupKind{Group: group, Kind: kind}
			var last error
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, crdServeTimeout, true,
				func(context.Context) (bool, error) {
					_, last = c.RESTMapper().RESTMapping(gk, name)
					return last == nil, nil
				})
			if err != nil {
				return fmt.Errorf("CRD %s: kind %s version %s not in discovery: %w", o.GetName(), kind, name, errors.Join(err, last))
			}
		}
	}
	return nil
}

// handlerObjects are config/handler's objects but its DaemonSet (the agents are host processes
// here), in the install namespace as kustomize would place them.
func handlerObjects(opts InstallOptions) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range []string{"service_account.yaml", "role.yaml", "role_binding.yaml", "own_node_policy.yaml"} {
		objs, err := readObjects(filepath.Join(opts.Repo, "config", "handler", f))
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			if o.GetKind() == "ServiceAccount" {
				o.SetNamespace(opts.Namespace)
			}
		}
		out = append(out, objs...)
	}
	return out, nil
}

// webhooks are config/webhook's configurations as its kustomization names them (their Service
// qvirt-controller-webhook in the install namespace) and that Service, without a selector: no pod
// runs the controller here, its replicas' EndpointSlices are written by StartControllers. The
// caBundle is qvirt-controller's to write, as in a cluster.
func webhooks(opts InstallOptions) ([]*unstructured.Unstructured, error) {
	objs, err := readObjects(filepath.Join(opts.Repo, "config", "webhook", "manifests.yaml"))
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		for i := range hooks {
			h := hooks[i].(map[string]any)
			if err := unstructured.SetNestedField(h, certs.WebhookService, "clientConfig", "service", "name"); err != nil {
				return nil, err
			}
			if err := unstructured.SetNestedField(h, opts.Namespace, "clientConfig", "service", "namespace"); err != nil {
				return nil, err
			}
		}
		if err := unstructured.SetNestedSlice(o.Object, hooks, "webhooks"); err != nil {
			return nil, err
		}
		o.SetName("qvirt-" + strings.TrimSuffix(o.GetName(), "-configuration"))
	}
	svc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": certs.WebhookService, "namespace": opts.Namespace},
		"spec": map[string]any{"ports": []any{map[string]any{"name": "webhook", "port": int64(443),
			"targetPort": "webhook", "protocol": "TCP"}}}}}
	return append(objs, svc), nil
}

// readObjects decodes every object of a multi-document YAML file.
func readObjects(file string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var o map[string]any
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(o) > 0 {
			out = append(out, &unstructured.Unstructured{Object: o})
		}
	}
}

// Apply applies every object of a YAML file (server-side apply), as `kubectl apply -f` does.
func Apply(ctx context.Context, c client.Client, file string) error {
	objs, err := readObjects(file)
	if err != nil {
		return err
	}
	if err := applyAll(ctx, c, objs); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// applyAll applies objs with server-side apply as local mode's field owner, taking over fields
// others set.
func applyAll(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner(fieldOwner), client.ForceOwnership)
		if err != nil {
			return fmt.Errorf("apply %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}
