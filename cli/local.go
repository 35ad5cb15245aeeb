package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"
)

// LocalBinary runs the local cluster. It is a separate binary so that qvirtctl links neither the
// local cluster (virtual-kubelet, the supervisor) nor the reconcilers that cluster runs.
const LocalBinary = "qvirt-local"

// localDisplayNameEnv tells qvirt-local how the user invoked it (localcli.DisplayNameEnv; not
// imported, which would link what LocalBinary exists to keep out).
const localDisplayNameEnv = "QVIRT_LOCAL_DISPLAY_NAME"

// newLocal is `qvirtctl local ...`: it hands every argument, flags and --help included, to
// qvirt-local, which owns those commands and their flags.
func newLocal(e *env) *cobra.Command {
	return &cobra.Command{
		Use:                "local (up|down|status) [flags]",
		Short:              "A whole qvirt cluster on this machine (runs " + LocalBinary + ")",
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			path, err := findLocal()
			if err != nil {
				return err
			}
			return execLocal(path, args, e.self+" local")
		},
	}
}

// findLocal looks for qvirt-local beside this executable first (bin/ after make build, or the
// directory qvirtctl was installed in), so the pair that was built together runs together; then
// on PATH.
func findLocal() (string, error) {
	if self, err := os.Executable(); err == nil {
		if self, err = filepath.EvalSymlinks(self); err == nil {
			beside := filepath.Join(filepath.Dir(self), LocalBinary)
			if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return beside, nil
			}
		}
	}
	path, err := exec.LookPath(LocalBinary)
	if err == nil {
		return path, nil
	}
	if errors.Is(err, exec.ErrNotFound) {
		return "", withHint(fmt.Errorf("%s not found beside this executable nor on PATH", LocalBinary),
			"`make build` in the qvirt source tree builds it into bin/ beside qvirtctl")
	}
	return "", fmt.Errorf("look for %s on PATH: %w", LocalBinary, err)
}

// execLocal replaces this process with qvirt-local, so Ctrl-C, the exit code and `local down`'s
// signal to `local up` reach it directly. A variable for tests.
var execLocal = func(path string, args []string, displayName string) error {
	env := append(os.Environ(), localDisplayNameEnv+"="+displayName)
	if err := syscall.Exec(path, append([]string{path}, args...), env); err != nil {
		return fmt.Errorf("run %s: %w", path, err)
	}
	return nil
}
