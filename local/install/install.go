// Package install installs qvirt on a cluster of real kubelet nodes as README's "Install on a
// cluster" tells an administrator to: it builds the four component images (internal/images, what
// `make images` runs), pushes them to a registry (`make push`), and applies config/default with
// `kubectl apply -k` through a kustomize overlay that sets only `images:` (the pushed digests) and
// qvirt-config's data (launcherImage and what the caller adds); then it waits for qvirt-controller,
// qvirt-api and the qvirt-handler DaemonSet to roll out. `qvirtctl local up --runtime containerd`
// and the real-node tests use it; applying another build over an installed one is an upgrade.
package install

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/qvirt/qvirt/internal/images"
)

// Namespace is where config/default installs qvirt.
const Namespace = "qvirt-system"

// Options say what to build and where to install it.
type Options struct {
	// Repo is the qvirt source tree: its Go module is built, its config/default applied.
	Repo string
	// Registry is host:port of a registry the nodes pull from, over plain HTTP.
	Registry string
	// Kubectl and Kubeconfig run kubectl as the cluster's administrator.
	Kubectl, Kubeconfig string
	// Dir receives the overlay (kustomization.yaml) and the built image layout.
	Dir string
	// Epoch is the images' time stamp: another epoch is another build (other digests) of the same
	// sources.
	Epoch time.Time
	// Config is qvirt-config's data to set beside launcherImage (useEmulation, ...).
	Config map[string]string
	// Rollout bounds the wait for the components to roll out.
	Rollout time.Duration
}

// Installed is what Apply installed.
type Installed struct {
	// Images are the pushed references by image name (qvirt-launcher, ...), pinned by digest.
	Images map[string]string
	// Dir is the overlay applied: `kubectl delete -k Dir` uninstalls.
	Dir string
}

// Apply builds, pushes and applies, and waits for the rollout.
func Apply(ctx context.Context, o Options) (*Installed, error) {
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	var err error
	if o.Repo, err = filepath.Abs(o.Repo); err != nil {
		return nil, err
	}
	if o.Dir, err = filepath.Abs(o.Dir); err != nil {
		return nil, err
	}
	pushed, err := buildAndPush(ctx, o)
	if err != nil {
		return nil, err
	}
	in := &Installed{Images: map[string]string{}, Dir: o.Dir}
	for _, p := range pushed {
		name := strings.TrimSuffix(p.Ref[strings.LastIndex(p.Ref, "/")+1:], ":latest")
		in.Images[name] = o.Registry + "/qvirt/" + name + "@" + p.Digest.String()
	}
	if in.Images["qvirt-launcher"] == "" {
		return nil, fmt.Errorf("the build pushed no qvirt-launcher image (%v)", in.Images)
	}
	kustomization, err := overlay(o, in.Images)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(o.Dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		return nil, err
	}
	if out, err := kubectl(ctx, o, "apply", "-k", o.Dir); err != nil {
		return nil, fmt.Errorf("kubectl apply -k %s: %w\n%s", o.Dir, err, out)
	}
	rollout := o.Rollout
	if rollout == 0 {
		rollout = 5 * time.Minute
	}
	if out, err := kubectl(ctx, o, "-n", Namespace, "rollout", "status", "--timeout="+rollout.String(),
		"deploy/qvirt-controller", "deploy/qvirt-api", "ds/qvirt-handler"); err != nil {
		return in, fmt.Errorf("qvirt did not roll out: %w\n%s", err, out)
	}
	return in, nil
}

// buildAndPush builds the images into Dir/images and pushes them.
func buildAndPush(ctx context.Context, o Options) ([]images.Pushed, error) {
	lock, err := images.ReadLock(filepath.Join(o.Repo, "hack", "images", "debs.lock"))
	if err != nil {
		return nil, err
	}
	cache, err := images.DefaultCacheDir()
	if err != nil {
		return nil, err
	}
	layout := filepath.Join(o.Dir, "images")
	if _, err := images.Build(ctx, images.Options{ModuleDir: o.Repo, Lock: lock, Fetcher: &images.Fetcher{CacheDir: cache}, OutDir: layout, Epoch: o.Epoch}); err != nil {
		return nil, fmt.Errorf("build the images: %w", err)
	}
	pushed, err := images.Push(ctx, layout, o.Registry, true)
	if err != nil {
		return nil, fmt.Errorf("push the images to %s: %w", o.Registry, err)
	}
	return pushed, nil
}

// overlay is the kustomization over config/default: the images by digest, and qvirt-config's data.
func overlay(o Options, pushed map[string]string) (string, error) {
	base, err := filepath.Rel(o.Dir, filepath.Join(o.Repo, "config", "default"))
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "resources:\n- %s\nimages:\n", base)
	for _, name := range []string{"qvirt-api", "qvirt-controller", "qvirt-handler"} {
		ref, ok := pushed[name]
		if !ok {
			return "", fmt.Errorf("the build pushed no %s image", name)
		}
		repo, digest, _ := strings.Cut(ref, "@")
		fmt.Fprintf(&b, "- name: localhost:5000/qvirt/%s\n  newName: %s\n  digest: %s\n", name, repo, digest)
	}
	data := map[string]string{"launcherImage": pushed["qvirt-launcher"]}
	for k, v := range o.Config {
		data[k] = v
	}
	b.WriteString("patches:\n- patch: |-\n    apiVersion: v1\n    kind: ConfigMap\n    metadata:\n      name: qvirt-config\n      namespace: " + Namespace + "\n    data:\n")
	keys := make([]string, 0, len(data))
	for k := range data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "      %s: %q\n", k, data[k])
	}
	return b.String(), nil
}

func kubectl(ctx context.Context, o Options, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, o.Kubectl, append([]string{"--kubeconfig", o.Kubeconfig}, args...)...).CombinedOutput()
	return string(out), err
}
