package registry

import (
	"context"
	"fmt"
	"os"

	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// BusyboxPath is where Debian's busybox-static puts the binary (hack/install-deps.sh installs it).
const BusyboxPath = "/bin/busybox"

// PauseRepo is the sandbox ("pause") image containerd runs first in every pod of a real kubelet
// node: no internet registry is reachable, so local mode serves its own.
const PauseRepo = "qvirt/pause:local"

// PushPause pushes the sandbox image to <registryAddr>/PauseRepo and returns its reference. It is
// busybox sleeping: a pod sandbox only holds the pod's namespaces open.
func PushPause(ctx context.Context, registryAddr string) (string, error) {
	ref := registryAddr + "/" + PauseRepo
	return ref, PushBusybox(ctx, ref, []string{BusyboxPath, "sleep", "2147483647"})
}

// PushBusybox pushes a linux/amd64 image holding the host's static busybox at BusyboxPath whose
// entrypoint is entrypoint, to ref over plain HTTP. Same busybox, same digest.
func PushBusybox(ctx context.Context, ref string, entrypoint []string) error {
	if _, err := os.Stat(BusyboxPath); err != nil {
		return fmt.Errorf("busybox image %s: %w (install Debian's busybox-static)", ref, err)
	}
	img, err := imageOf(tarFile{name: BusyboxPath, src: BusyboxPath, mode: 0o755})
	if err != nil {
		return fmt.Errorf("busybox image %s: %w", ref, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.Config.Entrypoint = entrypoint
	cfg.Config.Env = []string{"PATH=/bin"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	return push(ctx, ref, img)
}
