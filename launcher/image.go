package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/qvirt/qvirt/machine"
)

// PullerName is the image puller binary (cmd/qvirt-pull) the launcher execs for images that are
// not file:// references. It is a separate process so that the long-lived launcher does not link
// go-containerregistry (about 1.4 MiB of RSS per VM, measured).
const PullerName = "qvirt-pull"

// pullTimeout bounds one pull, including the wait for another launcher pulling the same image.
const pullTimeout = 10 * time.Minute

// pullImage gets image into the user's image cache (h.ImageCache) through the puller and returns
// the directory of its filesystem: `qvirt-launcher run` only, outside Kubernetes, where the user
// running the launcher owns the cache. Concurrent launchers share the cache; the puller locks per
// digest.
func (h HostResolver) pullImage(ref machine.ImageRef) (string, error) {
	image, policy := ref.Ref, ref.PullPolicy
	if ref.PullSecret != "" {
		return "", errors.New("imagePullSecret needs a cluster: `qvirt-launcher run` pulls anonymously")
	}
	if h.ImageCache == "" {
		return "", errors.New("this launcher has no image cache (--image-cache), so it can only use file:// images")
	}
	puller, err := h.puller()
	if err != nil {
		return "", err
	}
	args := []string{"--cache", h.ImageCache, "--policy", string(policy)}
	for _, r := range h.InsecureRegistries {
		args = append(args, "--insecure-registry", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pullTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, puller, append(args, "--", image)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return "", errors.New(msg)
		}
		return "", fmt.Errorf("run %s: %w", puller, err)
	}
	return checkPulledDir(strings.TrimSpace(stdout.String()), h.ImageCache)
}

// puller is h.Puller, else qvirt-pull beside the launcher's own binary, else on $PATH.
func (h HostResolver) puller() (string, error) {
	if h.Puller != "" {
		return h.Puller, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), PullerName)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(PullerName)
	if err != nil {
		return "", fmt.Errorf("image puller %s not found beside the launcher or on $PATH", PullerName)
	}
	return p, nil
}

// checkPulledDir accepts only a directory inside the cache from the puller.
func checkPulledDir(dir, cache string) (string, error) {
	cache, err := filepath.Abs(cache)
	if err != nil {
		return "", err
	}
	if rel, err := filepath.Rel(cache, dir); err != nil || !filepath.IsAbs(dir) || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("image puller answered %q, not a directory inside the image cache %s", dir, cache)
	}
	return dir, nil
}

// ImageMounts are where a launcher pod mounts its images, read-only (podlayout.KernelBootDir and
// podlayout.ContainerDiskDir in a pod).
type ImageMounts struct {
	// KernelBoot is the kernelBoot image's mount.
	KernelBoot string
	// ContainerDisks holds each containerDisk volume's image at ContainerDisks/<volume name>.
	ContainerDisks string
}

// The disk of a containerDisk volume shares its name (KubeVirt's convention, kept by the
// translation), so the disk's name finds its volume's mount.
func (m *ImageMounts) containerDisk(disk string) string {
	if m == nil {
		return ""
	}
	return filepath.Join(m.ContainerDisks, filepath.Base(filepath.Clean("/"+disk)))
}

func (m *ImageMounts) kernelBoot() string {
	if m == nil {
		return ""
	}
	return m.KernelBoot
}

// mountedImage is the mount of ref's image volume; a file:// reference has none, since in a pod
// only trusted code provides images.
func mountedImage(ref machine.ImageRef, mount string) (string, error) {
	if strings.HasPrefix(ref.Ref, "file://") {
		return "", errors.New("file:// images are for `qvirt-launcher run` only: a launcher pod reads its images from image volumes")
	}
	dir, err := existingDir(mount)
	if err != nil {
		return "", fmt.Errorf("image %s is not mounted in this launcher pod: %w", ref.Ref, err)
	}
	return dir, nil
}
