package kubenode_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/qvirt/qvirt/internal/images"
	"github.com/qvirt/qvirt/test/envtest"
)

// install is qvirt as a cluster administrator installs it on the real nodes.
type install struct {
	// images are the pushed references by image name (qvirt-launcher, ...), pinned by digest.
	images map[string]string
	// dir is the kustomize overlay applied.
	dir string
}

// installQvirt builds the component images with internal/images (make images), pushes them to
// the local registry (make push), and applies config/default through an overlay that only does
// what the README's install section says an administrator does: point `images:` at the pushed
// digests, and set qvirt-config's launcherImage and useEmulation (no KVM here). It waits for
// qvirt-controller, qvirt-api and the qvirt-handler DaemonSet to roll out.
func installQvirt(t *testing.T, n *realNodes) *install {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	repo := envtest.RepoRoot()
	lock, err := images.ReadLock(filepath.Join(repo, "hack", "images", "debs.lock"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := images.DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	layout := t.TempDir()
	started := time.Now()
	if _, err := images.Build(ctx, images.Options{ModuleDir: repo, Lock: lock, Fetcher: &images.Fetcher{CacheDir: cache}, OutDir: layout}); err != nil {
		t.Fatalf("make images: %v", err)
	}
	pushed, err := images.Push(ctx, layout, n.registry, true)
	if err != nil {
		t.Fatalf("make push: %v", err)
	}
	t.Logf("images built and pushed in %.1fs", time.Since(started).Seconds())
	in := &install{images: map[string]string{}, dir: t.TempDir()}
	var kimages strings.Builder
	for _, p := range pushed {
		repoName := strings.TrimSuffix(p.Ref[strings.LastIndex(p.Ref, "/")+1:], ":latest")
		ref := n.registry + "/qvirt/" + repoName
		in.images[repoName] = ref + "@" + p.Digest.String()
		fmt.Fprintf(&kimages, "- name: localhost:5000/qvirt/%s\n  newName: %s\n  digest: %s\n", repoName, ref, p.Digest)
	}
	base, err := filepath.Rel(in.dir, filepath.Join(repo, "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	kustomization := "resources:\n- " + base + "\nimages:\n" + kimages.String() + `patches:
- patch: |-
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: qvirt-config
      namespace: qvirt-system
    data:
      useEmulation: "true"
      launcherImage: ` + in.images["qvirt-launcher"] + "\n"
	if err := os.WriteFile(filepath.Join(in.dir, "kustomization.yaml"), []byte(kustomization), 0o644); err != nil {
		t.Fatal(err)
	}
	n.kubectlOK(t, "apply", "-k", in.dir)
	if out, err := n.kubectl("-n", "qvirt-system", "rollout", "status", "--timeout=5m",
		"deploy/qvirt-controller", "deploy/qvirt-api", "ds/qvirt-handler"); err != nil {
		t.Fatalf("qvirt did not roll out: %v\n%s\n%s", err, out, n.describe("qvirt-system"))
	}
	return in
}

// describe is what an administrator looks at when pods do not come up: the namespace's pods, their
// descriptions (events included) and their containers' last log lines.
func (n *realNodes) describe(ns string) string {
	var b strings.Builder
	for _, args := range [][]string{{"get", "pods", "-o", "wide"}, {"describe", "pods"}, {"logs", "--all-containers", "--prefix", "--tail=30", "-l", "qvirt.io/app"}} {
		out, _ := n.kubectl(append([]string{"-n", ns}, args...)...)
		fmt.Fprintf(&b, "$ kubectl -n %s %s\n%s\n", ns, strings.Join(args, " "), out)
	}
	return b.String()
}

// kubectl runs the tools' kubectl as the cluster admin.
func (n *realNodes) kubectl(args ...string) (string, error) {
	cmd := exec.Command(n.kubectlBin, append([]string{"--kubeconfig", n.kubeconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func (n *realNodes) kubectlOK(t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.kubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}
