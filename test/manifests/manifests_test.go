// Package manifests renders config/default as `kubectl apply -k config/default` would and checks
// that it applies as it is: every Secret a pod mounts is one qvirt-controller creates (and RBAC
// lets it write), every webhook configuration and APIService gets its CA bundle from the
// controller (and RBAC lets it), and admission has replicas and a disruption budget.
package manifests

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/qvirt/qvirt/certs"
	certctl "github.com/qvirt/qvirt/controllers/certs"
	"github.com/qvirt/qvirt/controllers/uninstall"
	"github.com/qvirt/qvirt/test/envtest"
)

const namespace = "qvirt-system"

// render runs `kubectl kustomize config/default` (kubectl from hack/build-tools.sh).
func render(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	tools, err := envtest.Assets()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(tools, "kubectl"), "kustomize", filepath.Join(envtest.RepoRoot(), "config", "default"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/default: %v\n%s", err, stderr.String())
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		var o map[string]any
		if err := dec.Decode(&o); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatal(err)
		}
		if len(o) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: o})
		}
	}
}

// number is an integer field (JSON decoding makes it an int64 or a float64); -1 when absent.
func number(obj map[string]any, fields ...string) int64 {
	v, ok, _ := unstructured.NestedFieldNoCopy(obj, fields...)
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	if !ok {
		return -1
	}
	return -1
}

func ofKind(objs []*unstructured.Unstructured, kinds ...string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if slices.Contains(kinds, o.GetKind()) {
			out = append(out, o)
		}
	}
	return out
}

func find(objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	return nil
}

// mountedSecrets are the Secrets a pod template names: volumes (secret, projected) and env.
func mountedSecrets(spec map[string]any) []string {
	var names []string
	vols, _, _ := unstructured.NestedSlice(spec, "volumes")
	for _, v := range vols {
		vol := v.(map[string]any)
		if n, ok, _ := unstructured.NestedString(vol, "secret", "secretName"); ok {
			names = append(names, n)
		}
		sources, _, _ := unstructured.NestedSlice(vol, "projected", "sources")
		for _, s := range sources {
			if n, ok, _ := unstructured.NestedString(s.(map[string]any), "secret", "name"); ok {
				names = append(names, n)
			}
		}
	}
	for _, field := range []string{"containers", "initContainers"} {
		ctrs, _, _ := unstructured.NestedSlice(spec, field)
		for _, c := range ctrs {
			envs, _, _ := unstructured.NestedSlice(c.(map[string]any), "env")
			for _, e := range envs {
				if n, ok, _ := unstructured.NestedString(e.(map[string]any), "valueFrom", "secretKeyRef", "name"); ok {
					names = append(names, n)
				}
			}
			from, _, _ := unstructured.NestedSlice(c.(map[string]any), "envFrom")
			for _, e := range from {
				if n, ok, _ := unstructured.NestedString(e.(map[string]any), "secretRef", "name"); ok {
					names = append(names, n)
				}
			}
		}
	}
	return names
}

func TestEveryMountedSecretIsOneTheControllerCreates(t *testing.T) {
	objs := render(t)
	created := certctl.SecretNames()
	workloads := ofKind(objs, "Deployment", "DaemonSet", "StatefulSet", "Job")
	if len(workloads) < 3 {
		t.Fatalf("config/default renders %d workloads, want the controller, the handler and qvirt-api", len(workloads))
	}
	mounted := 0
	for _, w := range workloads {
		spec, _, _ := unstructured.NestedMap(w.Object, "spec", "template", "spec")
		for _, name := range mountedSecrets(spec) {
			mounted++
			if !slices.Contains(created, name) {
				t.Errorf("%s %s mounts Secret %s, which nothing creates (qvirt-controller creates %v)", w.GetKind(), w.GetName(), name, created)
			}
			if w.GetNamespace() != namespace {
				t.Errorf("%s %s is in namespace %q; the controller's Secrets are in %s", w.GetKind(), w.GetName(), w.GetNamespace(), namespace)
			}
		}
	}
	if mounted == 0 {
		t.Fatal("no workload mounts a Secret: the check checked nothing")
	}
	rb := newRBAC(objs)
	sa := subject{namespace, "qvirt-controller"}
	for _, name := range created {
		for _, verb := range []string{"create", "get", "update", "list", "watch"} {
			if !rb.allows(sa, verb, "", "secrets", namespace, name) {
				t.Errorf("RBAC does not let %s %s Secret %s/%s", sa, verb, namespace, name)
			}
		}
	}
	// The Secrets that hold the CA's key and the webhook's key must not be readable by the node
	// agents or qvirt-api.
	for _, other := range []subject{{namespace, "qvirt-handler"}, {namespace, "qvirt-api"}} {
		for _, name := range []string{certs.CASecret, certs.WebhookSecret} {
			if rb.allows(other, "get", "", "secrets", namespace, name) {
				t.Errorf("RBAC lets %s read Secret %s", other, name)
			}
		}
	}
}

