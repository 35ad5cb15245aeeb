// Package e2ecluster is the local cluster an end-to-end test package shares: brought up once by
// its TestMain as `qvirtctl local up --emulation --nodes 2` would, with qvirt's binaries built
// from the working tree, and taken down (its directory removed) at the end, even after a failure.
// It also holds what every such package does with it: a namespace per test, the components' logs
// for a failed test, and commands (kubectl, qvirtctl) run against it.
package e2ecluster

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

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/qvirt/qvirt/api/scheme"
	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/cluster"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// Cluster is the shared cluster and the client and tools to drive it.
type Cluster struct {
	*cluster.Cluster
	Client  client.Client
	Dir     string // the cluster's state directory
	Bin     string // qvirt's binaries, qvirtctl among them
	Kubectl string
}

// Options say how a package wants its cluster.
type Options struct {
	// Name names the package in messages, temporary directories and the node log file.
	Name string
	// GuestDir holds the small busybox test guest the demo images are made of.
	GuestDir string
	// Ready runs once the cluster is up (pushing more images, say); its error fails the start.
	Ready func(ctx context.Context, c *cluster.Cluster) error
	// InsecureRegistries are registries besides the local one the nodes pull from over plain
	// HTTP (cluster.Options.InsecureRegistries): a test's own private registry.
	InsecureRegistries []string
}

// Start builds the binaries and brings a two-node cluster up; the returned cleanup takes it down
// and removes its directory (unless QVIRT_E2E_KEEP is set), even after a failure.
func Start(o Options) (*Cluster, func(), error) {
	var undo []func()
	cleanup := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	c := &Cluster{}
	tools, err := envtest.Assets()
	if err != nil {
		return nil, cleanup, err
	}
	c.Kubectl = filepath.Join(tools, "kubectl")
	if c.Bin, err = os.MkdirTemp("", "qv"+o.Name+"-bin-"); err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, func() { os.RemoveAll(c.Bin) })
	repo := envtest.RepoRoot()
	if err := testutil.BuildCommands(repo, c.Bin); err != nil {
		return nil, cleanup, err
	}
	// Short: socket paths live under it.
	if c.Dir, err = os.MkdirTemp("", "qv-"); err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, func() {
		if os.Getenv("QVIRT_E2E_KEEP") == "" {
			os.RemoveAll(c.Dir)
		}
	})
	cache, err := os.UserCacheDir()
	if err != nil {
		return nil, cleanup, err
	}
	logFile, err := os.Create(filepath.Join(os.TempDir(), "qvirt-"+o.Name+"-nodes.log"))
	if err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, func() { logFile.Close() })
	nodeLog := funcr.NewJSON(func(obj string) { fmt.Fprintln(logFile, obj) }, funcr.Options{})
	ctrllog.SetLogger(nodeLog)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	started := time.Now()
	c.Cluster, err = cluster.Up(ctx, cluster.Options{Dir: c.Dir, Nodes: 2, Emulation: true, Repo: repo, Tools: tools,
		Bin: c.Bin, CNICache: filepath.Join(cache, "qvirt", "cni"), GuestDir: o.GuestDir, Progress: os.Stderr, Profiling: true,
		Log: nodeLog, InsecureRegistries: o.InsecureRegistries})
	if err != nil {
		return nil, cleanup, err
	}
	undo = append(undo, c.Down)
	if o.Ready != nil {
		if err := o.Ready(ctx, c.Cluster); err != nil {
			return nil, cleanup, err
		}
	}
	fmt.Fprintf(os.Stderr, "%s: two-node local cluster up in %.1fs (state in %s)\n", o.Name, time.Since(started).Seconds(), c.Dir)
	if c.Client, err = scheme.NewClient(c.Kubeconfig); err != nil {
		return nil, cleanup, err
	}
	return c, cleanup, nil
}

// Namespace makes a namespace named from prefix for one test and deletes it (and whatever is left
// in it) at the end, logging the components' logs first if the test failed.
func (c *Cluster) Namespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := c.Client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.DumpLogs(t)
		}
		_ = c.Client.Delete(context.Background(), ns)
	})
	return ns.Name
}

// DumpLogs logs the tail of qvirt's components' logs, for a failed test.
func (c *Cluster) DumpLogs(t testing.TB) {
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "logs", "*.log"))
	nodeLogs, _ := filepath.Glob(filepath.Join(c.Dir, "nodes", "*", "logs", "*"))
	for _, f := range append(logs, nodeLogs...) {
		if strings.Contains(f, "etcd") || strings.Contains(f, "kube-") {
			continue
		}
		data, _ := os.ReadFile(f)
		t.Logf("%s:\n%s", f, testutil.Tail(string(data), 2500))
	}
}

// RunErr runs a command against the cluster (KUBECONFIG set) and returns its stdout, or an error
// with its stdout and stderr.
func (c *Cluster) RunErr(stdin []byte, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s%s", filepath.Base(name), strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

// Run is RunErr failing the test on an error.
func (c *Cluster) Run(t testing.TB, stdin []byte, name string, args ...string) string {
	t.Helper()
	out, err := c.RunErr(stdin, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// LauncherPods lists vmi's launcher pods (by its UID label): the active one, and during or after a
// migration the other side's.
func (c *Cluster) LauncherPods(t testing.TB, vmi *v1alpha1.VirtualMachineInstance) []corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := c.Client.List(context.Background(), &pods, client.InNamespace(vmi.Namespace),
		client.MatchingLabels{v1alpha1.VMIUIDLabel: string(vmi.UID)}); err != nil {
		t.Fatalf("list the launcher pods of %s: %v", vmi.Name, err)
	}
	return pods.Items
}
