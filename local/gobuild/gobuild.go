// Package gobuild builds upstream Go commands local mode needs (the CNI plugins, Multus) with the
// go command from the Go module proxy, each in a throwaway module that requires only it, so that
// its own dependencies resolve as upstream pinned them rather than as qvirt's go.mod would.
package gobuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Build runs `go build -trimpath [flags] -o out pkgs...` in a throwaway module that requires
// module at version. out is a file, or a directory when it ends in "/". CGO is off: the commands
// run on the host, not against its C libraries.
func Build(ctx context.Context, module, version, out string, flags []string, pkgs ...string) error {
	work, err := os.MkdirTemp("", "qvirt-gobuild-")
	if err != nil {
		return fmt.Errorf("build %s: %w", module, err)
	}
	defer os.RemoveAll(work)
	gomod := fmt.Sprintf("module qvirt.local/build\n\ngo %s\n\nrequire %s %s\n", strings.TrimPrefix(runtime.Version(), "go"), module, version)
	if err := os.WriteFile(filepath.Join(work, "go.mod"), []byte(gomod), 0o644); err != nil {
		return fmt.Errorf("build %s: %w", module, err)
	}
	args := append(append([]string{"build", "-trimpath"}, flags...), "-o", out)
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = work
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off", "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s %s: %w: %s", module, version, err, b)
	}
	return nil
}