func TestEveryWebhookConfigurationAndAPIServiceGetsACABundle(t *testing.T) {
	objs := render(t)
	targets := ofKind(objs, certs.KindValidatingWebhook, certs.KindMutatingWebhook, certs.KindAPIService)
	if len(targets) != len(certs.CABundleTargets) {
		t.Errorf("config/default installs %d webhook configurations and APIServices, the controller writes the CA bundle of %d (%v)", len(targets), len(certs.CABundleTargets), certs.CABundleTargets)
	}
	rb := newRBAC(objs)
	sa := subject{namespace, "qvirt-controller"}
	for _, o := range targets {
		if !slices.Contains(certs.CABundleTargets, certs.CABundleTarget{Kind: o.GetKind(), Name: o.GetName()}) {
			t.Errorf("%s %s: not in certs.CABundleTargets, so nothing writes its caBundle", o.GetKind(), o.GetName())
		}
		group, resource := "admissionregistration.k8s.io", "validatingwebhookconfigurations"
		switch o.GetKind() {
		case certs.KindMutatingWebhook:
			resource = "mutatingwebhookconfigurations"
		case certs.KindAPIService:
			group, resource = "apiregistration.k8s.io", "apiservices"
		}
		for _, verb := range []string{"get", "list", "watch", "update"} {
			if !rb.allows(sa, verb, group, resource, "", o.GetName()) {
				t.Errorf("RBAC does not let %s %s %s %s", sa, verb, o.GetKind(), o.GetName())
			}
		}
		// The certificate names the Service: the configuration must reach that Service.
		if o.GetKind() == certs.KindAPIService {
			svc, _, _ := unstructured.NestedString(o.Object, "spec", "service", "name")
			ns, _, _ := unstructured.NestedString(o.Object, "spec", "service", "namespace")
			if svc != certs.APIServiceName || ns != namespace {
				t.Errorf("APIService %s reaches Service %s/%s, the serving certificate names %s/%s", o.GetName(), ns, svc, namespace, certs.APIServiceName)
			}
			if skip, _, _ := unstructured.NestedBool(o.Object, "spec", "insecureSkipTLSVerify"); skip {
				t.Errorf("APIService %s skips TLS verification", o.GetName())
			}
			continue
		}
		hooks, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
		if len(hooks) == 0 {
			t.Errorf("%s %s has no webhooks", o.GetKind(), o.GetName())
		}
		for _, h := range hooks {
			svc, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "service", "name")
			ns, _, _ := unstructured.NestedString(h.(map[string]any), "clientConfig", "service", "namespace")
			name, _, _ := unstructured.NestedString(h.(map[string]any), "name")
			if svc != certs.WebhookService || ns != namespace {
				t.Errorf("%s %s webhook %s reaches Service %s/%s, the serving certificate names %s/%s", o.GetKind(), o.GetName(), name, ns, svc, namespace, certs.WebhookService)
			}
			if find(objs, "Service", ns, svc) == nil {
				t.Errorf("%s %s webhook %s: Service %s/%s is not installed", o.GetKind(), o.GetName(), name, ns, svc)
			}
		}
	}
}

