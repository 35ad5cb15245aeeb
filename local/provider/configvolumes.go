package provider

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ConfigMap, downwardAPI and projected volumes, as the kubelet makes them: files in a directory of
// the pod's (the kubelet's layout, kubernetes.io~configmap and so on), mounted read-only. A missing
// ConfigMap (or service account, for a token) keeps the pod in ContainerCreating with FailedMount
// Events until it appears, as for a Secret (secrets.go); an optional one gives no files. As with
// Secrets, the provider plays the kubelet: it reads the objects and asks for tokens on behalf of
// the pod, and writes them for the pod's processes only.
//
// Unlike the kubelet, the provider writes the files once, when the pod starts: it does not update
// them when the object changes, nor rotate a token (qvirt's launcher reads them once, at start).

// volumeDir is where pod podDir keeps volume name of the kubelet volume plugin plugin
// ("kubernetes.io~configmap", ...).
func volumeDir(podDir, plugin, name string) string {
	return filepath.Join(podDir, "volumes", plugin, name)
}

// defaultTokenSeconds is a projected token's lifetime when the volume does not say, the API's.
const defaultTokenSeconds = 3600

func modeOf(defaultMode *int32, def int32) os.FileMode {
	if defaultMode != nil {
		return os.FileMode(*defaultMode) & 0o777
	}
	return os.FileMode(def) & 0o777
}

// configMapVolume waits for the ConfigMap of volume name and writes it out.
func (r *podRun) configMapVolume(name string, src *corev1.ConfigMapVolumeSource) (volume, error) {
	return r.waitVolume(name, func() (volume, error) {
		files, err := r.configMapFiles(src.LocalObjectReference, src.Items, src.Optional, modeOf(src.DefaultMode, corev1.ConfigMapVolumeSourceDefaultMode))
		if err != nil {
			return volume{}, err
		}
		return r.writeVolume(volumeDir(r.dir, "kubernetes.io~configmap", name), files)
	})
}

// downwardAPIVolume writes the pod's fields of volume name.
func (r *podRun) downwardAPIVolume(name string, src *corev1.DownwardAPIVolumeSource) (volume, error) {
	files, err := r.downwardAPIFiles(src.Items, modeOf(src.DefaultMode, corev1.DownwardAPIVolumeSourceDefaultMode))
	if err != nil {
		return volume{}, err
	}
	return r.writeVolume(volumeDir(r.dir, "kubernetes.io~downward-api", name), files)
}

// projectedVolume waits for the objects of projected volume name and writes their files into one
// directory.
func (r *podRun) projectedVolume(name string, src *corev1.ProjectedVolumeSource) (volume, error) {
	mode := modeOf(src.DefaultMode, corev1.ProjectedVolumeSourceDefaultMode)
	return r.waitVolume(name, func() (volume, error) {
		files := map[string]secretFile{}
		for i, p := range src.Sources {
			part, err := r.projection(&p, mode)
			if err != nil {
				return volume{}, fmt.Errorf("sources[%d]: %w", i, err)
			}
			maps.Copy(files, part)
		}
		return r.writeVolume(volumeDir(r.dir, "kubernetes.io~projected", name), files)
	})
}

func (r *podRun) projection(p *corev1.VolumeProjection, mode os.FileMode) (map[string]secretFile, error) {
	switch {
	case p.Secret != nil:
		s, err := r.p.secrets.Secrets(r.pod.Namespace).Get(p.Secret.Name)
		if err != nil {
			return objectMissing("secret", p.Secret.Name, p.Secret.Optional, err)
		}
		return keyedFiles("secret", s.Name, s.Data, p.Secret.Items, p.Secret.Optional, mode)
	case p.ConfigMap != nil:
		return r.configMapFiles(p.ConfigMap.LocalObjectReference, p.ConfigMap.Items, p.ConfigMap.Optional, mode)
	case p.DownwardAPI != nil:
		return r.downwardAPIFiles(p.DownwardAPI.Items, mode)
	case p.ServiceAccountToken != nil:
		return r.tokenFile(p.ServiceAccountToken, mode)
	}
	return nil, fmt.Errorf("only secret, configMap, downwardAPI and serviceAccountToken projections are supported by the local node provider")
}

