package apiserver_test

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	authnv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	crenvtest "sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/qvirt/qvirt/apiserver"
	"github.com/qvirt/qvirt/test/envtest"
	"github.com/qvirt/qvirt/test/testutil"
)

// These tests run qvirt-api in-process behind a real kube-apiserver with the aggregation layer
// (envtest, front-proxy flags, --enable-aggregator-routing), registered through the real
// APIService manifest, with its own identity a ServiceAccount bound to config/api's RBAC. Users
// are envtest client-certificate users bound to config/rbac's qvirt.io:view|edit|admin. Streams
// go to a real handler stream server (handler/streams) in front of a real launcher booting the
// test guest under TCG.

var (
	cp       *envtest.ControlPlane
	guestDir string
)

const (
	installNS = "qvirt-system"
	testNS    = "default"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if !fuzzing() {
		var err error
		if guestDir, err = testutil.GuestDir(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	envtest.MainWith(m, &cp, envtest.Options{Aggregation: true})
}

func fuzzing() bool {
	f, w := flag.Lookup("test.fuzz"), flag.Lookup("test.fuzzworker")
	return (f != nil && f.Value.String() != "") || (w != nil && w.Value.String() == "true")
}

// env is what every test shares: qvirt-api registered and Available, the PKI of the handler link
// and the three users.
type env struct {
	pki  *testPKI
	logs *testutil.SyncBuffer
	// handlerLogs are the handler stream servers' logs.
	handlerLogs *testutil.SyncBuffer
	users       map[string]*rest.Config // view, edit, admin
}

var (
	sharedOnce sync.Once
	shared     *env
	sharedErr  error
)

// setup starts qvirt-api once for the package.
func setup(t *testing.T) *env {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = start() })
	if sharedErr != nil {
		t.Fatalf("qvirt-api test environment: %v", sharedErr)
	}
	return shared
}

func start() (*env, error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "qvirt-api-test-")
	if err != nil {
		return nil, err
	}
	p, err := newTestPKI(dir)
	if err != nil {
		return nil, err
	}
	if err := applyFiles(ctx, "../config/rbac/user_roles.yaml"); err != nil {
		return nil, err
	}
	kubeconfig, err := serviceAccountKubeconfig(ctx, dir)
	if err != nil {
		return nil, err
	}
	ip, err := hostIP()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", ip, err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	logs := &testutil.SyncBuffer{}
	opts := apiserver.NewOptions()
	opts.SecureServing.Listener = ln
	opts.SecureServing.BindAddress = ip
	opts.SecureServing.BindPort = port
	opts.SecureServing.ServerCert.CertKey.CertFile = filepath.Join(dir, "serving.crt")
	opts.SecureServing.ServerCert.CertKey.KeyFile = filepath.Join(dir, "serving.key")
	opts.Authentication.RemoteKubeConfigFile = kubeconfig
	opts.Authorization.RemoteKubeConfigFile = kubeconfig
	// Short caches, so that RBAC changes made by the tests apply at once.
	opts.Authorization.AllowCacheTTL, opts.Authorization.DenyCacheTTL = time.Millisecond, time.Millisecond
	opts.Kubeconfig = kubeconfig
	// Pings every second, so the stream tests exercise the keep-alive on both sides.
	opts.PingInterval = time.Second
	opts.HandlerClientCertFile, opts.HandlerClientKeyFile, opts.HandlerCAFile = p.file("api.crt"), p.file("api.key"), p.file("ca.crt")
	opts.Log = funcr.New(func(prefix, args string) { fmt.Fprintf(logs, "%s %s\n", prefix, args) }, funcr.Options{})
	api, err := apiserver.New(opts)
	if err != nil {
		return nil, fmt.Errorf("apiserver.New: %w", err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		if err := api.Run(runCtx); err != nil {
			fmt.Fprintf(os.Stderr, "qvirt-api stopped: %v\n", err)
		}
	}()
	cp.OnStop(func() {
		stop()
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			fmt.Fprintln(os.Stderr, "qvirt-api did not stop within 30s")
		}
	})
	if err := register(ctx, ip, port, p.servingCA); err != nil {
		return nil, err
	}
	e := &env{pki: p, logs: logs, handlerLogs: &testutil.SyncBuffer{}, users: map[string]*rest.Config{}}
	for _, role := range []string{"view", "edit", "admin"} {
		if e.users[role], err = addUser(ctx, role); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// hostIP is a non-loopback address of this host: kube-apiserver refuses loopback endpoints.
// Interfaces named qvirt-* belong to a local cluster that may come and go.
func hostIP() (net.IP, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || len(i.Name) >= 5 && i.Name[:5] == "qvirt" {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP, nil
			}
		}
	}
	return nil, errors.New("no non-loopback IPv4 address on this host for qvirt-api's endpoint")
}