func TestAdmissionSurvivesLosingAControllerReplica(t *testing.T) {
	objs := render(t)
	d := find(objs, "Deployment", namespace, "qvirt-controller")
	if d == nil {
		t.Fatal("no Deployment qvirt-controller")
	}
	if n := number(d.Object, "spec", "replicas"); n < 2 {
		t.Errorf("qvirt-controller runs %d replicas, want at least 2", n)
	}
	labels, _, _ := unstructured.NestedStringMap(d.Object, "spec", "template", "metadata", "labels")
	var budget *unstructured.Unstructured
	for _, p := range ofKind(objs, "PodDisruptionBudget") {
		sel, _, _ := unstructured.NestedStringMap(p.Object, "spec", "selector", "matchLabels")
		matches := len(sel) > 0
		for k, v := range sel {
			matches = matches && labels[k] == v
		}
		if matches && p.GetNamespace() == namespace {
			budget = p
		}
	}
	if budget == nil {
		t.Fatal("no PodDisruptionBudget selects qvirt-controller's pods")
	}
	if n := number(budget.Object, "spec", "minAvailable"); n < 1 {
		t.Errorf("PodDisruptionBudget %s: minAvailable %d, want at least 1", budget.GetName(), n)
	}
	// Every replica serves the webhooks (none is gated on leadership): the webhook Service
	// selects all of them.
	svc := find(objs, "Service", namespace, certs.WebhookService)
	if svc == nil {
		t.Fatalf("no Service %s", certs.WebhookService)
	}
	sel, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	for k, v := range sel {
		if labels[k] != v {
			t.Errorf("Service %s selects %s=%s, which qvirt-controller's pods do not carry", svc.GetName(), k, v)
		}
	}
	ctrs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	if len(ctrs) == 0 {
		t.Fatal("qvirt-controller has no container")
	}
	args, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "args")
	if slices.Contains(args, "--webhooks=false") {
		t.Errorf("qvirt-controller runs with --webhooks=false: %v", args)
	}
	if !slices.ContainsFunc(args, func(a string) bool { return len(a) > 17 && a[:17] == "--shutdown-delay=" }) {
		t.Errorf("qvirt-controller's args %v set no --shutdown-delay: a deleted replica would stop answering before the Service stops sending it calls", args)
	}
}

// The install namespace's Pod Security level admits the node agent's privileged DaemonSet:
// config/default sets it on the Namespace it creates, rather than leaving it to the cluster's
// default (which may be baseline or restricted, and would refuse the agent's pods).
func TestInstallNamespaceAdmitsTheNodeAgent(t *testing.T) {
	objs := render(t)
	ns := find(objs, "Namespace", "", namespace)
	if ns == nil {
		t.Fatalf("config/default creates no Namespace %s", namespace)
	}
	if lvl := ns.GetLabels()["pod-security.kubernetes.io/enforce"]; lvl != "privileged" {
		t.Errorf("Namespace %s enforces Pod Security level %q, want privileged for qvirt-handler", namespace, lvl)
	}
	ds := find(objs, "DaemonSet", namespace, "qvirt-handler")
	if ds == nil {
		t.Fatal("no DaemonSet qvirt-handler")
	}
	if hostPID, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostPID"); !hostPID {
		t.Error("qvirt-handler does not run with hostPID: the privileged level would not be needed, update the Namespace and README")
	}
}

