// Package envtest starts one real control plane (etcd and kube-apiserver built from upstream by
// `make tools`) per test package, with qvirt's CRDs installed, and tears it down when the package's
// tests end. Use it from TestMain:
//
//	var cp *envtest.ControlPlane
//
//	func TestMain(m *testing.M) { envtest.Main(m, &cp) }
//
// The binaries come from KUBEBUILDER_ASSETS when set (make test sets it), otherwise from
// hack/build-tools.sh, which builds them once into the cache and prints where.
package envtest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/local/pki"
)

// ControlPlane is a running etcd + kube-apiserver with the qvirt CRDs installed.
type ControlPlane struct {
	Env    *crenvtest.Environment
	Config *rest.Config
	Client client.Client
	Scheme *k8sruntime.Scheme
	// Kubeconfig is a kubeconfig file for the control plane's admin user, for kubectl.
	Kubeconfig string
	// Kubectl is the path of the kubectl built with the control plane.
	Kubectl string

	// pkiDir holds the front-proxy certificates of Options.Aggregation.
	pkiDir string
	// stopHooks run before the control plane stops (OnStop).
	stopHooks []func()
}

// OnStop registers f to run, last registered first, when Stop begins: for servers a test package
// starts once and that hold connections to kube-apiserver (an aggregated API server's watches
// delay kube-apiserver's shutdown past envtest's stop timeout).
func (cp *ControlPlane) OnStop(f func()) { cp.stopHooks = append(cp.stopHooks, f) }

// RepoRoot is the root of the qvirt repository, found from this source file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Assets returns the directory holding etcd, kube-apiserver and kubectl, building them if needed.
func Assets() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	cmd := exec.Command(filepath.Join(RepoRoot(), "hack", "build-tools.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build control-plane binaries with hack/build-tools.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Options adjust the control plane.
type Options struct {
	// Webhooks installs config/webhook's webhook configurations, pointed at a local serving
	// address and certificate that Env.WebhookInstallOptions holds for the test's webhook server.
	Webhooks bool
	// Aggregation turns on kube-apiserver's aggregation layer as local mode does: a front-proxy CA
	// and client certificate (CN front-proxy-client) made for this control plane, the
	// --requestheader-* and --proxy-client-* flags, and --enable-aggregator-routing=true (the
	// aggregator dials the EndpointSlice addresses of an APIService's Service, which must not be
	// loopback). kube-apiserver publishes the request-header settings in ConfigMap
	// kube-system/extension-apiserver-authentication for aggregated servers.
	Aggregation bool
}

// Start starts a control plane with the CRDs from config/crd/bases installed.
func Start() (*ControlPlane, error) { return StartWith(Options{}) }

// FeatureGates are the kube-apiserver feature gates local mode turns on: ImageVolumeWithDigest
// (alpha) keeps containerStatuses[].volumeMounts[].volumeStatus.image.imageRef, where a node
// reports the digest of an image volume's image (a launcher pod's containerDisk and kernelBoot).
const FeatureGates = "ImageVolumeWithDigest=true"

// StartWith starts a control plane with the CRDs installed and what opts asks for.
func StartWith(opts Options) (*ControlPlane, error) {
	assets, err := Assets()
	if err != nil {
		return nil, err
	}
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register client-go scheme: %w", err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register apiextensions.k8s.io/v1: %w", err)
	}
	if err := qv1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register qvirt.io/v1alpha1: %w", err)
	}
	env := &crenvtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(RepoRoot(), "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	if opts.Webhooks {
		env.WebhookInstallOptions.Paths = []string{filepath.Join(RepoRoot(), "config", "webhook")}
	}
	// As local mode's kube-apiserver (local/cluster/controlplane.go): pod status keeps the digest
	// of an image volume's image.
	env.ControlPlane.GetAPIServer().Configure().Set("feature-gates", FeatureGates)
	var pkiDir string
	if opts.Aggregation {
		if pkiDir, err = aggregationFlags(env); err != nil {
			return nil, err
		}
	}
	cfg, err := env.Start()
	if err != nil {
		_ = os.RemoveAll(pkiDir)
		return nil, fmt.Errorf("start envtest control plane from %s: %w", assets, err)
	}
	cp := &ControlPlane{Env: env, Config: cfg, Scheme: scheme, Kubectl: filepath.Join(assets, "kubectl"), pkiDir: pkiDir}
	if err := cp.init(); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return cp, nil
}

