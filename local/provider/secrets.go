package provider

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Secret volumes, as the kubelet makes them: the Secret's keys (or the items it lists) as files in a
// directory of the pod's, mounted read-only. A Secret that does not exist (or lacks a listed key)
// keeps the pod in ContainerCreating, looked up again with back-off, with a FailedMount Event, until
// it appears or the pod is deleted; an optional one gives an empty directory. The provider plays
// the kubelet here: it reads the Secret so the pod's own processes get it, and nothing else does.

const (
	secretRetryFirst = time.Second
	secretRetryMax   = 30 * time.Second
)

// secretVolumeDir is where pod podDir keeps Secret volume name, as the kubelet lays it out.
func secretVolumeDir(podDir, name string) string {
	return filepath.Join(podDir, "volumes", "kubernetes.io~secret", name)
}

// secretVolume waits for the Secret of volume name and writes it out.
func (r *podRun) secretVolume(name string, src *corev1.SecretVolumeSource) (volume, error) {
	return r.waitVolume(name, func() (volume, error) { return r.writeSecretVolume(name, src) })
}

// waitVolume writes volume name with write until it succeeds or fails for good: while what it
// needs is not there yet (an error wrapping errVolumeNotReady), the pod waits in ContainerCreating
// with FailedMount Events, as a kubelet's does.
func (r *podRun) waitVolume(name string, write func() (volume, error)) (volume, error) {
	backoff := secretRetryFirst
	for first := true; ; first = false {
		vol, err := write()
		if err == nil || !errors.Is(err, errVolumeNotReady) {
			return vol, err
		}
		if first {
			// Nothing else reports the pod while it waits: show it Pending, ContainerCreating.
			r.update(func(*corev1.PodStatus) {})
		}
		r.p.log.Info("waiting for a volume's object", "pod", r.key, "volume", name, "reason", err.Error())
		r.p.event(r.snapshot(), corev1.EventTypeWarning, "FailedMount", fmt.Sprintf("MountVolume.SetUp failed for volume %q : %v", name, err))
		select {
		case <-r.stopCh:
			return volume{}, errStopped
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, secretRetryMax)
	}
}

// errVolumeNotReady: what a volume needs (a Secret or a key it must have, a ConfigMap, a claim's
// binding) is not there yet.
var errVolumeNotReady = errors.New("not ready")

// writeSecretVolume writes the Secret's files into the volume's directory; an error wrapping
// errVolumeNotReady is worth retrying.
func (r *podRun) writeSecretVolume(name string, src *corev1.SecretVolumeSource) (volume, error) {
	optional := src.Optional != nil && *src.Optional
	dir := secretVolumeDir(r.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return volume{}, err
	}
	s, err := r.p.secrets.Secrets(r.pod.Namespace).Get(src.SecretName)
	switch {
	case apierrors.IsNotFound(err) && optional:
		return volume{path: dir, readOnly: true}, nil
	case apierrors.IsNotFound(err):
		return volume{}, fmt.Errorf("secret %q not found: %w", src.SecretName, errVolumeNotReady)
	case err != nil:
		return volume{}, fmt.Errorf("secret %q: %w", src.SecretName, err)
	}
	files, err := secretFiles(s, src)
	if err != nil {
		return volume{}, err
	}
	if err := writeFiles(dir, files); err != nil {
		return volume{}, err
	}
	return volume{path: dir, readOnly: true}, nil
}

// writeFiles writes files (by relative path, each checked to stay in dir) into dir.
func writeFiles(dir string, files map[string]secretFile) error {
	for rel, f := range files {
		if !filepath.IsLocal(rel) {
			return fmt.Errorf("path %q leaves the volume", rel)
		}
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, f.data, f.mode); err != nil {
			return err
		}
		if err := os.Chmod(path, f.mode); err != nil { // past the umask
			return err
		}
	}
	return nil
}

type secretFile struct {
	data []byte
	mode os.FileMode
}

// secretFiles are the files of Secret s that volume src projects, by path in the volume: every key,
// or the listed items. Paths are the API server's validated ones; a path that would leave the
// volume is refused all the same.
func secretFiles(s *corev1.Secret, src *corev1.SecretVolumeSource) (map[string]secretFile, error) {
	mode := os.FileMode(corev1.SecretVolumeSourceDefaultMode)
	if src.DefaultMode != nil {
		mode = os.FileMode(*src.DefaultMode) & 0o777
	}
	out := map[string]secretFile{}
	if len(src.Items) == 0 {
		for k, v := range s.Data {
			if !filepath.IsLocal(k) {
				return nil, fmt.Errorf("secret %q: key %q is not a file name", s.Name, k)
			}
			out[k] = secretFile{data: v, mode: mode}
		}
		return out, nil
	}
	for _, it := range src.Items {
		v, ok := s.Data[it.Key]
		if !ok {
			if src.Optional != nil && *src.Optional {
				continue
			}
			return nil, fmt.Errorf("couldn't find key %s in Secret %s/%s: %w", it.Key, s.Namespace, s.Name, errVolumeNotReady)
		}
		if !filepath.IsLocal(it.Path) {
			return nil, fmt.Errorf("secret %q: item path %q leaves the volume", s.Name, it.Path)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode) & 0o777
		}
		out[it.Path] = secretFile{data: v, mode: m}
	}
	return out, nil
}
