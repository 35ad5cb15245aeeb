// Package cli is qvirtctl's command tree. `qvirtctl local` runs the separate qvirt-local binary
// (local/localcli), so that nothing here links the local cluster or a reconciler.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/qvirt/qvirt/cli/kube"
)

// PluginName is the executable name kubectl looks for to run `kubectl qvirt ...`; link or copy
// qvirtctl under this name into a directory on PATH.
const PluginName = "kubectl-qvirt"

// env is what every user command shares: the connection flags and the name the user typed.
type env struct {
	flags *kube.Flags
	// self is how the user invokes us, "qvirtctl" or "kubectl qvirt", for messages and hints.
	self string
}

func (e *env) connect() (*kube.Client, error) { return e.flags.Connect() }

// DisplayName is how usage strings name the program run as argv0: "kubectl qvirt" when the binary
// runs as the kubectl plugin kubectl-qvirt, else "qvirtctl".
func DisplayName(argv0 string) string {
	base := strings.TrimSuffix(filepath.Base(argv0), ".exe")
	if base == PluginName {
		return "kubectl qvirt"
	}
	return "qvirtctl"
}

// New is qvirtctl's whole command tree: the user commands, with kubectl's connection flags on
// every command, and `local`, which runs qvirt-local. argv0 picks the display name.
func New(argv0 string) *cobra.Command {
	root := &cobra.Command{Use: "qvirtctl", Short: "Drive qvirt virtual machines", SilenceUsage: true}
	e := &env{flags: kube.NewFlags(), self: DisplayName(argv0)}
	if e.self != "qvirtctl" {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: e.self}
	}
	root.SilenceErrors = true
	root.Long = "Drive qvirt virtual machines: lifecycle actions, serial console, VNC, QMP shell, live\n" +
		"migration and volume hotplug, through the cluster's qvirt-api (subresources.qvirt.io).\n\n" +
		"Connection flags work exactly as kubectl's: --kubeconfig (else $KUBECONFIG, else\n" +
		"~/.kube/config), --context, -n/--namespace (default: the context's namespace, else default).\n" +
		"Installed as " + PluginName + " on PATH it also runs as `kubectl qvirt ...`."
	e.flags.Bind(root.PersistentFlags())
	root.AddCommand(
		newStart(e), newStop(e), newRestart(e),
		newPause(e, true), newPause(e, false), newSoftReboot(e),
		newConsole(e), newVNC(e), newUSBRedir(e), newQMP(e), newMigrate(e), newMigrateList(e), newMigrateCancel(e),
		newAddVolume(e), newRemoveVolume(e),
		newGuestOSInfo(e), newUserList(e), newFileSystemList(e),
		newVersion(e), newMachine(), newLocal(e), newCreate(),
	)
	return root
}

// Main runs the command line args (os.Args) and returns the process's exit code; errors are printed
// to stderr the way kubectl prints them.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := New(args[0])
	root.SetArgs(args[1:])
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Ctrl+C ends long-running commands (vnc, migrate --wait) through their context, so they clean
	// up; the console's raw terminal turns Ctrl+C into a byte for the guest instead.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, FormatError(err))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}