func (cp *ControlPlane) init() error {
	c, err := client.New(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		return fmt.Errorf("client for envtest: %w", err)
	}
	cp.Client = c
	user, err := cp.Env.ControlPlane.AddUser(crenvtest.User{Name: "qvirt-test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("add envtest admin user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig for envtest admin: %w", err)
	}
	dir, err := os.MkdirTemp("", "qvirt-envtest-")
	if err != nil {
		return fmt.Errorf("kubeconfig dir: %w", err)
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	return os.WriteFile(cp.Kubeconfig, kubeconfig, 0o600)
}

// aggregationFlags makes the front-proxy certificates in a new directory and sets the aggregation
// layer's kube-apiserver flags (the ones local mode uses, local/cluster/controlplane.go).
func aggregationFlags(env *crenvtest.Environment) (string, error) {
	dir, err := os.MkdirTemp("", "qvirt-envtest-pki-")
	if err != nil {
		return "", fmt.Errorf("front-proxy pki dir: %w", err)
	}
	ca, err := pki.LoadOrCreateCA(dir, "front-proxy-ca")
	if err == nil {
		err = ca.Issue(dir, "front-proxy-client", pki.Leaf{CommonName: "front-proxy-client", Client: true})
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("front-proxy certificates: %w", err)
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	for flag, value := range map[string]string{
		"enable-aggregator-routing":          "true",
		"requestheader-client-ca-file":       filepath.Join(dir, "front-proxy-ca.crt"),
		"requestheader-allowed-names":        "front-proxy-client",
		"requestheader-username-headers":     "X-Remote-User",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"proxy-client-cert-file":             filepath.Join(dir, "front-proxy-client.crt"),
		"proxy-client-key-file":              filepath.Join(dir, "front-proxy-client.key"),
	} {
		args.Set(flag, value)
	}
	return dir, nil
}

// Stop stops the control plane and removes what Start created.
func (cp *ControlPlane) Stop() error {
	for i := len(cp.stopHooks) - 1; i >= 0; i-- {
		cp.stopHooks[i]()
	}
	if cp.Kubeconfig != "" {
		_ = os.RemoveAll(filepath.Dir(cp.Kubeconfig))
	}
	err := cp.Env.Stop()
	if cp.pkiDir != "" {
		_ = os.RemoveAll(cp.pkiDir)
	}
	return err
}

// KubectlCmd runs kubectl against the control plane with stdin, returning stdout and stderr.
func (cp *ControlPlane) KubectlCmd(ctx context.Context, stdin []byte, args ...string) (string, string, error) {
	cmd := exec.CommandContext(ctx, cp.Kubectl, append([]string{"--kubeconfig", cp.Kubeconfig}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// ManagerOptions are the base options of a controller-runtime manager in a test: this control
// plane's scheme, no metrics or probe listeners, and no controller-name uniqueness check (tests
// start several managers in one process). Tests add what they need on top.
func (cp *ControlPlane) ManagerOptions() ctrl.Options {
	skip := true
	return ctrl.Options{
		Scheme:                 cp.Scheme,
		Metrics:                server.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             crconfig.Controller{SkipNameValidation: &skip},
	}
}

// StartWebhookManager runs, until t ends, a manager whose webhook server listens where the webhook
// configurations point (Options.Webhooks), with what setup registers on it, as qvirt-controller
// runs its webhooks.
func (cp *ControlPlane) StartWebhookManager(t testing.TB, setup func(ctrl.Manager) error) {
	t.Helper()
	wo := cp.Env.WebhookInstallOptions
	opts := cp.ManagerOptions()
	opts.WebhookServer = webhook.NewServer(webhook.Options{Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir})
	mgr, err := ctrl.NewManager(cp.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := setup(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// Codecs decodes manifests into the control plane's scheme.
func (cp *ControlPlane) Codecs() serializer.CodecFactory {
	return serializer.NewCodecFactory(cp.Scheme)
}

// Main starts a control plane, stores it in *cp, runs the package's tests and stops it. It exits the
// process with the tests' status, so call it as the whole of TestMain.
func Main(m *testing.M, cp **ControlPlane) { MainWith(m, cp, Options{}) }

// MainWith is Main with options.
func MainWith(m *testing.M, cp **ControlPlane, opts Options) {
	flag.Parse()
	if fuzzing() {
		// Fuzz targets never use the control plane, and every fuzz worker process runs TestMain.
		os.Exit(m.Run())
	}
	started, err := StartWith(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "envtest: %v\n", err)
		os.Exit(1)
	}
	*cp = started
	// A test binary stopped by a signal (go test's timeout, Ctrl-C) must not leave etcd and
	// kube-apiserver behind.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		_ = started.Stop()
		os.Exit(1)
	}()
	fmt.Fprintf(os.Stderr, "envtest: kube-apiserver at %s (binaries in %s)\n", started.Config.Host, started.Env.BinaryAssetsDirectory)
	code := m.Run()
	if err := started.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "envtest: stop: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// fuzzing reports whether this test binary runs a fuzz target (as coordinator or worker).
func fuzzing() bool {
	f, w := flag.Lookup("test.fuzz"), flag.Lookup("test.fuzzworker")
	return (f != nil && f.Value.String() != "") || (w != nil && w.Value.String() == "true")
}