// applyFiles applies manifests with kubectl as the envtest admin.
func applyFiles(ctx context.Context, files ...string) error {
	for _, f := range files {
		out, errOut, err := cp.KubectlCmd(ctx, nil, "apply", "-f", f)
		if err != nil {
			return fmt.Errorf("kubectl apply -f %s: %v: %s%s", f, err, out, errOut)
		}
	}
	return nil
}

// serviceAccountKubeconfig creates ServiceAccount qvirt-system/qvirt-api with config/api's RBAC
// and writes a kubeconfig holding a token for it.
func serviceAccountKubeconfig(ctx context.Context, dir string) (string, error) {
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return "", err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNS}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "qvirt-api", Namespace: installNS}}
	if _, err := cs.CoreV1().ServiceAccounts(installNS).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	if err := applyFiles(ctx, "../config/api/role.yaml", "../config/api/role_binding.yaml"); err != nil {
		return "", err
	}
	tr, err := cs.CoreV1().ServiceAccounts(installNS).CreateToken(ctx, "qvirt-api",
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for ServiceAccount qvirt-api: %w", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	kc.AuthInfos["qvirt-api"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["qvirt-api"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "qvirt-api"}
	kc.CurrentContext = "qvirt-api"
	path := filepath.Join(dir, "qvirt-api.kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}

// register creates the Service, its EndpointSlice (the test server's address) and the APIService
// of config/api with the serving CA, and waits for the APIService to be Available.
func register(ctx context.Context, ip net.IP, port int, caPEM []byte) error {
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "qvirt-api", Namespace: installNS},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}
	if _, err := cs.CoreV1().Services(installNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Service: %w", err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "qvirt-api-test", Namespace: installNS, Labels: map[string]string{discoveryv1.LabelServiceName: "qvirt-api"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(installNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create EndpointSlice: %w", err)
	}
	if err := applyFiles(ctx, "../config/api/apiservice.yaml"); err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	dyn, err := dynamicFor(cp.Config)
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"spec":{"caBundle":%q}}`, b64(caPEM))
	if _, err := dyn.Resource(gvr).Patch(ctx, "v1alpha1.subresources.qvirt.io", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("set the APIService's caBundle: %w", err)
	}
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		u, err := dyn.Resource(gvr).Get(ctx, "v1alpha1.subresources.qvirt.io", metav1.GetOptions{})
		if err == nil {
			if ok, msg := available(u); ok {
				return nil
			} else {
				last = msg
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("APIService v1alpha1.subresources.qvirt.io not Available after 90s: %s", last)
}

func available(u *unstructured.Unstructured) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Available" {
			return m["status"] == "True", fmt.Sprintf("%v: %v", m["reason"], m["message"])
		}
	}
	return false, "no Available condition"
}

// addUser makes an envtest client-certificate user NAME-user bound in the test namespace to
// qvirt.io:NAME.
func addUser(ctx context.Context, role string) (*rest.Config, error) {
	name := role + "-user"
	u, err := cp.Env.ControlPlane.AddUser(crenvtest.User{Name: name, Groups: []string{role + "-group"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("add user %s: %w", name, err)
	}
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, err
	}
	rb := rbacBinding(name, "qvirt.io:"+role)
	if _, err := cs.RbacV1().RoleBindings(testNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("bind %s: %w", name, err)
	}
	if err := waitBound(ctx, u.Config()); err != nil {
		return nil, fmt.Errorf("bind %s: %w", name, err)
	}
	return u.Config(), nil
}

// waitBound waits until kube-apiserver's authorizer, which learns of RoleBindings through a watch,
// lets the user read VMIs (every qvirt.io role may).
func waitBound(ctx context.Context, cfg *rest.Config) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: testNS, Verb: "get", Group: "qvirt.io", Resource: "virtualmachineinstances"}}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err == nil && got.Status.Allowed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the role binding was not in effect after 30 s (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tlsConfigFor is the TLS client configuration of a user's rest config.
func tlsConfigFor(cfg *rest.Config) *tls.Config {
	c, err := rest.TLSConfigFor(cfg)
	if err != nil {
		panic(err) // envtest users always have a valid configuration
	}
	return c
}
