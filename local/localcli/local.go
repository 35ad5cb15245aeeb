// Package localcli is qvirt-local's command tree: `up`, `down` and `status` of a whole qvirt
// cluster on this machine. Users reach it as `qvirtctl local ...`, which execs qvirt-local, so that
// qvirtctl links neither the local cluster nor, through it, the reconcilers.
package localcli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"

	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/local/kubenode"
	"github.com/qvirt/qvirt/local/supervise"
)

// DefaultStateDir is where `qvirtctl local` keeps a local cluster (short: socket paths live under it).
const DefaultStateDir = "/var/lib/qvirt/local"

// New is qvirt-local's root command. Its name is what the user typed: `qvirtctl local` runs it
// as "qvirtctl local" so usage and errors read as the command they know.
func New(name string) *cobra.Command {
	local := &cobra.Command{
		Use: "qvirt-local", Short: "A whole qvirt cluster on this machine", SilenceUsage: true, SilenceErrors: true,
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: name},
		// Completion is qvirtctl's (`qvirtctl completion`), which covers `local` as one command.
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	var dir string
	local.PersistentFlags().StringVar(&dir, "state-dir", DefaultStateDir, "directory holding the local cluster (at most 40 bytes)")
	local.AddCommand(newLocalUp(&dir), newLocalDown(&dir), newLocalStatus(&dir))
	return local
}

// Main runs qvirt-local with args (os.Args) and returns the process's exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	name := filepath.Base(args[0])
	if n := os.Getenv(DisplayNameEnv); n != "" {
		name = n
	}
	root := New(name)
	root.SetArgs(args[1:])
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.Execute(); err != nil {
		// As qvirtctl prints errors that are not the API's, which it did when it ran these itself.
		fmt.Fprintln(stderr, "error: "+err.Error())
		return 1
	}
	return 0
}

// DisplayNameEnv carries the name the user typed ("qvirtctl local", "kubectl qvirt local") from
// qvirtctl, which execs qvirt-local, into qvirt-local's usage and messages.
const DisplayNameEnv = "QVIRT_LOCAL_DISPLAY_NAME"

func newLocalUp(dir *string) *cobra.Command {
	opts := cluster.Options{}
	var repo string
	var demo, emulationIfNeeded, cloudImage bool
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local cluster in the foreground; Ctrl-C takes it down",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Dir = *dir
			return localUp(cmd.Context(), cmd.OutOrStdout(), repo, opts, upExtras{demo: demo, emulationIfNeeded: emulationIfNeeded, cloudImage: cloudImage})
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Nodes, "nodes", 2, "virtual nodes to register")
	f.BoolVar(&opts.Emulation, "emulation", false, "run guests under software emulation (TCG) instead of KVM")
	f.BoolVar(&emulationIfNeeded, "emulation-if-needed", false, "use emulation when the KVM check guest fails, and say so")
	f.BoolVar(&demo, "demo", false, "apply "+demoSample+" and wait until the VM runs; push the cloud image for "+cloudSample+" when it is built")
	f.BoolVar(&cloudImage, "cloud-image", false, "build the cloud image if needed (test/guest/cloud/build.sh: 5-20 minutes the first time) and push it to the local registry")
	f.StringVar(&repo, "repo", "", "qvirt source tree (default: the one holding the current directory)")
	f.StringVar(&opts.Bin, "bin", "", "directory with qvirt-controller, qvirt-handler, qvirt-launcher (default: REPO/bin)")
	f.StringVar(&opts.Runtime, "runtime", cluster.RuntimeVirtual, "what runs the nodes' pods: "+cluster.RuntimeVirtual+
		" (virtual nodes: pods are host processes) or "+cluster.RuntimeContainerd+" (real kubelet nodes with containerd and runc)")
	f.StringVar(&opts.NodeBin, "node-bin", "", "directory with kubelet, containerd and containerd-shim-runc-v2 for --runtime containerd (default: built by REPO/hack/build-node.sh)")
	f.StringVar(&opts.Tools, "tools", "", "directory with the control-plane binaries (default: built by REPO/hack/build-tools.sh)")
	return cmd
}

// upExtras are local up's steps around the cluster itself.
type upExtras struct {
	demo, emulationIfNeeded bool
	// cloudImage builds the cloud image if needed and pushes it; demo alone pushes it only when
	// it is already built.
	cloudImage bool
}

