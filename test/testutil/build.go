package testutil

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// BuildCommands builds qvirt's commands (all of them when cmds is empty) into the directory bin
// the way `make build` does, by running it: how each is built (the launcher static) is said once,
// in the Makefile.
func BuildCommands(repo, bin string, cmds ...string) error {
	// make -C would take a relative bin from repo.
	bin, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
	args := []string{"-C", repo, "--no-print-directory", "build", "BIN=" + bin}
	if len(cmds) > 0 {
		args = append(args, "CMDS="+strings.Join(cmds, " "))
	}
	if out, err := exec.Command("make", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("make %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