// objectMissing is a missing object's outcome: no files when it is optional, else a wait.
func objectMissing(kind, name string, opt *bool, err error) (map[string]secretFile, error) {
	switch {
	case apierrors.IsNotFound(err) && optional(opt):
		return nil, nil
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("%s %q not found: %w", kind, name, errVolumeNotReady)
	}
	return nil, fmt.Errorf("%s %q: %w", kind, name, err)
}

func (r *podRun) configMapFiles(ref corev1.LocalObjectReference, items []corev1.KeyToPath, opt *bool, mode os.FileMode) (map[string]secretFile, error) {
	cm, err := r.p.configMaps.ConfigMaps(r.pod.Namespace).Get(ref.Name)
	if err != nil {
		return objectMissing("configmap", ref.Name, opt, err)
	}
	data := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		data[k] = []byte(v)
	}
	maps.Copy(data, cm.BinaryData)
	return keyedFiles("configmap", cm.Name, data, items, opt, mode)
}

// keyedFiles are the files of an object's keys (a Secret's or a ConfigMap's): every key, or the
// listed items.
func keyedFiles(kind, name string, data map[string][]byte, items []corev1.KeyToPath, opt *bool, mode os.FileMode) (map[string]secretFile, error) {
	out := map[string]secretFile{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = secretFile{data: v, mode: mode}
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional(opt) {
				continue
			}
			return nil, fmt.Errorf("couldn't find key %s in %s %s: %w", it.Key, kind, name, errVolumeNotReady)
		}
		out[it.Path] = secretFile{data: v, mode: modeOf(it.Mode, int32(mode))}
	}
	return out, nil
}

// downwardAPIFiles are the pod's fields as a downward API volume writes them: labels and
// annotations as sorted key="value" lines (the kubelet's fieldpath.FormatMap), other fields as
// their value.
func (r *podRun) downwardAPIFiles(items []corev1.DownwardAPIVolumeFile, mode os.FileMode) (map[string]secretFile, error) {
	out := map[string]secretFile{}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil && it.FieldRef.FieldPath == "metadata.labels":
			v = formatMap(r.pod.Labels)
		case it.FieldRef != nil && it.FieldRef.FieldPath == "metadata.annotations":
			v = formatMap(r.pod.Annotations)
		case it.FieldRef != nil:
			v, err = podField(r.pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = r.resourceField(it.ResourceFieldRef)
		default:
			err = fmt.Errorf("names neither fieldRef nor resourceFieldRef")
		}
		if err != nil {
			return nil, fmt.Errorf("downwardAPI item %s: %w", it.Path, err)
		}
		out[it.Path] = secretFile{data: []byte(v), mode: modeOf(it.Mode, int32(mode))}
	}
	return out, nil
}

func (r *podRun) resourceField(ref *corev1.ResourceFieldSelector) (string, error) {
	i := slices.IndexFunc(r.pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == ref.ContainerName })
	if i < 0 {
		return "", fmt.Errorf("resourceFieldRef names container %q, which the pod does not have", ref.ContainerName)
	}
	return containerResource(&r.pod.Spec.Containers[i], ref, defaultCapacity())
}

func formatMap(m map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(m)) {
		fmt.Fprintf(&b, "%s=%q\n", k, m[k])
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// tokenFile asks kube-apiserver for a token of the pod's service account bound to the pod, as the
// kubelet does for a serviceAccountToken projection.
func (r *podRun) tokenFile(p *corev1.ServiceAccountTokenProjection, mode os.FileMode) (map[string]secretFile, error) {
	sa := r.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(ptr.Deref(p.ExpirationSeconds, defaultTokenSeconds)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: r.pod.Name, UID: r.pod.UID},
	}}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	tr, err := r.p.client.CoreV1().ServiceAccounts(r.pod.Namespace).CreateToken(context.Background(), sa, req, metav1.CreateOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("serviceaccount %q not found: %w", sa, errVolumeNotReady)
	}
	if err != nil {
		return nil, fmt.Errorf("token of serviceaccount %q: %w", sa, err)
	}
	return map[string]secretFile{p.Path: {data: []byte(tr.Status.Token), mode: mode}}, nil
}

// writeVolume writes files into a new directory dir and gives it as a read-only volume.
func (r *podRun) writeVolume(dir string, files map[string]secretFile) (volume, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return volume{}, err
	}
	if err := writeFiles(dir, files); err != nil {
		return volume{}, err
	}
	return volume{path: dir, readOnly: true}, nil
}
