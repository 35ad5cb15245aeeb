package admission_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/internal/cdi"
	testcdi "github.com/qvirt/qvirt/test/cdi"
)

const (
	itLabel   = "instancetype.kubevirt.io/default-instancetype"
	prefLabel = "instancetype.kubevirt.io/default-preference"
)

// TestInferFromDataVolumes: inferFromVolume on a dataVolume volume follows KubeVirt's chain: the
// VM's DataVolume template's source (a claim it clones, in another namespace too, or a DataSource,
// labelled itself or through its claim), a DataVolume that exists (its labels), and the claim of a
// DataVolume already garbage-collected; a source it cannot follow is refused naming the field and
// saying what was looked at. CDI is played: stand-ins of its CRDs and objects written by the test.
func TestInferFromDataVolumes(t *testing.T) {
	startWebhook(t)
	testcdi.InstallCRDs(t, cp.Config)
	ctx := context.Background()
	labels := map[string]string{itLabel: "inf-small", prefLabel: "inf-pref", prefLabel + "-kind": "VirtualMachinePreference"}
	create := func(o client.Object) {
		t.Helper()
		if err := cp.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
		t.Cleanup(func() { _ = cp.Client.Delete(context.Background(), o) })
	}
	create(&v1alpha1.VirtualMachineClusterInstancetype{ObjectMeta: metav1.ObjectMeta{Name: "inf-small"},
		Spec: v1alpha1.VirtualMachineInstancetypeSpec{CPU: v1alpha1.CPUInstancetype{Guest: 1}, Memory: v1alpha1.MemoryInstancetype{Guest: resource.MustParse("128Mi")}}})
	create(&v1alpha1.VirtualMachinePreference{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "inf-pref"}})
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "os-images"}})
	claim := func(ns, name string, labels map[string]string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	}
	create(claim("os-images", "fedora-golden", labels))
	create(claim("default", "collected", labels))
	dataSource := func(ns, name string, labels map[string]string, spec map[string]any) *unstructured.Unstructured {
		ds := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		ds.SetGroupVersionKind(cdi.DataSourceGVK)
		ds.SetNamespace(ns)
		ds.SetName(name)
		ds.SetLabels(labels)
		return ds
	}
	create(dataSource("os-images", "fedora", nil, map[string]any{"source": map[string]any{"pvc": map[string]any{"name": "fedora-golden"}}}))
	create(dataSource("default", "centos", labels, map[string]any{"source": map[string]any{}}))
	create(dataSource("default", "bare", nil, map[string]any{"source": map[string]any{}}))
	dv := cdi.New("default", "existing-dv")
	dv.Object["spec"] = map[string]any{"source": map[string]any{"blank": map[string]any{}}}
	dv.SetLabels(labels)
	create(dv)

	// vm infers both references from volume root, a dataVolume volume of DataVolume dvName with
	// template spec tmpl (none when nil).
	vm := func(name, dvName string, tmpl map[string]any) []byte {
		o := itVM(t, map[string]any{"inferFromVolume": "root"})
		spec := o["spec"].(map[string]any)
		spec["preference"] = map[string]any{"inferFromVolume": "root"}
		ts := templateSpec(o)
		ts["volumes"] = append(ts["volumes"].([]any), map[string]any{"name": "root", "dataVolume": map[string]any{"name": dvName}})
		if tmpl != nil {
			spec["dataVolumeTemplates"] = []any{map[string]any{"metadata": map[string]any{"name": dvName}, "spec": tmpl}}
		}
		return mustJSON(t, o, name)
	}
	storage := map[string]any{"resources": map[string]any{"requests": map[string]any{"storage": "1Gi"}}}
	inferred := map[string][]byte{
		"a template cloning a DataSource whose claim is labelled": vm("via-ds", "root", map[string]any{
			"sourceRef": map[string]any{"kind": "DataSource", "name": "fedora", "namespace": "os-images"}, "storage": storage}),
		"a template cloning a claim in another namespace": vm("via-pvc", "root", map[string]any{
			"source": map[string]any{"pvc": map[string]any{"name": "fedora-golden", "namespace": "os-images"}}, "storage": storage}),
		"a template naming a labelled DataSource of the VM's namespace": vm("via-labelled-ds", "root", map[string]any{
			"sourceRef": map[string]any{"kind": "DataSource", "name": "centos"}, "storage": storage}),
		"a DataVolume that exists":                  vm("via-dv", "existing-dv", nil),
		"a DataVolume garbage-collected, its claim": vm("via-collected", "collected", nil),
	}
	for name, manifest := range inferred {
		t.Run(name, func(t *testing.T) {
			out, stderr, err := kubectlDefault(manifest, "create", "--dry-run=server", "-o", "json", "-f", "-")
			if err != nil {
				t.Fatalf("refused: %v: %s", err, stderr)
			}
			var got struct {
				Spec struct{ Instancetype, Preference map[string]any }
			}
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatal(err)
			}
			if it := got.Spec.Instancetype; it["name"] != "inf-small" || it["inferFromVolume"] != nil {
				t.Errorf("stored spec.instancetype %v, want inf-small inferred", it)
			}
			if p := got.Spec.Preference; p["name"] != "inf-pref" || p["kind"] != "VirtualMachinePreference" {
				t.Errorf("stored spec.preference %v, want inf-pref of kind VirtualMachinePreference", p)
			}
		})
	}

	refused := map[string]struct {
		manifest []byte
		want     string
	}{
		"a template importing over HTTP": {vm("via-http", "root", map[string]any{
			"source": map[string]any{"http": map[string]any{"url": "http://example.com/disk.img"}}, "storage": storage}),
			`volume "root": DataVolume template "root" has neither a source.pvc nor a sourceRef to a DataSource to infer from`},
		"a DataSource with neither labels nor a claim": {vm("via-bare", "root", map[string]any{
			"sourceRef": map[string]any{"kind": "DataSource", "name": "bare"}, "storage": storage}),
			`DataSource "bare" of volume "root" has no ` + itLabel + ` label`},
		"a DataSource that does not exist": {vm("via-missing", "root", map[string]any{
			"sourceRef": map[string]any{"kind": "DataSource", "name": "rhel", "namespace": "os-images"}, "storage": storage}),
			`volume "root": DataSource "os-images/rhel" not found`},
		"neither a DataVolume nor a claim": {vm("via-nothing", "nothing", nil),
			`volume "root": PersistentVolumeClaim "nothing" not found`},
	}
	for name, tc := range refused {
		t.Run(name, func(t *testing.T) {
			_, stderr, err := kubectlDefault(tc.manifest, "create", "--dry-run=server", "-f", "-")
			if err == nil || !strings.Contains(stderr, "spec.instancetype.inferFromVolume") || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v: %s; want a refusal naming spec.instancetype.inferFromVolume with %q", err, stderr, tc.want)
			}
		})
	}
}