func localUp(ctx context.Context, out io.Writer, repo string, opts cluster.Options, extras upExtras) error {
	var err error
	if repo, err = findRepo(repo); err != nil {
		return err
	}
	opts.Repo = repo
	if opts.Bin == "" {
		opts.Bin = filepath.Join(repo, "bin")
	}
	if opts.Tools == "" {
		fmt.Fprintln(out, "local up: building the control-plane binaries if needed (the first time takes 10-30 minutes)")
		if opts.Tools, err = buildTools(repo); err != nil {
			return err
		}
	}
	if opts.Runtime == cluster.RuntimeContainerd && opts.NodeBin == "" {
		fmt.Fprintln(out, "local up: building the kubelet and containerd if needed (the first time takes several minutes)")
		if opts.NodeBin, err = kubenode.BuildBinaries(repo); err != nil {
			return err
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return err
	}
	opts.CNICache = filepath.Join(cache, "qvirt", "cni")
	opts.Progress = out
	if err := os.MkdirAll(filepath.Join(opts.Dir, "logs"), 0o755); err != nil {
		return err
	}
	logFile, err := os.OpenFile(filepath.Join(opts.Dir, "logs", "nodes.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	opts.Log = funcr.NewJSON(func(obj string) { fmt.Fprintln(logFile, obj) }, funcr.Options{})
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := os.WriteFile(pidFile(opts.Dir), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile(opts.Dir))
	opts.EmulationIfNeeded = extras.emulationIfNeeded
	if extras.demo {
		if opts.GuestDir, err = buildGuest(ctx, out, repo); err != nil {
			return err
		}
	}
	cloudDir := ""
	if extras.demo || extras.cloudImage {
		if cloudDir, err = findCloudImage(ctx, out, repo, extras.cloudImage); err != nil {
			return err
		}
	}
	c, err := cluster.Up(ctx, opts)
	if err != nil {
		return err
	}
	if cloudDir != "" {
		if err := pushCloudImage(ctx, out, c, cloudDir); err != nil {
			c.Down()
			return err
		}
	}
	if extras.demo {
		if err := runDemo(ctx, out, repo, c, cloudDir != ""); err != nil {
			c.Down()
			return err
		}
	}
	fmt.Fprintf(out, `
The local cluster runs (%d nodes). In another terminal:
  export KUBECONFIG=%s
  kubectl get nodes
  kubectl apply -f %s
  kubectl get vmi
  qvirtctl console NAME        # a VM's serial console (Ctrl+] leaves)
qvirtctl local status shows its components; Ctrl-C here (or qvirtctl local down) stops it.
`, opts.Nodes, c.Kubeconfig, filepath.Join(repo, "config", "samples", "vm-demo.yaml"))
	<-ctx.Done()
	fmt.Fprintln(out, "local up: stopping: guests power off, then every component")
	c.Down()
	return nil
}

func newLocalDown(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop the local cluster (or clean up what a crashed one left)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localDown(cmd.OutOrStdout(), *dir)
		},
	}
}

func localDown(out io.Writer, dir string) error {
	pid, running := upProcess(dir)
	if !running {
		fmt.Fprintln(out, "local down: no local up runs; cleaning up what is left in", dir)
		return cluster.Cleanup(dir)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop local up (pid %d): %w", pid, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if _, running := upProcess(dir); !running {
			fmt.Fprintln(out, "local down: stopped")
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("local up (pid %d) still runs after 3 minutes; see %s", pid, filepath.Join(dir, "logs"))
}

func newLocalStatus(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the local cluster's components, their state and restarts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return localStatus(cmd.OutOrStdout(), *dir)
		},
	}
}

func localStatus(out io.Writer, dir string) error {
	states, err := supervise.ReadStates(dir)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Fprintln(out, "no local cluster in", dir)
		return nil
	}
	if err != nil {
		return err
	}
	if pid, running := upProcess(dir); running {
		fmt.Fprintf(out, "local up runs (pid %d); kubeconfig %s\n\n", pid, filepath.Join(dir, "kubeconfig"))
	} else {
		fmt.Fprintln(out, "local up does not run")
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "COMPONENT\tSTATE\tPID\tRESTARTS\tSINCE\tLAST EXIT")
	for _, st := range states {
		pid := "-"
		if st.PID != 0 {
			pid = strconv.Itoa(st.PID)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", st.Name, st.State, pid, st.Restarts, st.Since.Format(time.TimeOnly), st.LastExit)
	}
	return w.Flush()
}

func pidFile(dir string) string { return filepath.Join(dir, "up.pid") }

// upProcess is the PID of the running `local up` of dir, if any.
func upProcess(dir string) (int, bool) {
	data, err := os.ReadFile(pidFile(dir))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, false
	}
	self, _ := os.Executable()
	return pid, supervise.Alive(pid, self)
}

// findRepo is the qvirt source tree holding dir (or the working directory).
func findRepo(dir string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = os.Getwd(); err != nil {
			return "", err
		}
	}
	for d := dir; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(data), "module github.com/qvirt/qvirt\n") {
			return d, nil
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("--repo: %s is not inside the qvirt source tree (its config/ and test guest are needed)", dir)
		}
	}
}

// buildTools runs hack/build-tools.sh, which prints the directory of the binaries.
func buildTools(repo string) (string, error) {
	cmd := exec.Command(filepath.Join(repo, "hack", "build-tools.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build the control-plane binaries (hack/build-tools.sh): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
