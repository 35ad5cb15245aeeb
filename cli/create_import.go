package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/qvirt/qvirt/api/v1alpha1"
)

const importFlag = "--volume-import"

// importType is one --volume-import type: the keys it takes beside the common ones, whether it
// needs a size, and the DataVolume spec (CDI's DataVolumeSpec, without storage) it makes.
type importType struct {
	keys     []string
	sizeless bool
	spec     func(p map[string]string) (map[string]any, error)
}

// importTypes are virtctl's --volume-import types that qvirtctl writes (virtctl also has imageio
// and vddk, for migrating from oVirt and VMware, which need their own providers' details).
var importTypes = map[string]importType{
	"blank": {spec: func(map[string]string) (map[string]any, error) {
		return source("blank", map[string]any{}), nil
	}},
	"http":     {keys: []string{"url", "secretref", "certconfigmap"}, spec: urlSource("http", "secretRef", "certConfigMap")},
	"s3":       {keys: []string{"url", "secretref", "certconfigmap"}, spec: urlSource("s3", "secretRef", "certConfigMap")},
	"gcs":      {keys: []string{"url", "secretref"}, spec: urlSource("gcs", "secretRef")},
	"registry": {keys: []string{"url", "imagestream", "pullmethod", "secretref", "certconfigmap"}, spec: registrySource},
	"pvc":      {keys: []string{"src"}, sizeless: true, spec: cloneSource("pvc")},
	"snapshot": {keys: []string{"src"}, sizeless: true, spec: cloneSource("snapshot")},
	"ds":       {keys: []string{"src"}, sizeless: true, spec: dataSourceRef},
}

// addImport adds the DataVolume template of one --volume-import value and the volume using it.
func addImport(vm *v1alpha1.VirtualMachine, names map[string]bool, raw string) error {
	common := []string{"type", "name", "size", "bootorder"}
	all := slices.Clone(common)
	for _, it := range importTypes {
		all = append(all, it.keys...)
	}
	slices.Sort(all)
	p, err := parseVolumeParams(importFlag, raw, slices.Compact(all)...)
	if err != nil {
		return err
	}
	typ := p["type"]
	it, ok := importTypes[typ]
	if !ok {
		return fmt.Errorf("%s %q: type %q must be one of %s", importFlag, raw, typ, strings.Join(importTypeNames(), ", "))
	}
	for k := range p {
		if !slices.Contains(common, k) && !slices.Contains(it.keys, k) {
			return fmt.Errorf("%s %q: %s does not apply to type %s, which takes %s", importFlag, raw, k, typ, strings.Join(append(common, it.keys...), ", "))
		}
	}
	spec, err := it.spec(p)
	if err != nil {
		return fmt.Errorf("%s %q: %w", importFlag, raw, err)
	}
	storage := map[string]any{}
	switch size, ok := p["size"]; {
	case ok:
		q, err := resource.ParseQuantity(size)
		if err != nil || q.Sign() <= 0 {
			return fmt.Errorf("%s %q: size %q must be a positive quantity such as 10Gi", importFlag, raw, size)
		}
		storage["resources"] = map[string]any{"requests": map[string]any{"storage": q.String()}}
	case !it.sizeless:
		return fmt.Errorf("%s %q: size is required for type %s", importFlag, raw, typ)
	}
	spec["storage"] = storage
	name := p["name"]
	if name == "" {
		name = "imported-volume-" + rand.String(5)
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return fmt.Errorf("%s %q: name %q: %s", importFlag, raw, name, strings.Join(errs, "; "))
	}
	rawSpec, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("%s %q: encode the DataVolume spec: %w", importFlag, raw, err)
	}
	vol := v1alpha1.Volume{Name: name, VolumeSource: v1alpha1.VolumeSource{DataVolume: &v1alpha1.DataVolumeSource{Name: name}}}
	if err := addVolume(vm, names, importFlag, raw, vol, p); err != nil {
		return err
	}
	vm.Spec.DataVolumeTemplates = append(vm.Spec.DataVolumeTemplates, v1alpha1.DataVolumeTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: runtime.RawExtension{Raw: rawSpec}})
	return nil
}

func importTypeNames() []string {
	var out []string
	for t := range importTypes {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// source is a DataVolume spec with source kind set to body.
func source(kind string, body map[string]any) map[string]any {
	return map[string]any{"source": map[string]any{kind: body}}
}

// urlSource is the spec of a source that imports from url, with the optional keys named in CDI's
// spelling (secretRef, certConfigMap), given in lower case on the command line.
func urlSource(kind string, optional ...string) func(map[string]string) (map[string]any, error) {
	return func(p map[string]string) (map[string]any, error) {
		if p["url"] == "" {
			return nil, fmt.Errorf("url is required for type %s", kind)
		}
		body := map[string]any{"url": p["url"]}
		for _, k := range optional {
			if v := p[strings.ToLower(k)]; v != "" {
				body[k] = v
			}
		}
		return source(kind, body), nil
	}
}

func registrySource(p map[string]string) (map[string]any, error) {
	if (p["url"] == "") == (p["imagestream"] == "") {
		return nil, fmt.Errorf("give exactly one of url and imagestream for type registry")
	}
	if m := p["pullmethod"]; m != "" && m != "pod" && m != "node" {
		return nil, fmt.Errorf("pullmethod %q must be pod or node", m)
	}
	body := map[string]any{}
	for flag, field := range map[string]string{"url": "url", "imagestream": "imageStream", "pullmethod": "pullMethod",
		"secretref": "secretRef", "certconfigmap": "certConfigMap"} {
		if v := p[flag]; v != "" {
			body[field] = v
		}
	}
	return source("registry", body), nil
}

// cloneSource is the spec of a clone of claim or snapshot src, NAMESPACE/NAME (the namespace is
// required, as virtctl requires it).
func cloneSource(kind string) func(map[string]string) (map[string]any, error) {
	return func(p map[string]string) (map[string]any, error) {
		ns, name, ok := strings.Cut(p["src"], "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("src %q must be NAMESPACE/NAME for type %s", p["src"], kind)
		}
		return source(kind, map[string]any{"namespace": ns, "name": name}), nil
	}
}

// dataSourceRef is the spec of a clone of DataSource src, [NAMESPACE/]NAME.
func dataSourceRef(p map[string]string) (map[string]any, error) {
	src := p["src"]
	ns, name, found := strings.Cut(src, "/")
	if !found {
		ns, name = "", src
	}
	if name == "" || strings.Contains(name, "/") || (found && ns == "") {
		return nil, fmt.Errorf("src %q must be [NAMESPACE/]NAME for type ds", src)
	}
	ref := map[string]any{"kind": "DataSource", "name": name}
	if ns != "" {
		ref["namespace"] = ns
	}
	return map[string]any{"sourceRef": ref}, nil
}