// TestNodeAgentCannotReadTenantSecrets: a VMI's pull credentials and cloud-init Secrets reach its
// launcher as volumes and imagePullSecrets of the launcher pod, which the kubelet resolves; the
// node agent runs on every node, privileged, so RBAC must not let it read a tenant's Secrets
// (a compromised node would otherwise read every tenant's).
func TestNodeAgentCannotReadTenantSecrets(t *testing.T) {
	rb := newRBAC(render(t))
	handler := subject{namespace, "qvirt-handler"}
	if len(rb.rules(handler)) == 0 {
		t.Fatalf("no RBAC rule is bound to %s: the check would check nothing", handler)
	}
	const tenant = "tenant-a"
	for _, verb := range []string{"get", "list", "watch"} {
		// "" is the collection (list, watch); the names are a cloud-init Secret and a pull Secret.
		for _, name := range []string{"", "cloud-init-userdata", "registry-credentials"} {
			if rb.allows(handler, verb, "", "secrets", tenant, name) {
				t.Errorf("RBAC lets %s %s Secrets in tenant namespace %s (name %q); pull and cloud-init Secrets must reach the launcher through its pod", handler, verb, tenant, name)
			}
		}
	}
}

// TestUninstallIsGuarded: every object config/default installs is guarded while VMs exist. Those a
// webhook may see carry the label the uninstall webhook selects; the kinds Kubernetes sends no
// webhook (webhook configurations, admission policies and their bindings) are each a target of the
// finalizer reconciler, which names no object that is not installed.
func TestUninstallIsGuarded(t *testing.T) {
	objs := render(t)
	exempt := []string{"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
	for _, o := range objs {
		if slices.Contains(exempt, o.GetKind()) {
			if !slices.ContainsFunc(uninstall.Targets, func(tg uninstall.Target) bool { return tg.GVK.Kind == o.GetKind() && tg.Name == o.GetName() }) {
				t.Errorf("%s %s is not among uninstall.Targets: deleting it while VMs run would not wait", o.GetKind(), o.GetName())
			}
			continue
		}
		if o.GetLabels()[uninstall.InstallLabel] != "qvirt" {
			t.Errorf("%s %s/%s lacks label %s=qvirt: the uninstall guard would let it go while VMs run", o.GetKind(), o.GetNamespace(), o.GetName(), uninstall.InstallLabel)
		}
	}
	for _, tg := range uninstall.Targets {
		// Cluster-scoped all, though kustomize gives the admission policies a namespace (it does
		// not know their scope; kubectl ignores it).
		if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == tg.GVK.Kind && o.GetName() == tg.Name }) {
			t.Errorf("uninstall.Targets names %s %s, which config/default does not install", tg.GVK.Kind, tg.Name)
		}
	}
	hook := webhookNamed(t, ofKind(objs, "ValidatingWebhookConfiguration"), "vuninstall.qvirt.io")
	if sel, _, _ := unstructured.NestedStringMap(hook, "objectSelector", "matchLabels"); sel[uninstall.InstallLabel] != "qvirt" || len(sel) != 1 {
		t.Errorf("webhook vuninstall.qvirt.io selects %v, want only %s=qvirt", sel, uninstall.InstallLabel)
	}
	// Its rules name every kind installed (kinds' plural resource names are their lower case
	// and an s, for all of these).
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	for _, o := range objs {
		if slices.Contains(exempt, o.GetKind()) {
			continue
		}
		group := o.GroupVersionKind().Group
		resource := strings.ToLower(o.GetKind()) + "s"
		if !slices.ContainsFunc(rules, func(r any) bool {
			groups, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "apiGroups")
			resources, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
			ops, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "operations")
			return slices.Contains(groups, group) && slices.Contains(resources, resource) && slices.Contains(ops, "DELETE")
		}) {
			t.Errorf("webhook vuninstall.qvirt.io has no rule for deleting %s (%s in group %q), which config/default installs", o.GetKind(), resource, group)
		}
	}
}

// webhookNamed is the webhook called name in one of configs.
func webhookNamed(t *testing.T, configs []*unstructured.Unstructured, name string) map[string]any {
	t.Helper()
	for _, c := range configs {
		hooks, _, _ := unstructured.NestedSlice(c.Object, "webhooks")
		for _, h := range hooks {
			if n, _, _ := unstructured.NestedString(h.(map[string]any), "name"); n == name {
				return h.(map[string]any)
			}
		}
	}
	t.Fatalf("no webhook %s", name)
	return nil
}
